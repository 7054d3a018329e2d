"""Watermark commits: the offset a partition may commit is the first one not yet finished or
still held (docs/architecture.md, "Watermark commits"); ``hold_record`` lets a handler keep its
record's offset uncommitted past ``handle``."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from aiokafka import TopicPartition


class OffsetTracker:
    """Dispatched offsets of one partition in fetch order; the watermark is the first one not
    yet finished or still held (or one past the last fetched when all are through)."""

    __slots__ = ("_done", "_held", "_order", "committed", "next_offset")

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._done: set[int] = set()
        self._held: dict[int, int] = {}
        self.next_offset: int | None = None
        self.committed: int | None = None

    def dispatched(self, offset: int) -> None:
        self._order.append(offset)
        self.next_offset = offset + 1

    def finished(self, offset: int) -> None:
        self._done.add(offset)
        self._advance()

    def hold(self, offset: int) -> None:
        """Keep ``offset`` unfinished for commits until as many ``release`` calls."""
        self._held[offset] = self._held.get(offset, 0) + 1

    def release(self, offset: int) -> None:
        left = self._held.get(offset, 0) - 1
        if left > 0:
            self._held[offset] = left
            return
        self._held.pop(offset, None)
        self._advance()

    def _advance(self) -> None:
        order, done, held = self._order, self._done, self._held
        while order and order[0] in done and order[0] not in held:
            done.discard(order.popleft())

    def watermark(self) -> int | None:
        return self._order[0] if self._order else self.next_offset

    @property
    def pending(self) -> int:
        return len(self._order)


class Hold:
    """One reason the offset of a handled record may not be committed yet (``hold_record``).
    ``release`` is idempotent; releasing after the partition was revoked does nothing (the
    tracker it held is gone, and the offset was not committed)."""

    __slots__ = ("_tracker", "offset", "on_overdue", "released", "since", "tp")

    def __init__(
        self,
        tracker: OffsetTracker,
        tp: TopicPartition,
        offset: int,
        on_overdue: Callable[[], None] | None,
    ) -> None:
        self._tracker = tracker
        self.tp = tp
        self.offset = offset
        self.on_overdue = on_overdue
        self.since = time.monotonic()
        self.released = False
        tracker.hold(offset)

    def release(self) -> None:
        """Also drops ``on_overdue``, moot now: a callback that refers back to its hold (its
        owner's state does) would otherwise keep both alive until the cyclic collector ran."""
        if not self.released:
            self.released = True
            self.on_overdue = None
            self._tracker.release(self.offset)

    def holds(self, tracker: OffsetTracker | None) -> bool:
        """Whether this hold still pins ``tracker`` (the partition's current one)."""
        return not self.released and tracker is self._tracker


@dataclass(frozen=True, slots=True)
class Handling:
    """The record the current lane task is handling (``hold_record``'s context), and where its
    loop keeps the holds it watches for being overdue."""

    holds: deque[Hold]
    tp: TopicPartition
    tracker: OffsetTracker
    offset: int


HANDLING: ContextVar[Handling | None] = ContextVar("handling", default=None)


def hold_record(on_overdue: Callable[[], None] | None = None) -> Hold | None:
    """A hold on the offset of the record this task handles in ``Handler.handle`` (``None``
    outside the consume loop: make the work durable at once). Until released, it and every
    later offset of its partition stay uncommitted, so a crash replays the record;
    ``on_overdue`` is called once, from the commit tick, past ``LoopConfig.hold_overdue_s``."""
    handling = HANDLING.get()
    if handling is None:
        return None
    hold = Hold(handling.tracker, handling.tp, handling.offset, on_overdue)
    handling.holds.append(hold)
    return hold
