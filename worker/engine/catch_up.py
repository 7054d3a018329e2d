"""Catch up on partitions, from their beginning to their high-water mark: the one loop of
the store's restore, the front-end's tails and the tools, so all agree on where a partition
ends. That end is a fetch response's high-water mark, never ``end_offsets()`` (some brokers
answer it with the last batch's first offset + 1) nor an empty poll (docs/architecture.md,
"The consume engine")."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.engine.fetch import GapWatch, OnUnreadable, skipping
from worker.engine.fetch import getmany as fetch_records
from worker.runtime.logs import get_logger

log = get_logger(__name__)

__all__ = ["BatchHandler", "CaughtUp", "catch_up", "high_water_marks"]

BatchHandler = Callable[[TopicPartition, list[Any]], object]
"""Takes one partition's records (``ConsumerRecord``s, in offset order) as they arrive; when it
returns an awaitable, the catch-up waits for it before fetching more (backpressure for a
handler that writes, such as the webhook replay)."""


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """One partition at the moment it was caught up: its position, the records handed
    over until then, and the seconds since the catch-up started."""

    position: int
    records: int
    seconds: float


async def catch_up(
    consumer: AIOKafkaConsumer,
    tps: Sequence[TopicPartition],
    on_batch: BatchHandler,
    *,
    idle_timeout_ms: int = 200,
    max_records: int = 10_000,
    assign: bool = True,
    on_unreadable: OnUnreadable | None = None,
    gaps: GapWatch | None = None,
) -> dict[TopicPartition, CaughtUp]:
    """Assign ``tps`` to the started, group-less ``consumer`` (``assign=False``: the caller
    did, and sought to the beginning), and hand every batch to ``on_batch`` until each
    partition reached its high-water mark. None is paused when complete, so a caller that
    reads on (a tail) sees every record in order. ``gaps``: see ``GapWatch``."""
    started = time.perf_counter()
    skip = on_unreadable or skipping("catch_up", log)
    if assign:
        consumer.assign(list(tps))
        await consumer.seek_to_beginning(*tps)
    counts = dict.fromkeys(tps, 0)
    done: dict[TopicPartition, CaughtUp] = {}
    while len(done) < len(counts):
        chunk = await fetch_records(
            consumer,
            timeout_ms=idle_timeout_ms,
            max_records=max_records,
            on_unreadable=skip,
            owned=tps,
            gaps=gaps,
        )
        for tp, records in chunk.items():
            counts[tp] += len(records)
            handled = on_batch(tp, records)
            if inspect.isawaitable(handled):
                await handled
        for tp in counts.keys() - done.keys():
            high = consumer.highwater(tp)
            if high is None:
                continue  # no fetch response for it yet
            position = await consumer.position(tp)
            if position < high:
                continue
            done[tp] = CaughtUp(position, counts[tp], time.perf_counter() - started)
        await asyncio.sleep(0)
    return {tp: done[tp] for tp in tps}


async def high_water_marks(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition], *, idle_timeout_ms: int = 200
) -> dict[TopicPartition, int]:
    """Where each of ``tps`` ends now: the high-water mark of a fetch response received after
    this call, never ``end_offsets()`` alone (wrong on some brokers, see the module
    docstring). Assigns ``tps`` to the started, group-less ``consumer`` (replacing whatever it
    had) and positions each at ``end_offsets()``, which is exact on Kafka and short of the end
    on such brokers, so a fetch hands over at most a batch that is thrown away."""
    consumer.assign(list(tps))
    for tp, offset in (await consumer.end_offsets(list(tps))).items():
        consumer.seek(tp, offset)
    marks: dict[TopicPartition, int] = {}
    while len(marks) < len(tps):
        await fetch_records(
            consumer, timeout_ms=idle_timeout_ms, max_records=1, on_unreadable=_ignore, owned=tps
        )
        for tp in tps:
            high = consumer.highwater(tp)
            if high is not None and tp not in marks:
                marks[tp] = high
        await asyncio.sleep(0)
    return marks


def _ignore(tp: TopicPartition, offset: int, exc: BaseException) -> None:
    """A record the client cannot parse, fetched while looking for the end: not read here."""
