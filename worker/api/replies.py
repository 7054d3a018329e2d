"""Reply correlation: matches records on the replica's partition of auth.replies to the
requests waiting for them, never another request's, without buffering, and without missing
one (docs/architecture.md, "Replies to the waiting replica")."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from worker.contract.messages import Reply
from worker.engine.tail import TopicTail
from worker.runtime.logs import get_logger

log = get_logger(__name__)


class ReplyError(Exception):
    """The reply for a waiting command could not be used (malformed) or the router died."""


@dataclass(frozen=True, slots=True)
class CorrelatedReply:
    """A reply for one command: the validated message and its ``body`` exactly as received."""

    reply: Reply
    body: dict[str, Any]

    @property
    def http_status(self) -> int:
        return self.reply.http_status


class PendingReply:
    """The waiter of one command; a context manager that always unregisters itself."""

    __slots__ = ("_future", "_router", "command_id", "request_id")

    def __init__(self, router: ReplyRouter, command_id: str, request_id: str) -> None:
        self._router = router
        self.command_id = command_id
        self.request_id = request_id
        self._future: asyncio.Future[CorrelatedReply] = asyncio.get_running_loop().create_future()

    def __enter__(self) -> PendingReply:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._router._discard(self)
        if not self._future.done():
            self._future.cancel()

    @property
    def done(self) -> bool:
        return self._future.done()

    def _deliver(self, reply: CorrelatedReply) -> None:
        if not self._future.done():
            self._future.set_result(reply)

    def _fail(self, exc: BaseException) -> None:
        if not self._future.done():
            self._future.set_exception(exc)

    async def until(self, limit: asyncio.Timeout) -> CorrelatedReply | None:
        """The reply, or ``None`` once ``limit`` (the caller's active deadline on this task)
        expired: the caller's one timer serves, none of its own, and the waiter is done with
        then (unlike ``wait``, which can be called again). Raises ``ReplyError`` as ``wait``
        does; another cancellation propagates."""
        future = self._future
        try:
            return await future
        except asyncio.CancelledError:
            if not limit.expired():
                raise
        # The reply may have come in the same turn as the deadline.
        if future.done() and not future.cancelled():
            return future.result()
        return None

    async def wait(self, timeout: float) -> CorrelatedReply | None:
        """The reply, or ``None`` when ``timeout`` seconds passed first.

        Raises ``ReplyError`` when the reply was malformed or the router stopped.
        """
        try:
            return await asyncio.wait_for(asyncio.shield(self._future), timeout=max(timeout, 0))
        except TimeoutError:
            return None


class ReplyRouter(TopicTail):
    """Correlates auth.replies with waiting requests (see the module docstring).

    ``consumer`` is an unstarted, group-less consumer (``build_consumer(settings)``); the
    router starts and closes it. ``ready`` is true once the replies present at start-up were
    skipped and while the loop runs.
    """

    def __init__(
        self,
        consumer: Any,
        topic: str,
        *,
        idle_timeout_ms: int = 200,
        max_records: int = 2000,
        partition: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(
            consumer,
            topic,
            name="reply-router",
            idle_timeout_ms=idle_timeout_ms,
            max_records=max_records,
            only=self._pick,
        )
        self._wanted = partition
        self._rng = rng or random.SystemRandom()
        self._waiters: dict[str, PendingReply] = {}
        self.delivered = 0
        self.dropped_mismatch = 0
        self.dropped_invalid = 0

    def _pick(self, partitions: list[int]) -> list[int]:
        """The one partition this replica reads: the configured one, or one at random (a
        fresh pick per process; see docs/architecture.md, "Replies to the waiting
        replica")."""
        if self._wanted is None:
            return [self._rng.choice(partitions)]
        if self._wanted not in partitions:
            raise ValueError(
                f"API_REPLY_PARTITION={self._wanted}, but {self.topic} has partitions "
                f"{partitions[0]}..{partitions[-1]}"
            )
        return [self._wanted]

    @property
    def partition(self) -> int:
        """The partition replies to this replica's commands go to (once started)."""
        partition: int = self.partitions[0].partition
        return partition

    @property
    def ready(self) -> bool:
        return self.caught_up and self.running

    @property
    def pending(self) -> int:
        """Requests currently waiting (registered and not yet left their ``with`` block)."""
        return len(self._waiters)

    def expect(self, command_id: str, request_id: str) -> PendingReply:
        """Register a waiter *before* producing the command; use it as a context manager."""
        if self.failure is not None:
            raise ReplyError(f"reply consumer stopped: {self.failure!r}")
        if command_id in self._waiters:
            raise ValueError(f"command {command_id} already has a waiter")
        waiter = PendingReply(self, command_id, request_id)
        self._waiters[command_id] = waiter
        return waiter

    def _discard(self, waiter: PendingReply) -> None:
        if self._waiters.get(waiter.command_id) is waiter:
            del self._waiters[waiter.command_id]

    def handle(self, records: list[Any]) -> None:
        if not self._waiters:
            return
        for msg in records:
            if msg.value is None:
                continue
            try:
                obj = json.loads(msg.value)
            except (ValueError, RecursionError):
                continue
            if not isinstance(obj, dict):
                continue
            command_id = obj.get("command_id")
            waiter = self._waiters.get(command_id) if isinstance(command_id, str) else None
            if waiter is None or waiter.done:
                continue
            if obj.get("request_id") != waiter.request_id:
                self.dropped_mismatch += 1
                log.warning(
                    "reply_request_id_mismatch",
                    command_id=command_id,
                    partition=msg.partition,
                    offset=msg.offset,
                )
                continue
            try:
                reply = Reply.model_validate(obj)
            except ValidationError as exc:
                self.dropped_invalid += 1
                log.error(
                    "reply_invalid",
                    command_id=command_id,
                    partition=msg.partition,
                    offset=msg.offset,
                    error=str(exc.errors(include_url=False, include_input=False)[0]["msg"]),
                )
                waiter._fail(ReplyError("the worker's reply could not be decoded"))
                continue
            self.delivered += 1
            waiter._deliver(CorrelatedReply(reply, dict(obj["body"])))

    def on_failure(self, exc: BaseException) -> None:
        for waiter in list(self._waiters.values()):
            waiter._fail(ReplyError(f"reply consumer stopped: {exc!r}"))
