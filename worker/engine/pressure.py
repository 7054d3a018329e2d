"""The consume loop's backpressure: the count of records and due keys in flight (the one place
it changes), the in-flight bound, each partition's share of it (taken through the one admission
rule, ``worker.runtime.admission.Share``) and each key's share. Too much in flight pauses every
partition; a partition at its share, or a key at its share, pauses that partition only
(docs/architecture.md, "The consume engine", "Per-account lanes", "Admission")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.engine.lanes import LOGGED_KEY_CHARS, Lane
from worker.runtime.admission import Share
from worker.runtime.logs import get_logger

# The lines are the consume loop's: they keep its logger name, which dashboards and searches use.
log = get_logger("worker.engine.consume_loop")


#: A partition's share of the in-flight bound is ``Share.split(bound, owners=2)``: two
#: partitions at their share leave a quarter of the bound to partitions holding none (375 of
#: the default 1000 each, 250 kept). Many keys of one partition, each under its key share,
#: then fill their partition's share, not the bound; a record of another partition still finds
#: room. A single partition never holds more than its share, even alone on the process.
PARTITION_SHARE_OWNERS: Final = 2


def partition_shares(max_in_flight: int) -> tuple[Share, Share]:
    """The rule a partition's record is admitted by, and the one a partition paused for its
    share resumes by: down to half its share, with half a share of room above the reserve
    (so that one slot freed does not resume it only to pause it again at the next record)."""
    take = Share.split(max_in_flight, owners=PARTITION_SHARE_OWNERS)
    resume = Share(
        capacity=take.capacity,
        per_owner=take.per_owner // 2 + 1,
        reserve=min(take.capacity - 1, take.reserve + take.per_owner // 2),
    )
    return take, resume


def input_partitions(topics: Iterable[str], numbers: Iterable[int]) -> list[TopicPartition]:
    """The topic-partitions of partition ``numbers`` of every co-partitioned input topic."""
    return [TopicPartition(t, p) for p in numbers for t in topics]


def _bump(counts: dict[Any, int], key: Any, by: int) -> None:
    """``counts[key] += by``, keeping only keys that count some."""
    if (left := counts.get(key, 0) + by) > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


@dataclass(eq=False, kw_only=True)
class Pressure:
    """What is in flight and what it holds up. ``lanes`` is the loop's own map (read, never
    written here): a key's load is its lane's queue, the running item included, and its
    queries running beside the lane (``aside_load``)."""

    consumer: AIOKafkaConsumer
    topics: tuple[str, ...]
    lanes: Mapping[tuple[int, str], Lane]
    #: The loop's series (``LoopSeries``): ``in_flight``, ``key_pauses``.
    metrics: Any
    max_in_flight: int
    key_share: int

    def __post_init__(self) -> None:
        #: A hot key's partition resumes once every hot key of it is down to this.
        self.key_resume_at = self.key_share // 2
        #: Each partition's share of the bound (``partition_shares``): owner = the partition.
        self.partition_share, self.partition_resume = partition_shares(self.max_in_flight)
        self.in_flight = 0
        # Read when scraped: nothing to set per record taken in or let go.
        self.metrics.in_flight.set_function(lambda: self.in_flight)
        #: What each partition holds of ``in_flight`` (only partitions holding some).
        self.held: dict[int, int] = {}
        #: Partitions the rule refused (at their share, or the reserve reached), until the
        #: resume rule admits them again (only active partitions).
        self.crowded: set[int] = set()
        #: Of ``key_paused``, those paused for their partition's share (for the log lines).
        self.share_paused: set[int] = set()
        #: Queries running beside their lane, per (partition, key).
        self.aside_load: dict[tuple[int, str], int] = {}
        #: Keys at their share, per partition number (only active partitions).
        self.hot: dict[int, set[str]] = {}
        #: Partition numbers paused alone in the consumer: a key of theirs is hot, or the
        #: partition is at its share.
        self.key_paused: set[int] = set()
        #: Partition numbers assigned and restored: the only ones dispatched, paused or resumed.
        self.active: set[int] = set()
        self.paused = False

    def add(self, partition: int, count: int) -> None:
        """Records and due keys of ``partition`` taken in (``count`` > 0) or let go (< 0)."""
        self.in_flight += count
        _bump(self.held, partition, count)

    def admits(self, partition: int) -> bool:
        """Whether ``partition`` may take one more of the bound (``partition_share``)."""
        return self.partition_share.admits(self.held.get(partition, 0), self.in_flight)

    def fetchable(self) -> int:
        """How many records one fetch may bring: the most the rule still admits of one partition
        read (a fetch may bring them all from one; ``Share.room``), at least one. A record past
        it would be refused, and its partition read again from there."""
        share, in_flight = self.partition_share, self.in_flight
        rooms = [share.room(self.held.get(p, 0), in_flight) for p in self.active - self.key_paused]
        return max(1, max(rooms, default=share.above_reserve(in_flight)))

    def room(self, partition: int, key: str) -> bool:
        """Whether a fetched record of ``key`` may be dispatched within the in-flight bound, the
        key's share and the partition's (the admission rule). A key or a partition at its share
        pauses that partition only (``apply``), so one slow lane cannot fill the bound and
        pause every partition; the other keys of the paused partition (Kafka's ordering unit)
        wait until the hot lane drains to half its share: that is all it can hold up."""
        if self.in_flight >= self.max_in_flight:
            return False
        if self.load(partition, key) >= self.key_share:
            self._heat(partition, key)
            return False
        if not self.admits(partition):
            if partition in self.active:
                self.crowded.add(partition)
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
        self.add(where[0], 1)
        _bump(self.aside_load, where, 1)
        self.heat_if_full(*where)

    def aside_finished(self, where: tuple[int, str]) -> None:
        """A query beside its lane is done."""
        self.add(where[0], -1)
        _bump(self.aside_load, where, -1)
        self.cooled(*where)

    def apply(self) -> None:
        """Pause fetching while too much is in flight, every partition; resume at half the
        limit. Pause the partition of a key at its share (``room``) alone; resume it once
        every hot key of it is down to half the share. Pause a partition the rule refused
        alone too; resume it once ``partition_resume`` admits it. Called between fetches only,
        so that no pause races a rebalance: ``active`` holds assigned partitions only."""
        active = self.active
        resume = self.partition_resume
        self.crowded = {
            p
            for p in self.crowded
            if p in active and not resume.admits(self.held.get(p, 0), self.in_flight)
        }
        hot = {p for p in self.hot if p in active}
        alone = hot | self.crowded
        heated = alone - self.key_paused
        cooled = (self.key_paused - alone) & active
        for p in sorted(heated):
            if p not in hot:
                log.warning(
                    "partition_paused_for_share",
                    partition=p,
                    held=self.held.get(p, 0),
                    share=self.partition_share.per_owner,
                    reserve=self.partition_share.reserve,
                    in_flight=self.in_flight,
                )
                continue
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
            log.info(
                "partition_resumed_for_share"
                if p in self.share_paused
                else "partition_resumed_for_key",
                partition=p,
                in_flight=self.in_flight,
            )
        self.share_paused = (self.share_paused | (heated - hot)) & alone
        self.key_paused = alone
        if not self.paused and self.in_flight >= self.max_in_flight:
            self.consumer.pause(*input_partitions(self.topics, active))
            self.paused = True
        elif self.paused and self.in_flight < self.max_in_flight // 2:
            self.consumer.resume(*input_partitions(self.topics, active - alone))
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
        self.crowded -= partitions
        self.share_paused -= partitions
        self.key_paused -= partitions
