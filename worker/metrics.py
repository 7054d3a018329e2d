"""Prometheus metrics of the worker on an injected registry, the product's metric prefixes and
what every process exports beside its own. Labels are small fixed sets, never an account id;
the names are a contract with ``deploy/`` (``deploy/metrics.txt``, checked by a test)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from worker import __version__
from worker.catalogue import ServiceError
from worker.faults import FAULT_REASONS
from worker.messages import COMMAND_TYPES, DECODE_REASONS
from worker.provider.breaker import BREAKER_STATES, CircuitBreaker

# Every (code, http_status, numeric_code) the worker itself can produce (docs/architecture.md,
# "The confirm decision table", plus invalid_request for undecodable input).
WORKER_ERRORS: tuple[tuple[str, int, int], ...] = tuple(
    (e.code, e.http_status, e.numeric_code)
    for e in (
        ServiceError.of("invalid_request"),
        ServiceError.of("not_found"),
        ServiceError.of("account_already_authorized"),
        ServiceError.of("provider_not_ready"),
        ServiceError.of("account_binding_not_found"),
        ServiceError.of("provider_account_mismatch"),
        ServiceError.of("provider_invalid_request"),
        ServiceError.of("provider_adapter_not_found"),
        ServiceError.of("provider_unavailable"),
        ServiceError.of("provider_unavailable").refine(30010),
        ServiceError.of("unsupported_by_provider"),
        ServiceError.of("run_auth_action_failed"),
    )
)

# ``dlq.reason`` of the record-fault dead letters of the worker and the dispatcher: the decode
# reasons, a handler that kept failing, an output over its size bound, bytes no decoder reads.
# Their series are created at zero so the DLQ alerts see the first one.
DLQ_REASONS: tuple[str, ...] = (*DECODE_REASONS, *FAULT_REASONS)


#: Every family the product defines starts with ``passkey_`` (so it cannot collide with another
#: service's in a shared Prometheus), then the process' own word: the worker's ``auth_``, the
#: front-end's ``api_``, the dispatcher's ``webhook_`` (docs/operations.md, "Prometheus").
#: prometheus_client's standard ``process_*``/``python_*`` families keep their own names.
METRIC_PREFIX: Final = "passkey_"
WORKER_PREFIX: Final = f"{METRIC_PREFIX}auth_"
API_PREFIX: Final = f"{METRIC_PREFIX}api_"
WEBHOOK_PREFIX: Final = f"{METRIC_PREFIX}webhook_"


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


class BreakerStates(Collector):
    """``passkey_auth_provider_breaker_state{provider,state}``: per provider, 1 for its circuit
    breaker's current state (closed, open, half_open) and 0 for the others, read at scrape
    time. One series per state rather than a numeric code, so ``state="open"`` selects and
    ``sum by (provider, state)`` counts the workers in each state."""

    def __init__(self, breakers: Callable[[], Iterable[tuple[str, CircuitBreaker]]]) -> None:
        self._breakers = breakers

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "passkey_auth_provider_breaker_state",
            "Provider circuit breaker state: 1 for the current one, 0 for the others",
            labels=["provider", "state"],
        )
        for provider, breaker in self._breakers():
            current = breaker.state
            for state in BREAKER_STATES:
                family.add_metric([provider, state], 1.0 if state == current else 0.0)
        yield family


class TailSkips(Collector):
    """``{prefix}tail_records_skipped_total{tail}``: records a read model (a ``TopicTail``)
    could not apply and skipped, read from the tails at scrape time."""

    def __init__(self, prefix: str, tails: Callable[[], Iterable[Any]]) -> None:
        self._name = f"{prefix}tail_records_skipped"
        self._tails = tails

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            self._name, "Records a read model could not apply, skipped", labels=["tail"]
        )
        for tail in self._tails():
            family.add_metric([tail.name], tail.skipped)
        yield family


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LoopSeries:
    """The consume loop's own series (``worker.consumer.LoopMetrics``), named per process:
    ``{prefix}consumer_lag``, ``{prefix}{role}_ready`` ... The worker's are
    ``passkey_auth_*``, the webhook dispatcher's ``passkey_webhook_*``; the meanings are the
    same."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        prefix: str,
        role: str,
        in_flight: tuple[str, str],
        records: str,
    ) -> None:
        self.registry = registry
        self.in_flight = Gauge(f"{prefix}{in_flight[0]}", in_flight[1], registry=registry)
        self.lag = Gauge(
            f"{prefix}consumer_lag",
            "High-water mark minus committed offset",
            ["topic", "partition"],
            registry=registry,
        )
        self.store_accounts = Gauge(
            f"{prefix}state_store_accounts", f"{records} held in memory", registry=registry
        )
        self.restore_seconds = Histogram(
            f"{prefix}state_restore_duration_seconds",
            "Time to restore one partition's state",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=registry,
        )
        self.restore_records = Counter(
            f"{prefix}state_restore_records",
            f"{records} read while restoring",
            registry=registry,
        )
        self.rebalances = Counter(
            f"{prefix}rebalances", "Partition assignment changes", ["kind"], registry=registry
        )
        self.restore_undecodable = Counter(
            f"{prefix}state_restore_undecodable",
            f"{records} skipped while restoring because they could not be decoded",
            registry=registry,
        )
        self.unit_failures = Counter(
            f"{prefix}unit_failures",
            "Units of work (a record, or a due key's follow-up) that raised: retried, then "
            "dead-lettered (records) or given up (follow-ups)",
            ["stage", "outcome"],
            registry=registry,
        )
        self.ready = Gauge(f"{prefix}{role}_ready", "1 once joined and restored", registry=registry)
        self.heartbeat = Gauge(
            f"{prefix}{role}_heartbeat_timestamp_seconds",
            "Last consume-loop iteration (epoch s)",
            registry=registry,
        )
        for kind in ("assigned", "revoked"):
            self.rebalances.labels(kind)
        for stage, outcome in (
            ("record", "retried"),
            ("record", "dead_lettered"),
            ("follow_up", "retried"),
            ("follow_up", "given_up"),
        ):
            self.unit_failures.labels(stage, outcome)

    def beat(self) -> None:
        self.heartbeat.set(time.time())


