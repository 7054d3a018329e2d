"""Every metric the worker process exports (``WorkerMetrics``), built on an injected registry.

Labels are small fixed sets (command type, outcome, catalogue code, partition); never an
account id. A test scrapes a live worker and compares the names with ``deploy/metrics.txt``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from worker.auth.provider.breaker import BREAKER_STATES, CircuitBreaker
from worker.contract.catalogue import ServiceError
from worker.contract.messages import COMMAND_TYPES
from worker.dlq.letter import DLQ_REASONS
from worker.engine.metrics import LATENCY_BUCKETS, LoopSeries
from worker.runtime.metrics import WORKER_PREFIX, Families

#: How a parked long-poll ended (``worker.auth.waits.END_REASONS``, which imports this module).
WAIT_END_REASONS: tuple[str, ...] = ("changed", "timeout", "cap", "revoked", "stop")

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
        f = Families(registry)
        self.commands = f.counter(
            "passkey_auth_commands", "Commands applied, by type and outcome", ("type", "outcome")
        )
        self.errors = f.counter(
            "passkey_auth_errors",
            "Catalogued errors produced, by code",
            ("code", "numeric_code", "http_status"),
            seed=((code, str(numeric), str(http)) for code, http, numeric in WORKER_ERRORS),
        )
        self.command_seconds = f.histogram(
            "passkey_auth_command_duration_seconds",
            "Record fetched to all outputs acknowledged",
            ("type",),
            buckets=LATENCY_BUCKETS,
        )
        self.provider_seconds = f.histogram(
            "passkey_auth_provider_request_duration_seconds",
            "Provider calls incl. retries",
            ("provider", "operation", "outcome"),
            buckets=LATENCY_BUCKETS,
        )
        self.provider_retries = f.counter(
            "passkey_auth_provider_retries",
            "Provider call retries after transient failures",
            ("provider", "operation"),
        )
        self.dlq = f.counter(
            "passkey_auth_dlq_records",
            "Records sent to the DLQ, by dlq.reason: undecodable, or their handling failed "
            "for good",
            ("reason",),
            seed=DLQ_REASONS,
        )
        self.forwarded = f.counter(
            "passkey_auth_commands_forwarded",
            "Commands that arrived off their key's home partition and were forwarded there",
            ("type",),
            seed=COMMAND_TYPES,
        )
        self.status_changes = f.counter(
            "passkey_auth_status_changes",
            "Status-change events published, by new status",
            ("status",),
        )
        self.follow_up_expired = f.counter(
            "passkey_auth_follow_up_expired", "Flows failed by the follow-up deadline"
        )
        self.parked_waits = f.gauge(
            "passkey_auth_parked_waits",
            "Long-polls (get_auth_state with wait_ms) parked until their account changes",
        )
        self.parked_waits_ended = f.counter(
            "passkey_auth_parked_waits_ended",
            "Long-polls answered, by how their wait ended: changed, timeout, cap (answered at "
            "once past a cap), revoked (their partition left), stop",
            ("reason",),
            seed=WAIT_END_REASONS,
        )

    def export_breakers(self, breakers: Callable[[], Iterable[tuple[str, CircuitBreaker]]]) -> None:
        """Export the state of the providers' circuit breakers (``BreakerStates``)."""
        self.registry.register(BreakerStates(breakers))

    def provider_call(self, provider: str, operation: str, outcome: str, seconds: float) -> None:
        """Observer hook handed to provider adapters (they never see the registry)."""
        self.child(self.provider_seconds, provider, operation, outcome).observe(seconds)

    def provider_retry(self, provider: str, operation: str) -> None:
        self.provider_retries.labels(provider, operation).inc()
