"""A keyed view of a compacted topic, read by a tail from the beginning, and the writes to it: a
record or a tombstone acknowledged within the outage tolerance, a record read back by the view,
a sweep on an interval, quiet background sends and a bounded stop. What a record means stays
with each view; the records under a key prefix another owner keeps are handed to it
(``ViewPart``), so one tail serves several (docs/architecture.md, "Resource bounds")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable
from typing import Any, Final, TypeVar

from worker.engine.broker_health import BrokerHealth
from worker.engine.tail import TopicTail
from worker.engine.writes import send_retrying
from worker.runtime.logs import get_logger

log = get_logger(__name__)

#: How long a stop waits for its cancelled tasks to end.
STOP_TIMEOUT_S: Final = 5.0
#: How long a ``ViewPart``'s write waits for the broker before its caller fails.
WRITE_TIMEOUT_S: Final = 5.0
R = TypeVar("R")


class Decoding:
    """A record value a view cannot decode is counted and let go."""

    undecodable = 0

    def decoded(self, decode: Callable[[bytes], R], value: bytes) -> R | None:
        try:
            return decode(value)
        except ValueError:  # pydantic's ValidationError is one
            self.undecodable += 1
            return None


class Chores:
    """An owner's background tasks: jobs on an interval and writes nobody waits for. ``stop``
    cancels them all and waits at most ``STOP_TIMEOUT_S``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[object]] = set()
        self._writes: set[asyncio.Task[object]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def _spawn(self, work: Coroutine[Any, Any, object], name: str) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(work, name=f"{self.name}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def every(
        self, interval_s: float, job: Callable[[], Awaitable[object]], *, timeout_s: float
    ) -> None:
        """Run ``job`` every ``interval_s``, the first time after one interval; a failure, or
        a turn past ``timeout_s``, is logged and the next turn tries again."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await asyncio.wait_for(job(), timeout_s)
                except Exception as exc:
                    log.warning("background_job_failed", owner=self.name, error=repr(exc))

        self._spawn(loop(), "every")

    def quietly(self, write: Coroutine[Any, Any, object]) -> None:
        """Run ``write`` aside: its caller has moved on, so a failure is logged, not raised."""
        task = self._spawn(write, "write")
        task.add_done_callback(self._failed)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def settled(self) -> None:
        """Wait for the writes run ``quietly`` so far, however each ends; not for those
        started meanwhile (a busy owner always has one under way). A wait cut short (its
        caller's time-out) leaves them running: ``asyncio.wait``, not ``gather``, which would
        cancel them with it."""
        if self._writes:
            await asyncio.wait(list(self._writes))

    def _failed(self, task: asyncio.Task[object]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.info("background_write_failed", owner=self.name, error=type(exc).__name__)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)


class CompactedView(TopicTail, Decoding):
    """A tail of a one-partition compacted topic applying each record to a keyed view (``take``),
    and the writes to it. ``consumer``: unstarted, group-less (a ``SharedConsumer`` share);
    ``producer``: started. A record under a key prefix in ``takers`` goes to that taker."""

    def __init__(
        self,
        consumer: Any,
        topic: str,
        producer: Any,
        *,
        name: str,
        health: BrokerHealth | None = None,
    ) -> None:
        super().__init__(consumer, topic, name=name)
        self.producer = producer
        self.health = health or BrokerHealth()
        self.chores = Chores(name)
        #: Filled at start-up: one entry per record kind another owner keeps.
        self.takers: dict[bytes, Callable[[Any], None]] = {}
        #: Writes waiting to be read back, by the token their reader names (``read_back``).
        self._reading: dict[Hashable, asyncio.Future[Any]] = {}

    def handle(self, records: list[Any]) -> None:
        for msg in records:
            key = msg.key or b""
            next((t for p, t in self.takers.items() if key.startswith(p)), self.take)(msg)

    def take(self, msg: Any) -> None:
        """Apply one record of the view's own keys (``msg.value`` ``None``: a tombstone)."""

    async def until(self, check: Callable[[], bool], timeout_s: float) -> bool:
        """Whether ``check()`` holds, waiting up to ``timeout_s`` while the view reads on (a
        record another process wrote a moment ago); at once when the tail is not running."""
        if not check() and self.running:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s), self._fetched:
                    await self._fetched.wait_for(check)
        return check()

    def read_back(self, token: Hashable, outcome: Callable[[], object]) -> None:
        """The view read the record ``token`` names: its writer, if it still waits, is told
        ``outcome()``, computed now, in the topic's order."""
        reading = self._reading.pop(token, None)
        if reading is not None and not reading.done():
            reading.set_result(outcome())

    async def send(
        self, key: str | bytes, value: bytes | None, *, timeout_s: float | None = None
    ) -> None:
        """Write ``value`` (``None``: a tombstone) under ``key`` and wait for its acknowledgement,
        sent again after every outage error (``send_retrying``: the process ends past the
        outage tolerance); ``timeout_s`` bounds it for a caller with a deadline."""
        raw = key.encode() if isinstance(key, str) else key
        sent = send_retrying(self.producer, self.health, self.topic, value, key=raw, partition=0)
        await asyncio.wait_for(sent, timeout_s)

    async def tombstone(self, keys: Iterable[str | bytes], timeout_s: float | None = None) -> None:
        for key in keys:
            await self.send(key, None, timeout_s=timeout_s)

    def send_quietly(self, key: str | bytes, value: bytes | None) -> None:
        """``send`` in the background (nobody waits for it); nothing once the view stopped."""
        if self.running:
            self.chores.quietly(self.send(key, value))

    async def send_read_back(
        self, token: Hashable, key: str | bytes, value: bytes, timeout_s: float
    ) -> Any:
        """Write ``value`` and wait until the view reads it back (``read_back(token, ...)``):
        what the view made of it then. Raises on a time-out or a broker failure."""
        reading: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._reading[token] = reading
        try:
            async with asyncio.timeout(timeout_s):
                await self.send(key, value)
                return await reading
        finally:
            self._reading.pop(token, None)

    async def stop(self) -> None:
        await self.chores.stop()
        await super().stop()


class ViewPart(Decoding):
    """The records under ``prefix`` of a ``CompactedView`` another owner keeps (``take``,
    overridden): its writes go through the view (none without one: this process's view
    alone), each bounded by ``write_timeout_s``; ``sweep`` (overridden) runs every
    ``sweep_every_s`` between ``start`` and ``stop``."""

    def __init__(
        self,
        view: CompactedView | None,
        prefix: bytes,
        *,
        name: str,
        sweep_every_s: float,
        write_timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        self.view = view
        if view is not None:
            view.takers[prefix] = self.take
        self.chores = Chores(name)
        self.sweep_every_s = sweep_every_s
        self.write_timeout_s = write_timeout_s

    def take(self, msg: Any) -> None:
        """Apply one record under the prefix, as the view's tail read it."""

    async def sweep(self) -> object:
        """Drop and tombstone what expired."""
        return None

    async def send(self, key: str | bytes, value: bytes | None) -> None:
        if self.view is not None:
            await self.view.send(key, value, timeout_s=self.write_timeout_s)

    async def tombstone(self, keys: Iterable[str | bytes]) -> None:
        if self.view is not None:
            await self.view.tombstone(keys, timeout_s=self.write_timeout_s)

    async def start(self) -> None:
        """Start sweeping (the view is started by its owner)."""
        self.chores.every(self.sweep_every_s, self.sweep, timeout_s=self.sweep_every_s)

    async def stop(self) -> None:
        await self.chores.stop()


__all__ = ["STOP_TIMEOUT_S", "WRITE_TIMEOUT_S", "Chores", "CompactedView", "Decoding", "ViewPart"]
