"""Group-less tailing of every partition of one topic, from the beginning, with catch-up (the
front-end's reply router, the endpoints registry). Assigned, not subscribed: each process sees
every record and never rebalances; caught up once every partition reached the end it had at
the start, by ``worker.engine.catch_up``'s rule."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from worker.engine.catch_up import catch_up
from worker.engine.fetch import GapWatch, skipping
from worker.engine.fetch import getmany as fetch_records
from worker.runtime.logs import get_logger

log = get_logger(__name__)

#: A tail's fetch: its wait for records (ms) and the most records it takes
#: (``SHARED_MAX_RECORDS``: a shared consumer's, which serves several tails).
IDLE_TIMEOUT_MS: Final = 200
MAX_RECORDS: Final = 2000
SHARED_MAX_RECORDS: Final = 5000


async def partitions_of(
    consumer: Any, topic: str, *, deadline: float, pause_s: float = 0.1
) -> set[int]:
    """The partition numbers of ``topic`` as the started, group-less ``consumer`` learns them
    by ``deadline`` (monotonic); empty if it has not. aiokafka has no public metadata refresh:
    ``topics()`` says whether the topic exists (naming a missing topic may have the broker
    create it), then the first offset of its partition 0 makes the consumer fetch the topic's
    metadata. A missing topic is looked for again, ``pause_s`` apart."""
    probe = [TopicPartition(topic, 0)]
    while True:
        parts: set[int] | None = consumer.partitions_for_topic(topic)
        remaining = deadline - time.monotonic()
        if parts or remaining <= 0:
            return set(parts or ())
        try:
            async with asyncio.timeout(remaining):
                if topic in await consumer.topics():
                    await consumer.beginning_offsets(probe)
        except (TimeoutError, KafkaError):
            pass  # the broker failed a lookup: looked for again until the deadline
        if not consumer.partitions_for_topic(topic):
            await asyncio.sleep(pause_s)


async def assign_all(
    consumer: Any,
    topic: str,
    *,
    timeout_s: float = 30.0,
    only: Callable[[list[int]], list[int]] | None = None,
) -> list[TopicPartition]:
    """Assign every partition of ``topic`` (or those ``only`` picks from them) to the started,
    group-less ``consumer``, at the beginning."""
    parts = await partitions_of(consumer, topic, deadline=time.monotonic() + timeout_s)
    if not parts:
        raise RuntimeError(f"topic {topic!r} has no partitions after {timeout_s}s")
    numbers = sorted(parts)
    tps = [TopicPartition(topic, p) for p in (only(numbers) if only else numbers)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return tps


class TopicTail:
    """Reads one topic from the beginning, forever, handing each batch to ``handle``. Owns
    ``consumer`` (unstarted, group-less). ``caught_up`` turns true once every partition reached
    the end it had at the start; a failed loop keeps its error in ``failure`` and stops
    ``running``."""

    def __init__(
        self,
        consumer: Any,
        topic: str,
        *,
        name: str,
        only: Callable[[list[int]], list[int]] | None = None,
        gaps: GapWatch | None = None,
    ) -> None:
        self.consumer = consumer
        self.topic = topic
        self._only = only
        #: For a topic whose offsets are dense: no record handed out past one never seen.
        self.gaps = gaps
        #: When the loop last came back from a fetch (monotonic): a reader that stopped
        #: fetching is behind however small its lag looks.
        self.last_fetch = time.monotonic()
        self.name = name
        self._caught_up = asyncio.Event()
        #: Notified after every fetch the loop handled (``read_to_end`` waits on it).
        self._fetched = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._tps: list[TopicPartition] = []
        self.failure: BaseException | None = None
        self.records = 0
        #: Records ``handle`` raised on, skipped (``passkey_*_tail_records_skipped_total``).
        self.skipped = 0

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

    async def read_to_end(self, timeout: float) -> bool:
        """True once the tail has handled every record its topic held when this was called
        (each partition's position at the end ``end_offsets`` names now); false when
        ``timeout`` passed first or the loop died. For a reader that meets a key this tail
        has not applied yet, but whose record was written before the one it is reading:
        another consumer's fetch can run ahead of this tail's. Needs the tail's own consumer
        (``end_offsets``: one request; on some brokers it names the last batch's first
        offset + 1, so a record later in a batch of several may not be waited for)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not await self.wait_caught_up(timeout):
            return False
        try:  # within what is left of ``timeout``, not a second one
            ends = await asyncio.wait_for(
                self.consumer.end_offsets(list(self._tps)), max(0.0, deadline - loop.time())
            )
        except TimeoutError:
            return False
        async with self._fetched:
            while True:
                for tp, end in ends.items():
                    if await self.consumer.position(tp) < end:
                        break
                else:
                    return True
                left = deadline - loop.time()
                if left <= 0 or not self.running:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._fetched.wait(), left)

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

    def after_fetch(self) -> None:
        """Called after each fetch once caught up, its records handled. Overridden by
        subclasses."""

    def _count_skip(self) -> None:
        self.skipped += 1

    def _take(self, tp: TopicPartition, records: list[Any]) -> None:
        """Hand a batch to ``handle``; a record that makes it raise is skipped, never fatal.

        A read model keeps the last record per key, so applying the batch again record by
        record, after a failure part-way, changes nothing for the records already applied.
        """
        self.records += len(records)
        try:
            self.handle(records)
        except Exception:
            for record in records:
                try:
                    self.handle([record])
                except Exception as exc:
                    self.skipped += 1
                    log.error(
                        "tail_record_skipped",
                        tail=self.name,
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=getattr(record, "offset", None),
                        error=type(exc).__name__,
                    )

    async def _run(self) -> None:
        started = time.perf_counter()
        skip = skipping(self.name, log, self._count_skip)
        try:
            await catch_up(
                self.consumer,
                self._tps,
                self._take,
                idle_timeout_ms=IDLE_TIMEOUT_MS,
                max_records=MAX_RECORDS,
                assign=False,  # start() did
                on_unreadable=skip,
                gaps=self.gaps,
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
                batch = await fetch_records(
                    self.consumer,
                    timeout_ms=IDLE_TIMEOUT_MS,
                    max_records=MAX_RECORDS,
                    on_unreadable=skip,
                    owned=self._tps,
                    gaps=self.gaps,
                )
                self.last_fetch = time.monotonic()
                for tp, records in batch.items():
                    self._take(tp, records)
                self.after_fetch()
                async with self._fetched:
                    self._fetched.notify_all()
                await asyncio.sleep(0)
        except Exception as exc:
            self.failure = exc
            log.error("tail_failed", tail=self.name, topic=self.topic, error=repr(exc))
            self.on_failure(exc)
            raise


class SharedConsumer:
    """One group-less consumer, and so one fetch loop, under several tails: each tail reads a
    ``share()`` (its partitions, handed their records by the one fetch task) instead of a
    consumer of its own, which would be a fetch request per ``fetch_max_wait_ms`` even idle.
    ``consumer`` is unstarted: the first share's ``start`` starts it, the last one's ``stop``
    closes it; a fetch failure fails every share's ``getmany``."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self._owner: dict[TopicPartition, ConsumerShare] = {}
        self._lock = asyncio.Lock()
        self._users = 0
        self._started = False
        self._task: asyncio.Task[None] | None = None

    def share(self) -> ConsumerShare:
        return ConsumerShare(self)

    async def _start(self) -> None:
        self._users += 1
        if not self._started:
            self._started = True
            await self.consumer.start()

    async def _stop(self, share: ConsumerShare) -> None:
        self._owner = {tp: s for tp, s in self._owner.items() if s is not share}
        self._users -= 1
        if self._users > 0:
            return
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.consumer.stop()

    async def _assign(self, share: ConsumerShare, tps: Sequence[TopicPartition]) -> None:
        """Add ``tps`` (at the beginning) to the assignment, the others kept where they are
        (``assign`` replaces the whole assignment and forgets positions)."""
        async with self._lock:
            kept = {tp: await self.consumer.position(tp) for tp in self._owner}
            for tp in tps:
                self._owner[tp] = share
            self.consumer.assign(list(self._owner))
            for tp, offset in kept.items():
                self.consumer.seek(tp, offset)
            await self.consumer.seek_to_beginning(*tps)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="shared-consumer")

    async def _run(self) -> None:
        skip = skipping("shared-consumer", log)
        try:
            while True:
                async with self._lock:
                    batch = await fetch_records(
                        self.consumer,
                        timeout_ms=IDLE_TIMEOUT_MS,
                        max_records=SHARED_MAX_RECORDS,
                        on_unreadable=skip,
                    )
                for tp, records in batch.items():
                    share = self._owner.get(tp)
                    if share is not None:
                        share._put(tp, records)
                await asyncio.sleep(0)
        except Exception as exc:
            for share in set(self._owner.values()):
                share._fail(exc)
            raise


class ConsumerShare:
    """The part of a ``SharedConsumer`` one tail reads: the consumer calls ``TopicTail`` and
    ``catch_up`` make, answered from the shared fetch loop."""

    def __init__(self, hub: SharedConsumer) -> None:
        self._hub = hub
        self._pending: dict[TopicPartition, list[Any]] = {}
        self._arrived = asyncio.Event()
        self._failure: BaseException | None = None
        self._tps: list[TopicPartition] = []

    async def start(self) -> None:
        await self._hub._start()

    async def stop(self) -> None:
        await self._hub._stop(self)

    def partitions_for_topic(self, topic: str) -> Any:
        return self._hub.consumer.partitions_for_topic(topic)

    async def topics(self) -> Any:
        """As the consumer's (``partitions_of`` asks it, then ``beginning_offsets``)."""
        return await self._hub.consumer.topics()

    async def beginning_offsets(self, tps: list[TopicPartition]) -> Any:
        return await self._hub.consumer.beginning_offsets(tps)

    def assign(self, tps: list[TopicPartition]) -> None:
        self._tps = list(tps)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self._hub._assign(self, tps or self._tps)

    def highwater(self, tp: TopicPartition) -> Any:
        return self._hub.consumer.highwater(tp)

    async def position(self, tp: TopicPartition) -> Any:
        """The offset of the next record this share hands over (records fetched but not yet
        taken count as unread)."""
        queued = self._pending.get(tp)
        return queued[0].offset if queued else await self._hub.consumer.position(tp)

    async def getmany(self, *, timeout_ms: int, max_records: int | None = None) -> Any:
        """Every record fetched for this share since the last call (``max_records`` is the
        shared loop's); waits up to ``timeout_ms`` for some."""
        if not self._arrived.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout_ms / 1000)
        if self._failure is not None:
            raise self._failure
        self._arrived.clear()
        batch, self._pending = self._pending, {}
        return batch

    def _put(self, tp: TopicPartition, records: list[Any]) -> None:
        self._pending.setdefault(tp, []).extend(records)
        self._arrived.set()

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._arrived.set()
