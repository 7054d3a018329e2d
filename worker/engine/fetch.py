"""Fetching past a record the Kafka client cannot parse: every reader's ``getmany``, which
reads a partition one record at a time after such an error and skips that record, instead of
raising for ever (docs/architecture.md, "Failure handling")."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException

#: What aiokafka raises for a record it cannot parse (not for the cluster or the network).
UNREADABLE: Final = (UnicodeDecodeError, CorruptRecordException, struct.error)

_ONE_BY_ONE_LIMIT: Final = 500

OnUnreadable = Callable[[TopicPartition, int, BaseException], Any | None]
"""Told of each skipped record (its partition, its offset and what parsing it raised); what it
returns, unless None, stands in the batch in the record's place (the consume loop's
placeholder, which it dead-letters in order)."""

Batch = dict[TopicPartition, list[Any]]

OnGap = Callable[[TopicPartition, int, int, float], None]
"""Told of each offset gap given up on: its partition, the first offset never seen, the
offset of the record seen after it, and the seconds it was waited for."""

GAP_HOLD_S: Final = 1.0


class GapWatch:
    """A record past an offset never seen (a gap) is held back, its partition read again from
    the missing offset, until the records arrive or ``hold_s`` passed; then ``on_gap`` is told
    and the reader goes on. For topics with dense offsets only (compacted ones have gaps by
    design). Kafka never has such a gap (a fetch ends at the high-water mark); a broker that
    advances a partition's end before storing the batch does, and a reader would commit past
    records it never saw (docs/architecture.md, "The consume engine"). Bounded: one entry per
    partition waiting, dropped once read past the gap or no longer read."""

    def __init__(self, on_gap: OnGap, *, hold_s: float = GAP_HOLD_S) -> None:
        self.on_gap = on_gap
        self.hold_s = hold_s
        self._waiting: dict[TopicPartition, tuple[int, float]] = {}
        #: Gaps given up on.
        self.given_up = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def check(self, consumer: Any, before: dict[TopicPartition, int], batch: Batch) -> Batch:
        """``batch`` (fetched from the positions ``before``) cut at the first gap of each
        partition that is still held; such a partition is sought back to the missing offset."""
        waiting = self._waiting
        for tp in [tp for tp in waiting if tp not in before]:
            del waiting[tp]  # no longer read
        now = time.monotonic()
        for tp, records in batch.items():
            expected = before.get(tp)
            if expected is None or not records:
                continue
            for i, record in enumerate(records):
                offset = record.offset
                if offset > expected:
                    missing, since = waiting.get(tp, (expected, now))
                    if missing != expected:
                        since = now
                    if now - since < self.hold_s:
                        waiting[tp] = (expected, since)
                        del records[i:]
                        consumer.seek(tp, expected)
                        break
                    waiting.pop(tp, None)
                    self.given_up += 1
                    self.on_gap(tp, expected, offset, now - since)
                expected = offset + 1
            else:
                waiting.pop(tp, None)
        return {tp: records for tp, records in batch.items() if records}


def gap_logger(log: Any, reader: str, counter: Callable[[], None] | None = None) -> OnGap:
    """An ``OnGap`` that logs the gap, naming its topic (and counts it)."""

    def report(tp: TopicPartition, missing: int, seen: int, waited_s: float) -> None:
        log.error(
            "offset_gap",
            reader=reader,
            topic=tp.topic,
            partition=tp.partition,
            first_missing=missing,
            next_seen=seen,
            missing_records=seen - missing,
            waited_s=round(waited_s, 3),
        )
        if counter is not None:
            counter()

    return report


async def getmany(
    consumer: Any,
    *,
    timeout_ms: int,
    max_records: int | None,
    on_unreadable: OnUnreadable,
    owned: Iterable[TopicPartition] | None = None,
    gaps: GapWatch | None = None,
) -> Batch:
    """``consumer.getmany`` (``owned``: its partitions, when the consumer cannot say) that
    skips and reports records the client cannot parse and, with ``gaps``, hands out none past
    an offset never seen. A failed call may have moved positions of partitions it drained, so
    each goes back to where it was (only back: a rebalance may have reset it lower) and is
    read again one record at a time."""
    tps = list(consumer.assignment() if owned is None else owned)
    before = {tp: await consumer.position(tp) for tp in tps}
    try:
        batch: Batch = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
    except UNREADABLE:
        still = set(consumer.assignment() if owned is None else tps)
        for tp, position in before.items():
            if tp in still and position <= await consumer.position(tp):
                consumer.seek(tp, position)
        batch = await _one_by_one(
            consumer, still, timeout_ms, max_records or _ONE_BY_ONE_LIMIT, on_unreadable
        )
    return batch if gaps is None else gaps.check(consumer, before, batch)


async def _one_by_one(
    consumer: Any,
    partitions: Iterable[TopicPartition],
    timeout_ms: int,
    limit: int,
    on_unreadable: OnUnreadable,
) -> Batch:
    """``partitions`` read again one record per call (the client drops a partition's buffer
    when parsing it failed, so each call may wait up to ``timeout_ms`` for the fetch again),
    past every unreadable record, until a call comes back empty or ``limit`` records came
    (a busy partition goes back to whole fetches then). Paused partitions are left alone."""
    batch: Batch = {}
    paused = consumer.paused()
    for tp in sorted(set(partitions) - set(paused)):
        for _ in range(limit):
            try:
                got = await consumer.getmany(tp, timeout_ms=timeout_ms, max_records=1)
            except UNREADABLE as exc:
                offset = await consumer.position(tp)
                consumer.seek(tp, offset + 1)
                stand_in = on_unreadable(tp, offset, exc)
                if stand_in is not None:
                    batch.setdefault(tp, []).append(stand_in)
                continue
            records = got.get(tp)
            if not records:
                break
            batch.setdefault(tp, []).extend(records)
    return batch


def skipping(name: str, log: Any, counter: Callable[[], None] | None = None) -> OnUnreadable:
    """An ``OnUnreadable`` for a reader that only skips: a log line (and a count)."""

    def skip(tp: TopicPartition, offset: int, exc: BaseException) -> None:
        log.error(
            "record_unreadable_skipped",
            reader=name,
            topic=tp.topic,
            partition=tp.partition,
            offset=offset,
            error=type(exc).__name__,
        )
        if counter is not None:
            counter()

    return skip


__all__ = [
    "GAP_HOLD_S",
    "UNREADABLE",
    "GapWatch",
    "OnGap",
    "OnUnreadable",
    "gap_logger",
    "getmany",
    "skipping",
]
