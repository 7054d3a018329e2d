"""The one bounded range read: some partitions of a topic, each from an offset, from its last
``n`` records or from the first record stamped at or after a time, to the end it had when the
read began (a fetch answer's high-water mark, ``high_water_marks``; docs/architecture.md,
"The consume engine"), within a record budget per partition and a deadline. What arrives after the
start is never read. The front-end's replays, account-event pages and delivery-log scans read
through it, on a started, group-less consumer of their own."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndTimestamp

from worker.engine.catch_up import BatchHandler, high_water_marks
from worker.engine.fetch import OnUnreadable
from worker.engine.fetch import getmany as fetch_records
from worker.engine.home_partition import home_partition
from worker.engine.tail import partitions_of

__all__ = ["Span", "partitions", "read_range", "start_at"]


@dataclass(slots=True)
class Span:
    """One partition's range: ``[start, stop)`` of a partition that ended at ``end`` when the
    read began; ``next`` is the first offset not read (``stop`` once done), ``records`` how many
    were handed over, ``last_timestamp_ms`` the broker time of the last."""

    start: int
    stop: int
    end: int
    next: int
    records: int = 0
    last_timestamp_ms: int | None = None

    @property
    def done(self) -> bool:
        return self.next >= self.stop

    @property
    def complete(self) -> bool:
        """Read to the end the partition had at the start (not stopped by a budget)."""
        return self.next >= self.end


async def partitions(
    consumer: Any, topic: str, *, deadline: float, key: bytes | None = None
) -> list[TopicPartition]:
    """Every partition of ``topic``, or ``key``'s home partition; ``TimeoutError`` when the
    consumer has not learnt them by ``deadline`` (monotonic)."""
    parts = await partitions_of(consumer, topic, deadline=deadline, pause_s=0.05)
    if not parts:
        raise TimeoutError(f"no metadata for topic {topic!r}")
    if key is not None:
        return [TopicPartition(topic, home_partition(key, max(parts) + 1))]
    return [TopicPartition(topic, p) for p in sorted(parts)]


def start_at(found: OffsetAndTimestamp | None, end: int) -> int:
    """Where a read by time starts, given the broker's answer to ListOffsets by time: "none"
    (Kafka's ``None``; other brokers' offset 0 with timestamp -1) is ``end``, nothing to
    read, never offset 0."""
    if found is None or found.timestamp < 0 or found.offset < 0:
        return end
    return min(int(found.offset), end)


async def read_range(
    consumer: Any,
    tps: Sequence[TopicPartition],
    on_batch: BatchHandler,
    *,
    on_unreadable: OnUnreadable,
    offsets: Mapping[TopicPartition, int] | None = None,
    last: int | None = None,
    since_ms: int | None = None,
    max_records: int | None = None,
    deadline: float | None = None,
) -> dict[TopicPartition, Span]:
    """Read ``tps`` (assigned to ``consumer``, replacing its assignment) from ``offsets``
    (clamped to what the partition holds), their ``last`` records or ``since_ms`` (exactly one),
    handing each partition's records in range to ``on_batch`` (awaited when it returns an
    awaitable), at most ``max_records`` offsets per partition, until each is done or
    ``deadline`` (monotonic) passed: a caller that needs a time-out around the broker calls
    too (the ends, the starts) wraps the read in one."""
    if sum(x is not None for x in (offsets, last, since_ms)) != 1:
        raise ValueError("read from exactly one of offsets, last or since_ms")
    ends = await high_water_marks(consumer, tps)
    if since_ms is not None:
        found = await consumer.offsets_for_times(dict.fromkeys(tps, max(since_ms, 0)))
        starts = {tp: start_at(found.get(tp), ends[tp]) for tp in tps}
    else:
        firsts = await consumer.beginning_offsets(list(tps))
        want = offsets if offsets is not None else {tp: ends[tp] - (last or 0) for tp in tps}
        starts = {tp: min(max(want[tp], firsts[tp]), ends[tp]) for tp in tps}
    spans: dict[TopicPartition, Span] = {}
    for tp in tps:
        start, end = starts[tp], ends[tp]
        stop = end if max_records is None else min(end, start + max_records)
        spans[tp] = Span(start, stop, end, start)
        consumer.seek(tp, start)
    pending = {tp for tp in tps if not spans[tp].done}
    consumer.pause(*(tp for tp in tps if tp not in pending))
    while pending and (deadline is None or time.monotonic() < deadline):
        chunk = await fetch_records(
            consumer,
            timeout_ms=200,
            max_records=2000,
            on_unreadable=on_unreadable,
            owned=tps,
        )
        for tp, records in chunk.items():
            span = spans[tp]
            mine = [r for r in records if span.start <= r.offset < span.stop]
            if tp not in pending or not mine:
                continue
            span.records += len(mine)
            span.next = max(span.next, mine[-1].offset + 1)
            span.last_timestamp_ms = mine[-1].timestamp
            handled = on_batch(tp, mine)
            if inspect.isawaitable(handled):
                await handled
        for tp in list(pending):
            span = spans[tp]
            span.next = max(span.next, min(await consumer.position(tp), span.stop))
            if span.done:
                pending.discard(tp)
                consumer.pause(tp)  # what arrived after the read started is not read
        await asyncio.sleep(0)
    return spans