class WorkerMetrics(LoopSeries):
    """Every metric the worker exports. Tests build one on a fresh registry each."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(
            registry,
            prefix=WORKER_PREFIX,
            role="worker",
            in_flight=("inflight_commands", "Commands dispatched and not yet settled"),
            records="Account records",
        )
        self.commands = Counter(
            "passkey_auth_commands",
            "Commands applied, by type and outcome",
            ["type", "outcome"],
            registry=registry,
        )
        self.errors = Counter(
            "passkey_auth_errors",
            "Catalogued errors produced, by code",
            ["code", "numeric_code", "http_status"],
            registry=registry,
        )
        self.command_seconds = Histogram(
            "passkey_auth_command_duration_seconds",
            "Record fetched to all outputs acknowledged",
            ["type"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.provider_seconds = Histogram(
            "passkey_auth_provider_request_duration_seconds",
            "Provider calls incl. retries",
            ["provider", "operation", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.provider_retries = Counter(
            "passkey_auth_provider_retries",
            "Provider call retries after transient failures",
            ["provider", "operation"],
            registry=registry,
        )
        self.dlq = Counter(
            "passkey_auth_dlq_records",
            "Records sent to the DLQ, by dlq.reason: undecodable, or their handling failed "
            "for good",
            ["reason"],
            registry=registry,
        )
        self.forwarded = Counter(
            "passkey_auth_commands_forwarded",
            "Commands that arrived off their key's home partition and were forwarded there",
            ["type"],
            registry=registry,
        )
        self.status_changes = Counter(
            "passkey_auth_status_changes",
            "Status-change events published, by new status",
            ["status"],
            registry=registry,
        )
        self.follow_up_expired = Counter(
            "passkey_auth_follow_up_expired",
            "Flows failed by the follow-up deadline",
            registry=registry,
        )

        self._precreate()

    def _precreate(self) -> None:
        """Create the series the alerts watch at zero: ``increase()`` cannot count the first
        sample of a series, so a DLQ record or an error right after start would go unseen."""
        for reason in DLQ_REASONS:
            self.dlq.labels(reason)
        for command_type in COMMAND_TYPES:
            self.forwarded.labels(command_type)
        for code, http_status, numeric_code in WORKER_ERRORS:
            self.errors.labels(code, str(numeric_code), str(http_status))

    def export_breakers(self, breakers: Callable[[], Iterable[tuple[str, CircuitBreaker]]]) -> None:
        """Export the state of the providers' circuit breakers (``BreakerStates``)."""
        self.registry.register(BreakerStates(breakers))

    def provider_call(self, provider: str, operation: str, outcome: str, seconds: float) -> None:
        """Observer hook handed to provider adapters (they never see the registry)."""
        self.provider_seconds.labels(provider, operation, outcome).observe(seconds)

    def provider_retry(self, provider: str, operation: str) -> None:
        self.provider_retries.labels(provider, operation).inc()
