"""Prometheus metrics of the API front-end, on an injected registry; names are a contract with
``deploy/``, labels bounded (the route template, never the raw path; a fixed set of methods)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from worker.api.webhooks.quotas import QUOTAS
from worker.runtime.metrics import Families

_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_METHODS: Final = frozenset({"GET", "POST", "OPTIONS", "HEAD", "PUT", "PATCH", "DELETE"})

UNMATCHED_ROUTE: Final = "unmatched"

REFUSAL_REASONS: Final = (
    "connection_limit",
    "header_too_large",
    "too_many_headers",
    "head_timeout",
    "body_timeout",
    "rate_limited",
    "client_connection_limit",
    "write_timeout",
)
"""``passkey_api_refusals_total{reason}``: what the front door refuses (docs/operations.md,
"Front-door limits"). Never labelled by workspace: the label set stays this small."""

IDEMPOTENCY_REFUSALS: Final = ("in_progress", "reused", "exhausted")
#: ``passkey_api_query_failures_total{reason}`` (docs/api.md, "Operations").
QUERY_FAILURES: Final = ("not_ready", "not_queued", "deadline", "bad_reply")


#: ``(key_id, workspace_id, unix time)`` of each key presented (``KeyStore.last_used``).
KeyUsage = Callable[[], Iterable[tuple[str, str, float]]]


class KeyUsageCollector(Collector):
    """``passkey_api_key_last_used_timestamp_seconds{key_id}``, read from the key store at
    scrape time: one series per key id of the keys file (operator-created, so bounded); a
    deleted key's series goes with it. Key ids only, never a key, and no workspace id: which
    workspace a key belongs to is in the keys file (``keys list``), not in every scrape."""

    def __init__(self, usage: KeyUsage) -> None:
        self._usage = usage

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "passkey_api_key_last_used_timestamp_seconds",
            "Unix time this front-end last saw each API key presented (accepted or not)",
            labels=["key_id"],
        )
        for key_id, _, seen_at in self._usage():
            family.add_metric([key_id], seen_at)
        yield family


def method_label(method: str) -> str:
    """A bounded label for an HTTP method (fuzzers and scanners send anything)."""
    return method if method in _METHODS else "other"


class ApiMetrics:
    """Every metric the front-end exports; tests build one per fresh registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        f = Families(registry)
        self.requests = f.counter(
            "passkey_api_requests",
            "HTTP requests answered, by route template, method and status",
            ("route", "method", "status"),
        )
        self.duration = f.histogram(
            "passkey_api_request_duration_seconds",
            "Request received to response sent",
            ("route", "method"),
            buckets=_BUCKETS,
        )
        self.reply_timeouts = f.counter(
            "passkey_api_reply_timeouts",
            "passkey-confirm requests answered 500 because no reply arrived in time",
        )
        self.query_timeouts = f.counter(
            "passkey_api_query_timeouts",
            "GET /auth requests answered 500 because the owner's answer did not arrive in time",
        )
        self.query_failures = f.counter(
            "passkey_api_query_failures",
            "GET /auth requests answered 500 get_auth_state_failed, by reason: not_ready (reply"
            " consumer not positioned), not_queued (query not acknowledged by Kafka), deadline"
            " (no answer in time), bad_reply (an unusable answer, or the reply consumer stopped)",
            ("reason",),
            seed=QUERY_FAILURES,
        )
        self.pending_replies = f.gauge(
            "passkey_api_pending_replies",
            "Requests currently waiting for their reply on auth.replies",
        )
        self.refusals = f.counter(
            "passkey_api_refusals",
            "Connections and requests the front door refused, by reason",
            ("reason",),
            seed=REFUSAL_REASONS,
        )
        self.ready = f.gauge(
            "passkey_api_ready",
            "1 when the reply consumer is positioned (and the webhook registry caught up)",
        )
        # Quotas per workspace (worker/api/webhooks/quotas.py).
        self.quota_refusals = f.counter(
            "passkey_api_quota_refusals",
            "Webhook requests refused by a per-workspace quota or field limit, by quota",
            ("quota",),
            seed=QUOTAS,
        )
        self.secrets_dropped = f.counter(
            "passkey_api_webhook_secrets_dropped",
            "Signing secrets that stopped signing before their expiry: older than the previous"
            " one at a rotation (rotated), on request (expired), or of a record written before"
            " the bound (trimmed)",
            ("reason",),
            seed=("rotated", "expired", "trimmed"),
        )
        # Idempotent confirms (worker/api/idempotency.py): bounded labels only, never a key.
        self.idempotency_replays = f.counter(
            "passkey_api_idempotency_replays",
            "passkey-confirm requests answered with the kept answer of their Idempotency-Key"
            " (no command sent)",
        )
        self.idempotency_refusals = f.counter(
            "passkey_api_idempotency_refusals",
            "passkey-confirm requests with an Idempotency-Key refused, by reason: in_progress"
            " (409), reused (409, another body or account), exhausted (429, workspace out of"
            " keys)",
            ("reason",),
            seed=IDEMPOTENCY_REFUSALS,
        )
        self.idempotency_keys_stored = f.counter(
            "passkey_api_idempotency_keys_stored",
            "Idempotency-Key answers this front-end kept (one per key that ran its command)",
        )
        self.replays_in_flight = f.gauge(
            "passkey_api_webhook_replays_in_flight",
            "Webhook replays running or waiting for a slot in this process",
        )


class ReplyReaderSeries(Collector):
    """The reply reader's series, read at scrape time (while it is behind, ``/readyz`` fails
    too; the gaps are ``worker.engine.fetch.GapWatch``'s)."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def collect(self) -> Iterable[Metric]:
        reader = self._reader
        yield GaugeMetricFamily(
            "passkey_api_reply_lag_records",
            "Replies on this replica's partition of auth.replies not read yet",
            value=reader.lag,
        )
        yield GaugeMetricFamily(
            "passkey_api_reply_reader_keeping_up",
            "1 while the reply reader keeps up with its partition, 0 while it is behind",
            value=1.0 if reader.keeping_up else 0.0,
        )
        yield CounterMetricFamily(
            "passkey_api_reply_offset_gaps",
            "Offsets of auth.replies never seen that the reply reader waited for, then passed",
            value=reader.gaps.given_up if reader.gaps is not None else 0,
        )
