"""The product's metric prefixes, and what every process exports beside its own families
(``export_process_metrics``). The names are a contract with ``deploy/`` (``deploy/metrics.txt``)."""

from __future__ import annotations

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


class Families:
    """A process's own families on its registry, each defined in one call. ``seed``: the label
    values (a tuple each with several labels) created at zero, since ``increase()`` cannot
    count a series' first sample and an alert would miss the first event after a start."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(
        self, name: str, doc: str, labels: Sequence[str] = (), *, seed: Iterable[object] = ()
    ) -> Counter:
        family = Counter(name, doc, labels, registry=self.registry)
        for values in seed:
            family.labels(*(values if isinstance(values, tuple) else (values,)))
        return family

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def histogram(
        self, name: str, doc: str, labels: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)


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
