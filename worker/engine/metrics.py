"""The consume loop's own series and the read models' skip counts, named per process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


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


LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LoopSeries:
    """The consume loop's own series (``worker.engine.consume_loop.LoopMetrics``), named per
    process: ``{prefix}consumer_lag``, ``{prefix}{role}_ready`` ... The worker's are
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

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(f"{prefix}{name}", doc, labels, registry=registry)

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(f"{prefix}{name}", doc, labels, registry=registry)

        self.in_flight = gauge(*in_flight)
        self.lag = gauge(
            "consumer_lag", "High-water mark minus committed offset", "topic", "partition"
        )
        self.store_accounts = gauge("state_store_accounts", f"{records} held in memory")
        self.restore_seconds = Histogram(
            f"{prefix}state_restore_duration_seconds",
            "Time to restore one partition's state",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=registry,
        )
        self.restore_records = counter("state_restore_records", f"{records} read while restoring")
        self.rebalances = counter("rebalances", "Partition assignment changes", "kind")
        self.restore_undecodable = counter(
            "state_restore_undecodable",
            f"{records} skipped while restoring because they could not be decoded",
        )
        self.unit_failures = counter(
            "unit_failures",
            "Units of work (a record, or a due key's follow-up) that raised: retried, then "
            "dead-lettered (records) or given up (follow-ups)",
            "stage",
            "outcome",
        )
        self.offset_gaps = counter(
            "offset_gaps",
            "Offsets never seen below a fetched record, waited for and then passed (the "
            "broker handed out a record past one it had not stored; the log line names the "
            "topic)",
        )
        self.key_pauses = counter(
            "key_pauses",
            "Partitions paused because one lane key held its share of the in-flight bound "
            "(the partition_paused_for_key log line)",
        )
        self.ready = gauge(f"{role}_ready", "1 once joined and restored")
        self.heartbeat = gauge(
            f"{role}_heartbeat_timestamp_seconds", "Last consume-loop iteration (epoch s)"
        )
        for kind in ("assigned", "revoked"):
            self.rebalances.labels(kind)
        for stage in ("record", "follow_up"):
            for outcome in ("retried", "dead_lettered" if stage == "record" else "given_up"):
                self.unit_failures.labels(stage, outcome)

    def beat(self) -> None:
        self.heartbeat.set(time.time())
