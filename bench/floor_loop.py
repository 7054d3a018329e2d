"""The consume loop both floors share (``bench.floor``, ``bench.webhook_floor``): fetch a batch,
hand it to ``handle`` as a task, commit the offsets of the batches done (in fetch order) at the
processes' cadence (``WORKER_COMMIT_INTERVAL_MS``, which the worker and the dispatcher both
commit at), with at most ``limit`` records in flight. What a minimal service does between fetch
and commit, and nothing more."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from worker.engine.kafka import build_consumer, build_producer
from worker.settings import Settings

#: One fetch's records by partition, as every contender on this loop is handed them.
Batch = dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]


async def consume_in_batches(
    consumer: Any,
    handle: Callable[[Batch], Coroutine[Any, Any, None]],
    *,
    limit: int,
    max_records: int,
    stop: asyncio.Event,
    commit_interval_s: float,
) -> None:
    """Run until ``stop``; prints ``assigned N`` once the group gave partitions (the bench
    waits for that line). Offsets of finished batches are committed together once
    ``commit_interval_s`` passed since the last commit, as the processes do (not per batch).
    Tasks still pending at the end are cancelled."""
    pending: deque[tuple[asyncio.Task[None], dict[TopicPartition, int], int]] = deque()
    done: dict[TopicPartition, int] = {}
    in_flight = 0
    announced = False
    last_commit = time.monotonic()
    try:
        while not stop.is_set():
            while pending and (pending[0][0].done() or in_flight >= limit):
                task, offsets, n = pending.popleft()
                await task
                in_flight -= n
                done.update(offsets)
            if done and time.monotonic() - last_commit >= commit_interval_s:
                await consumer.commit(done)
                done = {}
                last_commit = time.monotonic()
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


def group_clients(settings: Settings, topic: str, group_id: str) -> tuple[Any, Any]:
    """A producer and a consumer of ``topic`` in ``group_id``, built as the process they stand
    beside builds its own (``worker.engine.kafka``); started by ``serve_batches``."""
    kafka = settings.kafka_config()
    producer = build_producer(kafka)
    consumer = build_consumer(
        kafka,
        topic,
        group_id=group_id,
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=settings.kafka_heartbeat_interval_ms,
    )
    return producer, consumer


async def serve_batches(
    producer: Any,
    consumer: Any,
    handle: Callable[[Batch], Coroutine[Any, Any, None]],
    *,
    limit: int,
    max_records: int,
    stop: asyncio.Event,
    commit_interval_s: float,
) -> None:
    """Start both clients, ``consume_in_batches`` until ``stop``, stop both."""
    await producer.start()
    await consumer.start()
    try:
        await consume_in_batches(
            consumer,
            handle,
            limit=limit,
            max_records=max_records,
            stop=stop,
            commit_interval_s=commit_interval_s,
        )
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        await producer.stop()
