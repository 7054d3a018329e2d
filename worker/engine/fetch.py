"""Fetching past a record the Kafka client cannot parse: every reader's ``getmany``, which
reads a partition one record at a time after such an error and skips that record, instead of
raising for ever (docs/architecture.md, "Failure handling")."""

from __future__ import annotations

import struct
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


async def getmany(
    consumer: Any,
    *,
    timeout_ms: int,
    max_records: int | None,
    on_unreadable: OnUnreadable,
    owned: Iterable[TopicPartition] | None = None,
) -> Batch:
    """``consumer.getmany`` (of every partition it reads; ``owned`` names them when the
    consumer cannot) that skips, and reports, the records the client cannot parse.

    A failed call hands out nothing, but may have moved the positions of the partitions it
    drained before the one that failed: so every position is taken before the call, and after
    a failure each partition goes back to it and is read again, one record at a time.
    """
    tps = list(consumer.assignment() if owned is None else owned)
    before = {tp: await consumer.position(tp) for tp in tps}
    try:
        batch: Batch = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
    except UNREADABLE:
        still = set(consumer.assignment() if owned is None else tps)
        for tp, position in before.items():
            if tp in still:  # a rebalance during the call may have taken some away
                consumer.seek(tp, position)
        return await _one_by_one(
            consumer, still, timeout_ms, max_records or _ONE_BY_ONE_LIMIT, on_unreadable
        )
    return batch


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


__all__ = ["UNREADABLE", "OnUnreadable", "getmany", "skipping"]
