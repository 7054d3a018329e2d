"""The consume loop's backpressure: the count of records and due keys in flight (the one place
it changes), the in-flight bound, and each key's share of it. Too much in flight pauses every
partition; a key at its share pauses its own partition only (docs/architecture.md, "The consume
engine", "Per-account lanes")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.engine.lanes import LOGGED_KEY_CHARS, Lane
from worker.runtime.logs import get_logger

# The lines are the consume loop's: they keep its logger name, which dashboards and searches use.
log = get_logger("worker.engine.consume_loop")


def input_partitions(topics: Iterable[str], numbers: Iterable[int]) -> list[TopicPartition]:
    """The topic-partitions of partition ``numbers`` of every co-partitioned input topic."""
    return [TopicPartition(t, p) for p in numbers for t in topics]


class Pressure:
    """What is in flight and what it holds up. ``lanes`` is the loop's own map (read, never
    written here): a key's load is its lane's queue, the running item included, and its
    queries running beside the lane (``aside_load``)."""

    def __init__(
        self,
        *,
        consumer: AIOKafkaConsumer,
        topics: tuple[str, ...],
        lanes: dict[tuple[int, str], Lane],
        metrics: Any,
        max_in_flight: int,
        key_share: int,
    ) -> None:
        self.consumer = consumer
        self.topics = topics
        self.lanes = lanes
        #: The loop's series (``LoopMetrics``): ``in_flight``, ``key_pauses``.
        self.metrics = metrics
        self.max_in_flight = max_in_flight
        self.key_share = key_share
        #: A hot key's partition resumes once every hot key of it is down to this.
        self.key_resume_at = key_share // 2
        self.in_flight = 0
        #: Queries running beside their lane, per (partition, key).
        self.aside_load: dict[tuple[int, str], int] = {}
        #: Keys at their share, per partition number (only active partitions).
        self.hot: dict[int, set[str]] = {}
        #: Partition numbers paused in the consumer because a key of theirs is hot.
        self.key_paused: set[int] = set()
        #: Partition numbers assigned and restored: the only ones dispatched, paused or resumed.
        self.active: set[int] = set()
        self.paused = False

    def add(self, count: int) -> None:
        """Records and due keys taken in (``count`` > 0) or let go (< 0): the gauge follows."""
        self.in_flight += count
        self.metrics.in_flight.set(self.in_flight)

    def room(self, partition: int, key: str) -> bool:
        """Whether a fetched record of ``key`` may be dispatched: the loop's in-flight bound
        (``max_in_flight``) and the key's share of it (``key_share``) both hard.

        A key at its share (one account's 404 flood, one account's events behind failing
        endpoints) pauses its own partition only (``apply``), so other partitions keep flowing
        instead of the whole bound filling with one slow lane and every partition pausing. The
        partition is Kafka's ordering unit: the other keys of a paused partition wait too, for
        as long as the hot lane takes to drain from its share to half of it; that is the
        trade-off, and all a hot key can hold up."""
        if self.in_flight >= self.max_in_flight:
            return False
        if self.load(partition, key) >= self.key_share:
            self._heat(partition, key)
            return False
        return True

    def load(self, partition: int, key: str) -> int:
        """What ``key`` of ``partition`` holds of the in-flight bound."""
        lane = self.lanes.get((partition, key))
        queued = len(lane.items) if lane is not None else 0
        return queued + self.aside_load.get((partition, key), 0)

    def _heat(self, partition: int, key: str) -> None:
        if partition in self.active:
            self.hot.setdefault(partition, set()).add(key)

    def heat_if_full(self, partition: int, key: str) -> None:
        """Mark ``key`` hot once it holds its share, by the measure ``room`` checks."""
        if self.load(partition, key) >= self.key_share:
            self._heat(partition, key)

    def cooled(self, partition: int, key: str) -> None:
        """``key`` let go of some of its share: drop it from its partition's hot keys once it
        is down to half the share (the partition resumes at the next ``apply``)."""
        keys = self.hot.get(partition)
        if keys is None or key not in keys:
            return
        if self.load(partition, key) <= self.key_resume_at:
            keys.discard(key)
            if not keys:
                del self.hot[partition]

    def aside_started(self, where: tuple[int, str]) -> None:
        """A query of ``where`` (partition, key) runs beside its lane."""
        self.add(1)
        self.aside_load[where] = self.aside_load.get(where, 0) + 1
        self.heat_if_full(*where)

    def aside_finished(self, where: tuple[int, str] | None) -> None:
        """A query beside its lane is done (``None``: one whose partition was let go)."""
        self.add(-1)
        if where is None:
            return
        left = self.aside_load.get(where, 0) - 1
        if left > 0:
            self.aside_load[where] = left
        else:
            self.aside_load.pop(where, None)
        self.cooled(*where)

    def apply(self) -> None:
        """Pause fetching while too much is in flight, every partition; resume at half the
        limit. Pause the partition of a key at its share (``room``) alone; resume it once
        every hot key of it is down to half the share. Called between fetches only, so that
        no pause races a rebalance: ``active`` holds assigned partitions only."""
        active = self.active
        hot = {p for p in self.hot if p in active}
        heated = hot - self.key_paused
        cooled = (self.key_paused - hot) & active
        for p in sorted(heated):
            keys = sorted(self.hot[p])
            log.warning(
                "partition_paused_for_key",
                partition=p,
                keys=len(keys),
                key=keys[0][:LOGGED_KEY_CHARS],
                share=self.key_share,
                in_flight=self.in_flight,
            )
            self.metrics.key_pauses.inc()
        for p in sorted(cooled):
            log.info("partition_resumed_for_key", partition=p, in_flight=self.in_flight)
        self.key_paused = hot
        if not self.paused and self.in_flight >= self.max_in_flight:
            self.consumer.pause(*input_partitions(self.topics, active))
            self.paused = True
        elif self.paused and self.in_flight < self.max_in_flight // 2:
            self.consumer.resume(*input_partitions(self.topics, active - hot))
            self.paused = False
        elif not self.paused:
            if heated:
                self.consumer.pause(*input_partitions(self.topics, heated))
            if cooled:
                self.consumer.resume(*input_partitions(self.topics, cooled))

    def forget(self, partitions: set[int]) -> None:
        """Revoked ``partitions`` (already out of ``active``): the consumer forgets their
        pauses; so does this."""
        for p in partitions:
            self.hot.pop(p, None)
        self.key_paused -= partitions
