"""The product's metric prefixes, and what every process exports beside its own families
(``export_process_metrics``). The names are a contract with ``deploy/`` (``deploy/metrics.txt``)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    values,
)

from worker import __version__

#: Every family the product defines starts with ``passkey_`` (so it cannot collide with another
#: service's in a shared Prometheus), then the process' own word: the worker's ``auth_``, the
#: front-end's ``api_``, the dispatcher's ``webhook_`` (docs/operations.md, "Prometheus").
#: prometheus_client's standard ``process_*``/``python_*`` families keep their own names.
METRIC_PREFIX: Final = "passkey_"
WORKER_PREFIX: Final = f"{METRIC_PREFIX}auth_"
API_PREFIX: Final = f"{METRIC_PREFIX}api_"
WEBHOOK_PREFIX: Final = f"{METRIC_PREFIX}webhook_"


class LoopValue:
    """One series' value, written without a lock. prometheus_client's ``MutexValue`` takes a
    lock on every write, for processes that write a series from several threads; the product's
    processes write every family on their event loop's thread only (their scrape is served by
    the loop too, and the webhook lookups' threads write none), and a float is read whole
    under the GIL. So the lock bought nothing but its cost on every command, request and
    delivery (bench/README.md, "Session 27"). ``MutexValue``'s interface, as the families
    call it."""

    __slots__ = ("_exemplar", "_value")
    _multiprocess = False

    def __init__(self, value: float = 0.0) -> None:
        self._value = value
        self._exemplar: object = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: object) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> object:
        return self._exemplar


def _unlocked(value: object) -> object:
    """``value`` as a ``LoopValue`` when it is the lock's kind; any other (the multi-process
    mode's, under ``PROMETHEUS_MULTIPROC_DIR``) is kept as it is."""
    if type(value) is values.MutexValue:
        return LoopValue(value.get())  # type: ignore[no-untyped-call]
    return value


class _Counter(Counter):
    def _metric_init(self) -> None:
        super()._metric_init()
        self._value = _unlocked(self._value)


class _Gauge(Gauge):
    def _metric_init(self) -> None:
        super()._metric_init()
        self._value = _unlocked(self._value)


class _Histogram(Histogram):
    def _metric_init(self) -> None:
        super()._metric_init()
        self._sum = _unlocked(self._sum)
        self._buckets = [_unlocked(bucket) for bucket in self._buckets]

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """The library's ``observe``, its bucket found by bisection instead of a walk over the
        bounds (a delivery's latency walks most of the 17): the first bound ``amount`` is at
        or under; a NaN is summed and lands in no bucket, as there."""
        if exemplar:
            super().observe(amount, exemplar)
            return
        self._raise_if_not_observable()  # type: ignore[no-untyped-call]
        self._sum.inc(amount)
        if amount == amount:  # not NaN: the last bound is +Inf, so one is found
            self._buckets[bisect_left(self._upper_bounds, amount)].inc(1)


class Families:
    """A process's own families on its registry, each defined in one call, each series a
    ``LoopValue`` (written on the event loop's thread only). ``seed``: the label values (a
    tuple each with several labels) created at zero, since ``increase()`` cannot count a
    series' first sample and an alert would miss the first event after a start."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(
        self, name: str, doc: str, labels: Sequence[str] = (), *, seed: Iterable[object] = ()
    ) -> Counter:
        family = _Counter(name, doc, labels, registry=self.registry)
        for label_values in seed:
            family.labels(*(label_values if isinstance(label_values, tuple) else (label_values,)))
        return family

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return _Gauge(name, doc, labels, registry=self.registry)

    def histogram(
        self, name: str, doc: str, labels: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        return _Histogram(name, doc, labels, buckets=buckets, registry=self.registry)


def export_process_metrics(registry: CollectorRegistry, service: str) -> None:
    """The families an SRE expects of any process, on its own ``registry``: prometheus_client's
    standard ``process_*`` (resident memory, CPU, file descriptors, start time), ``python_gc_*``
    (collections and objects per generation: what ``WORKER_GC_THRESHOLD`` tunes) and
    ``python_info``; and ``passkey_build_info{service,version}``, 1, so a query can join any
    series to the build that produced it. Called once per registry by each composition root."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    Gauge(
        "passkey_build_info",
        "1, labelled with the service and the version of the running build",
        ["service", "version"],
        registry=registry,
    ).labels(service, __version__).set(1)
