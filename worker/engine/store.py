"""State stores: records of the owned partitions, in memory, rebuilt from a changelog
(``auth.state``, the dispatcher's delivery states) on assignment; correct without compaction
(docs/architecture.md, "Keys, compaction and co-partitioning")."""

from __future__ import annotations

import gc
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.engine.catch_up import catch_up
from worker.engine.timers import TimerQueue
from worker.runtime.logs import get_logger

log = get_logger(__name__)

R = TypeVar("R")
Decoder = Callable[[bytes], tuple[str, R]]
"""A changelog value → (key, record); raises when it is not one (restore skips it)."""


class PartitionedStore(ABC, Generic[R]):
    """Records by owned partition and key, plus a ``TimerQueue`` of what is due when.
    Subclasses say what a record's key is and which timers it arms (``_arm``) and owns
    (``_timer_keys``); the rest is shared by the worker's and the dispatcher's stores."""

    #: Whether the consume loop notes, on assignment, where each input partition ended
    #: (``handed_over``), so the handler can tell what a previous owner may have fetched.
    tracks_handover: ClassVar[bool] = False

    def __init__(self) -> None:
        self._parts: dict[int, dict[str, R]] = {}
        self._handover: dict[tuple[str, int], int] = {}
        self.timers = TimerQueue()
        #: Ask the consume loop sweeping these timers to look for due keys at the event
        #: loop's next turn instead of its next tick: for a key made due by something other
        #: than its own lane (a freed slot at a webhook endpoint). The composition root sets
        #: it to the loop's ``ConsumeLoop.sweep_soon``.
        self.sweep_soon: Callable[[], None] = _unswept

    @staticmethod
    @abstractmethod
    def decode(value: bytes) -> tuple[str, R]:
        """A changelog value as (key, record); raises for anything else."""

    @abstractmethod
    def key_of(self, record: R) -> str: ...

    @abstractmethod
    def _arm(self, partition: int, record: R) -> None:
        """Arm (or cancel) the timers ``record`` implies."""

    @abstractmethod
    def _timer_keys(self, record: R) -> list[str]:
        """Every timer key ``record`` may have armed."""

    def get(self, partition: int, key: str) -> R | None:
        return self._parts.get(partition, {}).get(key)

    def put(self, partition: int, record: R) -> None:
        self._parts.setdefault(partition, {})[self.key_of(record)] = record
        self._arm(partition, record)

    def pop_due(self, now: float, *, retry_at: float) -> tuple[str, int] | None:
        """The next timer key (and its partition) that is due (``TimerQueue.pop_due``)."""
        return self.timers.pop_due(now, retry_at=retry_at)

    def load(self, partition: int, records: dict[str, R]) -> None:
        """Install a restored partition (replacing whatever was there)."""
        self.drop(partition)
        self._parts[partition] = {}
        for record in records.values():
            self.put(partition, record)

    def handed_over(self, topic: str, partition: int, end: int) -> None:
        """The input partition ended at ``end`` when this process was assigned it (after every
        previous owner had given it up): records below it are the only ones a previous owner
        can have fetched."""
        self._handover[(topic, partition)] = end

    def inherited(self, topic: str, partition: int, offset: int) -> bool:
        """Whether a previous owner may have fetched (and acted on) the record at ``offset``;
        True when the partition's end at assignment is not known."""
        end = self._handover.get((topic, partition))
        return end is None or offset < end

    def drop(self, partition: int) -> None:
        for handed in [tp for tp in self._handover if tp[1] == partition]:
            del self._handover[handed]
        for record in self._parts.pop(partition, {}).values():
            for key in self._timer_keys(record):
                self.timers.cancel(key)
        self.timers.compact()

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts.values())


def _unswept() -> None:
    """No loop sweeps this store yet: its next sweep finds the key."""


@dataclass(frozen=True, slots=True)
class RestoreStats:
    partition: int
    records: int
    accounts: int
    undecodable: int
    seconds: float


async def restore_partitions(
    consumer: AIOKafkaConsumer,
    tps: list[TopicPartition],
    *,
    decode: Decoder[R],
) -> dict[int, tuple[dict[str, R], RestoreStats]]:
    """Read every changelog partition in ``tps`` to its end (``catch_up``'s rule) on the
    group-less ``consumer``, keeping the last record per key; ``decode`` turns a value into
    (key, record) or raises (the record is skipped)."""
    latest: dict[TopicPartition, dict[str, R]] = {tp: {} for tp in tps}
    bad = dict.fromkeys(tps, 0)

    def fold(tp: TopicPartition, messages: list[Any]) -> None:
        bad[tp] += _apply(latest[tp], messages, tp, decode)

    # Restored records hold no reference cycles, but each is a handful of GC-tracked objects,
    # and the cyclic collector would re-scan the growing pile over and over while it is built:
    # paused, a restore reads ~77,000 records/s instead of ~50,000 (bench/README.md, "Hot spots
    # found and removed"). Paused for the replay, re-enabled after.
    collector_was_enabled = gc.isenabled()
    gc.disable()
    try:
        replayed = await catch_up(consumer, tps, fold)
    finally:
        if collector_was_enabled:
            gc.enable()
    stats = {
        tp: RestoreStats(tp.partition, done.records, len(latest[tp]), bad[tp], done.seconds)
        for tp, done in replayed.items()
    }
    return {tp.partition: (latest[tp], stats[tp]) for tp in tps}


def _apply(
    latest: dict[str, R], messages: list[Any], tp: TopicPartition, decode: Decoder[R]
) -> int:
    """Fold changelog records into ``latest``; returns how many could not be decoded."""
    bad = 0
    for msg in messages:
        if msg.value is None:  # a tombstone, from a compacting producer if there ever is one
            if msg.key:
                latest.pop(msg.key.decode("utf-8", "replace"), None)
            continue
        try:
            key, record = decode(msg.value)
        except Exception as exc:  # whatever the bytes: counted and skipped, never fatal
            bad += 1
            log.error(
                "state_record_undecodable",
                partition=tp.partition,
                offset=msg.offset,
                error=type(exc).__name__,
            )
            continue
        latest[key] = record
    return bad
