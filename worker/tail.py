"""Group-less tailing of every partition of one topic, from the beginning, with catch-up.

The front-end's read models (``ReplyRouter`` on auth.replies, ``AuthStateView`` on
auth.state, the delivery log) and the webhook-endpoints registry of every front-end and
dispatcher are each one process-local consumer without a consumer group: it is *assigned*
every partition, so each process sees every record and never rebalances.

Where the end is. A tail starts at the beginning of each partition and is *caught up* once
``worker.replay`` read every partition to its high-water mark (the rule the state store's
restore uses too; that module says why ``end_offsets()`` and ``seek_to_end()`` are not used).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import TopicPartition

from worker.logs import get_logger
from worker.replay import replay_to_highwater

log = get_logger(__name__)


async def assign_all(
    consumer: Any,
    topic: str,
    *,
    timeout_s: float = 30.0,
    only: Callable[[list[int]], list[int]] | None = None,
) -> list[TopicPartition]:
    """Assign every partition of ``topic`` (or those ``only`` picks from them) to the started,
    group-less ``consumer``, at the beginning."""
    deadline = time.monotonic() + timeout_s
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic!r} has no partitions after {timeout_s}s")
        # A consumer without a subscription has no metadata yet; aiokafka has no public call
        # that refreshes it, so ask the client (an empty topic set means "all topics").
        await consumer._client.force_metadata_update()
        if not consumer.partitions_for_topic(topic):
            await asyncio.sleep(0.1)
    numbers = sorted(parts)
    tps = [TopicPartition(topic, p) for p in (only(numbers) if only else numbers)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return tps


class TopicTail:
    """Reads one topic from the beginning, forever, handing each batch to ``handle``.

    Owns ``consumer`` (an unstarted, group-less ``AIOKafkaConsumer``): ``start`` starts it and
    ``stop`` closes it. ``caught_up`` becomes true once every partition reached the end it had
    when the tail started (see the module docstring) and stays true. If the loop fails, the
    failure is kept in ``failure``, ``running`` turns false and the task ends with the error.
    """

    def __init__(
        self,
        consumer: Any,
        topic: str,
        *,
        name: str,
        idle_timeout_ms: int = 200,
        max_records: int = 2000,
        only: Callable[[list[int]], list[int]] | None = None,
    ) -> None:
        self.consumer = consumer
        self.topic = topic
        self._only = only
        self.name = name
        self._idle_timeout_ms = idle_timeout_ms
        self._max_records = max_records
        self._caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tps: list[TopicPartition] = []
        self.failure: BaseException | None = None
        self.records = 0

    @property
    def partitions(self) -> Sequence[TopicPartition]:
        return tuple(self._tps)

    @property
    def task(self) -> asyncio.Task[None]:
        if self._task is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    async def wait_caught_up(self, timeout: float | None = None) -> bool:
        """True once caught up; false when ``timeout`` passed first or the loop died."""
        if self._caught_up.is_set():
            return self.running
        waiter = asyncio.ensure_future(self._caught_up.wait())
        try:
            pending = [waiter] + ([self._task] if self._task is not None else [])
            await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return self._caught_up.is_set() and self.running

    async def start(self) -> None:
        await self.consumer.start()
        self._tps = await assign_all(self.consumer, self.topic, only=self._only)
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.consumer.stop()

    def handle(self, records: list[Any]) -> None:
        """Apply one partition's batch (in offset order). Overridden by subclasses."""

    def on_failure(self, exc: BaseException) -> None:
        """Called once when the loop dies. Overridden by subclasses."""

    def _take(self, tp: TopicPartition, records: list[Any]) -> None:
        self.records += len(records)
        self.handle(records)

    async def _run(self) -> None:
        started = time.perf_counter()
        try:
            await replay_to_highwater(
                self.consumer,
                self._tps,
                self._take,
                idle_timeout_ms=self._idle_timeout_ms,
                max_records=self._max_records,
                assign=False,  # start() did
            )
            self._caught_up.set()
            log.info(
                "tail_caught_up",
                tail=self.name,
                topic=self.topic,
                partitions=len(self._tps),
                records=self.records,
                seconds=round(time.perf_counter() - started, 4),
            )
            while True:
                batch = await self.consumer.getmany(
                    timeout_ms=self._idle_timeout_ms, max_records=self._max_records
                )
                for tp, records in batch.items():
                    self._take(tp, records)
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failure = exc
            log.error("tail_failed", tail=self.name, topic=self.topic, error=repr(exc))
            self.on_failure(exc)
            raise
