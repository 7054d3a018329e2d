"""Reply correlation: each record of the replica's auth.replies partitions reaches the request
waiting for it, never another's, unbuffered and never missed (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from worker.contract.messages import Reply
from worker.engine.fetch import GAP_HOLD_S, GapWatch, gap_logger
from worker.engine.tail import TopicTail
from worker.runtime.logs import get_logger

log = get_logger(__name__)


class ReplyError(Exception):
    """The reply for a waiting command could not be used (malformed) or the router died."""


@dataclass(frozen=True, slots=True)
class CorrelatedReply:
    """A reply for one command: the validated message and its ``body``'s JSON, the response."""

    reply: Reply
    body: bytes

    @property
    def http_status(self) -> int:
        return self.reply.http_status


_JSON: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
"""``JSONResponse``'s encoding, built once."""
_BODY: Final = b',"body":'


def body_json(value: bytes, obj: dict[str, Any]) -> bytes:
    """The ``body`` of the reply record ``value`` (``obj`` decoded from it), passed through as
    its bytes when the record is laid out as the worker writes it (compact; ``body`` after
    scalar fields and before at most one scalar field), else re-encoded: the response is the
    reply's body unchanged (docs/architecture.md, "The picture")."""
    keys = list(obj)
    at = keys.index("body")
    before, after = keys[:at], keys[at + 1 :]
    if (
        before
        and len(after) <= 1
        and value.count(_BODY) == 1  # a second "body" (a repeated key) is not cut out
        and not any(isinstance(obj[k], dict | list) for k in (*before, *after))
    ):
        start = value.find(_BODY) + len(_BODY)
        tail = (
            b"}"
            if not after
            else b",%s:%s}"
            % (_JSON.encode(after[0]).encode(), _JSON.encode(obj[after[0]]).encode())
        )
        if start >= len(_BODY) and value.endswith(tail) and len(value) - len(tail) > start:
            return value[start : len(value) - len(tail)]
    return _JSON.encode(obj["body"]).encode()


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

    def __exit__(self, *_: object) -> None:
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
        """The reply, or ``None`` once ``limit`` (the caller's active deadline) expired: the
        caller's one timer serves, none of its own; the waiter is done with then."""
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


class ReplyRouter(TopicTail):
    """Correlates auth.replies with waiting requests, on an unstarted group-less ``consumer``
    it starts and closes; ``ready`` once the replies present at start-up were skipped."""

    def __init__(
        self,
        consumer: Any,
        topic: str,
        *,
        partition: int | None = None,
        spread: int = 1,
        behind_after_s: float = 5.0,
        gap_hold_s: float = GAP_HOLD_S,
    ) -> None:
        super().__init__(
            consumer,
            topic,
            name="reply-router",
            only=self._pick,
            gaps=(
                GapWatch(gap_logger(log, "reply-router"), hold_s=gap_hold_s)
                if gap_hold_s > 0
                else None
            ),
        )
        self.behind_after_s = behind_after_s
        self._next_offset: dict[Any, int] = {}
        self._spread = max(1, spread)
        self._lagging_since: float | None = None
        self._reported_behind = False
        self._wanted = partition
        self._rng = random.SystemRandom()
        self._waiters: dict[str, PendingReply] = {}

    def _pick(self, partitions: list[int]) -> list[int]:
        """The partitions this replica reads: ``spread`` consecutive ones (wrapping) from the
        configured one, or from one at random (a fresh pick per process; see
        docs/architecture.md, "Replies to the waiting replica")."""
        if self._wanted is None:
            first = self._rng.randrange(len(partitions))
        elif self._wanted in partitions:
            first = partitions.index(self._wanted)
        else:
            raise ValueError(
                f"API_REPLY_PARTITION={self._wanted}, but {self.topic} has partitions "
                f"{partitions[0]}..{partitions[-1]}"
            )
        count = min(self._spread, len(partitions))
        return [partitions[(first + k) % len(partitions)] for k in range(count)]

    @property
    def partition(self) -> int:
        """The first partition this replica reads (once started)."""
        partition: int = self.partitions[0].partition
        return partition

    @property
    def ready(self) -> bool:
        return self.caught_up and self.running

    @property
    def lag(self) -> int:
        """Replies on the partitions not read yet, as of the last fetch response."""
        behind = 0
        for tp, next_offset in self._next_offset.items():
            high: int | None = self.consumer.highwater(tp)
            if high is not None:
                behind += max(0, high - next_offset)
        return behind

    @property
    def keeping_up(self) -> bool:
        """False while the reader is behind: no fetch came back for ``behind_after_s``, or
        the partition had unread replies for that long without a break. A reply read late
        finds its request gone (answered 500 at its time-out), so readiness says so."""
        now = time.monotonic()
        if now - self.last_fetch > self.behind_after_s:
            return False
        since = self._lagging_since
        return since is None or now - since <= self.behind_after_s

    def state(self) -> dict[str, Any]:
        """Where the reader is, for the log line of a reply that did not come in time."""
        return {
            "reply_partitions": [tp.partition for tp in self._tps],
            "reply_read_to": {tp.partition: at for tp, at in self._next_offset.items()},
            "reply_lag": self.lag,
            "reply_fetch_age_s": round(time.monotonic() - self.last_fetch, 3),
            "reply_gaps_passed": self.gaps.given_up if self.gaps else 0,
        }

    def _take(self, tp: Any, records: list[Any]) -> None:
        if records:
            self._next_offset[tp] = records[-1].offset + 1
        super()._take(tp, records)

    def after_fetch(self) -> None:
        """Track how long the partition has had unread replies; log when it becomes behind
        and when it is back."""
        if self.lag == 0:
            self._lagging_since = None
        elif self._lagging_since is None:
            self._lagging_since = time.monotonic()
        keeping_up = self.keeping_up
        if keeping_up == self._reported_behind:
            self._reported_behind = not keeping_up
            event = "reply_reader_back" if keeping_up else "reply_reader_behind"
            log.warning(event, **self.state())

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
                log.error(
                    "reply_invalid",
                    command_id=command_id,
                    partition=msg.partition,
                    offset=msg.offset,
                    error=str(exc.errors(include_url=False, include_input=False)[0]["msg"]),
                )
                waiter._fail(ReplyError("the worker's reply could not be decoded"))
                continue
            waiter._deliver(CorrelatedReply(reply, body_json(msg.value, obj)))

    def on_failure(self, exc: BaseException) -> None:
        for waiter in list(self._waiters.values()):
            waiter._fail(ReplyError(f"reply consumer stopped: {exc!r}"))
