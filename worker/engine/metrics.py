"""The consume loop's own series and the read models' skip counts, named per process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from worker.runtime.metrics import Families


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
    """The consume loop's own series, named per process: ``{prefix}consumer_lag``,
    ``{prefix}{role}_ready`` ... The worker's are ``passkey_auth_*``, the webhook dispatcher's
    ``passkey_webhook_*``; the meanings are the same."""

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
        f, p = Families(registry), prefix
        self.in_flight = f.gauge(f"{p}{in_flight[0]}", in_flight[1])
        self.lag = f.gauge(
            f"{p}consumer_lag", "High-water mark minus committed offset", ("topic", "partition")
        )
        self.store_accounts = f.gauge(f"{p}state_store_accounts", f"{records} held in memory")
        self.restore_seconds = f.histogram(
            f"{p}state_restore_duration_seconds",
            "Time to restore one partition's state",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.restore_records = f.counter(
            f"{p}state_restore_records", f"{records} read while restoring"
        )
        self.rebalances = f.counter(
            f"{p}rebalances",
            "Partition assignment changes",
            ("kind",),
            seed=("assigned", "revoked"),
        )
        self.restore_undecodable = f.counter(
            f"{p}state_restore_undecodable",
            f"{records} skipped while restoring because they could not be decoded",
        )
        self.unit_failures = f.counter(
            f"{p}unit_failures",
            "Units of work (a record, or a due key's follow-up) that raised: retried, then "
            "dead-lettered (records) or given up (follow-ups)",
            ("stage", "outcome"),
            seed=(
                ("record", "retried"),
                ("record", "dead_lettered"),
                ("follow_up", "retried"),
                ("follow_up", "given_up"),
            ),
        )
        self.offset_gaps = f.counter(
            f"{p}offset_gaps",
            "Offsets never seen below a fetched record, waited for and then passed (the "
            "broker handed out a record past one it had not stored; the log line names the "
            "topic)",
        )
        self.key_pauses = f.counter(
            f"{p}key_pauses",
            "Partitions paused because one lane key held its share of the in-flight bound "
            "(the partition_paused_for_key log line)",
        )
        self.ready = f.gauge(f"{p}{role}_ready", "1 once joined and restored")
        self.heartbeat = f.gauge(
            f"{p}{role}_heartbeat_timestamp_seconds", "Last consume-loop iteration (epoch s)"
        )
        #: Each (family, label values) series ``child`` looked up: fixed sets of the code
        #: (command types, verdicts, statuses, outcomes, catalogued errors and reasons) and
        #: the configured providers.
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}

    def child(self, family: MetricWrapperBase, *values: str) -> Any:
        """``family.labels(*values)``, looked up once: a cached series' increment costs about
        a quarter of a ``labels`` call and its increment."""
        series = self._children.get((family, values))
        if series is None:
            series = self._children[(family, values)] = family.labels(*values)
        return series

    def beat(self) -> None:
        self.heartbeat.set(time.time())
