"""The consume loop both floors share (``bench.floor``, ``bench.webhook_floor``): fetch a batch,
hand it to ``handle`` as a task, commit each batch's offsets once its task is done, in order,
with at most ``limit`` records in flight. What a minimal service does between fetch and commit,
and nothing more."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from aiokafka import TopicPartition

Batch = dict[TopicPartition, list[Any]]


async def consume_in_batches(
    consumer: Any,
    handle: Callable[[Batch], Coroutine[Any, Any, None]],
    *,
    limit: int,
    max_records: int,
    stop: asyncio.Event,
) -> None:
    """Run until ``stop``; prints ``assigned N`` once the group gave partitions (the bench
    waits for that line). Tasks still pending at the end are cancelled."""
    pending: deque[tuple[asyncio.Task[None], dict[TopicPartition, int], int]] = deque()
    in_flight = 0
    announced = False
    try:
        while not stop.is_set():
            while pending and (pending[0][0].done() or in_flight >= limit):
                task, offsets, n = pending.popleft()
                await task
                in_flight -= n
                await consumer.commit(offsets)
            batch = await consumer.getmany(timeout_ms=100, max_records=max_records)
            if not announced and consumer.assignment():
                print(f"assigned {len(consumer.assignment())}", flush=True)
                announced = True
            if not batch:
                continue
            n = sum(len(records) for records in batch.values())
            offsets = {tp: records[-1].offset + 1 for tp, records in batch.items()}
            pending.append((asyncio.create_task(handle(batch)), offsets, n))
            in_flight += n
    finally:
        for task, _, _ in pending:
            task.cancel()
        await asyncio.gather(*(t for t, _, _ in pending), return_exceptions=True)
