"""Prometheus metrics of the webhook dispatcher, on an injected registry; labels are small
fixed sets, never an endpoint URL or id nor an account id."""

from __future__ import annotations

from datetime import datetime

from prometheus_client import CollectorRegistry

from worker.dispatcher.delivery import DeliveryResult
from worker.dlq.letter import DLQ_REASONS
from worker.engine.metrics import LoopSeries
from worker.runtime.metrics import WEBHOOK_PREFIX, Families

_ATTEMPT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0)
_LATENCY_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    *(300.0, 1800.0, 7200.0, 36000.0, 86400.0),
)
RESULTS = ("delivered", "rejected", "error")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "none")
ERROR_KINDS = ("timeout", "connect", "dns", "tls", "protocol", "blocked", "internal", "other")
DEFER_REASONS = ("capacity", "backoff", "rate")
_RECORD_BUCKETS = (512, 1024, 4096, 16384, 65536, 262144, 524288, 1048576)


def status_class(status: int | None) -> str:
    return "none" if status is None else f"{min(max(status // 100, 2), 5)}xx"


class WebhookMetrics(LoopSeries):
    """Every metric the dispatcher exports."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(
            registry,
            prefix=WEBHOOK_PREFIX,
            role="dispatcher",
            in_flight=("inflight_work", "Records and due deliveries not yet settled"),
            records="Delivery-state records",
        )
        f = Families(registry)
        self.attempts = f.counter(
            "passkey_webhook_attempts",
            "Delivery attempts by result (delivered: 2xx; rejected: another status; error: "
            "no answer) and HTTP status class",
            ("result", "status_class"),
            seed=((result, cls) for result in RESULTS for cls in STATUS_CLASSES),
        )
        self.attempt_errors = f.counter(
            "passkey_webhook_attempt_errors",
            "Attempts without an HTTP answer, by kind",
            ("kind",),
            seed=ERROR_KINDS,
        )
        self.attempt_seconds = f.histogram(
            "passkey_webhook_attempt_duration_seconds",
            "One delivery attempt, request to answer",
            buckets=_ATTEMPT_BUCKETS,
        )
        self.delivery_latency = f.histogram(
            "passkey_webhook_delivery_latency_seconds",
            "Event occurred to delivered (incl. retries)",
            buckets=_LATENCY_BUCKETS,
        )
        self.taken_in = f.counter(
            "passkey_webhook_deliveries_taken_in", "Deliveries scheduled from events"
        )
        self.retries = f.counter(
            "passkey_webhook_retries_scheduled", "Failed attempts scheduled for a retry"
        )
        self.failed = f.counter(
            "passkey_webhook_deliveries_failed",
            "Deliveries failed for good (retries used up, 410, endpoint inactive)",
        )
        self.disabled = f.counter(
            "passkey_webhook_endpoints_disabled",
            "Endpoints disabled by the dispatcher (410 or continuous failure)",
        )
        self.undecodable = f.counter(
            "passkey_webhook_undecodable_events",
            "Event or replay records that could not be read (skipped)",
        )
        self.dlq = f.counter(
            "passkey_webhook_dlq_records",
            "Input records (events, replay requests) sent to the webhook DLQ, by dlq.reason",
            ("reason",),
            seed=DLQ_REASONS,
        )
        self.in_flight_attempts = f.gauge(
            "passkey_webhook_inflight_attempts", "HTTP attempts under way"
        )
        self.deferrals = f.counter(
            "passkey_webhook_attempts_deferred",
            "Due deliveries put back because their endpoint had no room: its share of "
            "in-flight attempts taken (capacity), backing off after failures (backoff), or "
            "its rate limit reached (rate)",
            ("reason",),
            seed=DEFER_REASONS,
        )
        self.endpoints_backing_off = f.gauge(
            "passkey_webhook_endpoints_backing_off",
            "Endpoints backing off as a whole after failing continuously (this process)",
        )
        self.queue_full = f.counter(
            "passkey_webhook_deliveries_refused",
            "Deliveries refused because their (endpoint, account) queue was full; each one "
            "failed into the webhook DLQ (reason queue_full)",
        )
        self.state_migrated = f.counter(
            "passkey_webhook_state_migrated",
            "Old-form delivery-state records (one per account) split into per-pair records "
            "and tombstoned",
        )
        self.state_record_bytes = f.histogram(
            "passkey_webhook_state_record_bytes",
            "Size of each delivery-state record written",
            buckets=_RECORD_BUCKETS,
        )

    def attempt(self, result: DeliveryResult, seconds: float) -> None:
        if result.ok:
            outcome = "delivered"
        elif result.status is not None:
            outcome = "rejected"
        else:
            outcome = "error"
            kind = result.error if result.error in ERROR_KINDS else "other"
            self.child(self.attempt_errors, kind).inc()
        self.child(self.attempts, outcome, status_class(result.status)).inc()
        self.attempt_seconds.observe(seconds)

    def delivered(self, occurred_at: str, now: float) -> None:
        try:
            occurred = datetime.fromisoformat(occurred_at).timestamp()
        except ValueError:
            return
        self.delivery_latency.observe(max(0.0, now - occurred))
