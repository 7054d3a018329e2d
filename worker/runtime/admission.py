"""One admission rule for every shared slot (docs/architecture.md, "Admission"): an owner holds at
most ``per_owner`` of a pool, a slot beyond its first only while ``reserve`` stay free for owners
holding none; time spent in a slot is charged to the owner (``TimeCharge``). Refusal is
immediate (``NoRoom``): nothing here waits, so no remote party waits for our slot."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_OWNERS", "Admission", "NoRoom", "Share", "Slot", "TimeCharge"]

#: Owners whose slot-seconds are remembered (held slots or unpaid time); past it the least
#: recently charged owner with no slot held is forgotten, its debt with it.
MAX_OWNERS: Final = 10_000


class NoRoom(Exception):
    """No slot for this owner now: ``retry_after_s`` (≥ 1, whole seconds) says when to ask
    again, ``reason`` whether the pool (``full``), the owner's share (``share``) or its time
    (``time``) stood in the way."""

    def __init__(self, pool: str, reason: str, retry_after_s: int) -> None:
        super().__init__(f"{pool}: no room ({reason}); retry after {retry_after_s} s")
        self.pool = pool
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Share:
    """The rule's numbers for one pool: ``capacity`` slots, at most ``per_owner`` for one
    owner, ``reserve`` kept for owners that hold none."""

    capacity: int
    per_owner: int
    reserve: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.per_owner < 1 or self.reserve < 0:
            raise ValueError("capacity and per_owner must be ≥ 1, reserve ≥ 0")
        if self.per_owner > self.capacity or self.reserve >= self.capacity:
            raise ValueError("per_owner must be ≤ capacity and reserve < capacity")

    @classmethod
    def split(cls, capacity: int, *, owners: int) -> Share:
        """``capacity`` split so that ``owners`` owners at their share leave a quarter of it
        (at least one slot) to everyone else: ``per_owner`` = ¾ capacity ÷ owners."""
        reserve = _quarter(capacity)
        per_owner = max(1, (capacity - reserve) // max(1, owners))
        return cls(capacity=capacity, per_owner=per_owner, reserve=reserve)

    @classmethod
    def capped(cls, capacity: int, per_owner: int) -> Share:
        """``per_owner`` (at most ``capacity``) for each owner, and a quarter of ``capacity``
        (at least one slot, none of a single one) kept for owners holding none."""
        return cls(
            capacity=capacity, per_owner=min(per_owner, capacity), reserve=_quarter(capacity)
        )

    def admits(self, held: int, in_use: int) -> bool:
        """Whether an owner holding ``held`` of the ``in_use`` slots may take one more."""
        if in_use >= self.capacity or held >= self.per_owner:
            return False
        return held == 0 or self.above_reserve(in_use) >= 1

    def room(self, held: int, in_use: int) -> int:
        """How many more slots one owner holding ``held`` of the ``in_use`` may take, one
        after another as ``admits`` says (its first, holding none, may be the reserve's)."""
        if not self.admits(held, in_use):
            return 0
        if held == 0:
            return 1 + min(self.per_owner - 1, self.above_reserve(in_use + 1))
        return min(self.per_owner - held, self.above_reserve(in_use))

    def above_reserve(self, in_use: int) -> int:
        """Slots owners already holding some may still take, all together: those above the
        reserve."""
        return max(0, self.capacity - self.reserve - in_use)

    def refusal(self, held: int, in_use: int) -> str | None:
        """Why ``admits`` says no (``full`` or ``share``), None when it says yes."""
        if self.admits(held, in_use):
            return None
        return "full" if in_use >= self.capacity or held == 0 else "share"


@dataclass(frozen=True, slots=True)
class TimeCharge:
    """Slot-seconds an owner may spend: ``rate`` per second of wall time, ``burst_s`` at most
    saved up. An owner that holds a slot continuously spends 1 per second."""

    rate: float
    burst_s: float

    def __post_init__(self) -> None:
        if not (self.rate > 0 and self.burst_s > 0):
            raise ValueError("rate and burst_s must be > 0")


class _Owner:
    __slots__ = ("at", "balance", "held")

    def __init__(self, balance: float, at: float) -> None:
        self.held = 0
        self.balance = balance
        self.at = at


class Slot:
    """One slot held by ``owner``: give it back with ``release`` (idempotent) or by leaving
    its ``with`` block; the seconds it was held are charged then."""

    __slots__ = ("_admission", "_released", "owner", "taken_at")

    def __init__(self, admission: Admission, owner: str, taken_at: float) -> None:
        self._admission = admission
        self.owner = owner
        self.taken_at = taken_at
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._give_back(self)

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Admission:
    """A pool of slots under ``share`` (and ``time`` where slots are spent in time). Not
    thread-safe: a pool used from threads is guarded by its owner's lock.

    ``retry_after_s`` is the hint for a full pool or a full share (how long a slot is usually
    held); for an owner in debt it is the time to repay. ``refused`` counts refusals by
    reason, for the owner's metrics."""

    def __init__(
        self,
        name: str,
        share: Share,
        *,
        time: TimeCharge | None = None,
        retry_after_s: float = 1.0,
        max_owners: int = MAX_OWNERS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.share = share
        self.time = time
        self.retry_after_s = retry_after_s
        self._max_owners = max_owners
        self._clock = clock or _monotonic
        self._owners: OrderedDict[str, _Owner] = OrderedDict()
        self.in_use = 0
        self.refused: dict[str, int] = {"full": 0, "share": 0, "time": 0}

    def held(self, owner: str) -> int:
        """Slots ``owner`` holds now."""
        entry = self._owners.get(owner)
        return entry.held if entry is not None else 0

    @property
    def owners(self) -> int:
        """Owners remembered: holding a slot or with time not yet repaid."""
        return len(self._owners)

    def take(self, owner: str) -> Slot:
        """A slot for ``owner`` now, or ``NoRoom``."""
        now = self._clock()
        entry = self._entry(owner, now)
        held = entry.held if entry is not None else 0
        reason = self.share.refusal(held, self.in_use)
        if reason is None and entry is not None and self.time is not None and entry.balance <= 0:
            reason = "time"
        if reason is not None:
            self.refused[reason] += 1
            raise NoRoom(self.name, reason, self._hint(reason, entry))
        if entry is None:
            entry = self._remember(owner, now)
        entry.held += 1
        self.in_use += 1
        return Slot(self, owner, now)

    def _give_back(self, slot: Slot) -> None:
        now = self._clock()
        self.in_use -= 1
        entry = self._owners.get(slot.owner)
        if entry is None:  # pragma: no cover - an owner with a slot is never forgotten
            return
        self._refill(entry, now)
        if self.time is not None:
            entry.balance -= max(0.0, now - slot.taken_at)
        entry.held -= 1
        self._owners.move_to_end(slot.owner)
        if entry.held == 0 and (self.time is None or entry.balance >= self.time.burst_s):
            del self._owners[slot.owner]

    def _entry(self, owner: str, now: float) -> _Owner | None:
        entry = self._owners.get(owner)
        if entry is None:
            return None
        self._refill(entry, now)
        if entry.held == 0 and (self.time is None or entry.balance >= self.time.burst_s):
            del self._owners[owner]
            return None
        return entry

    def _refill(self, entry: _Owner, now: float) -> None:
        if self.time is not None:
            gained = max(0.0, now - entry.at) * self.time.rate
            entry.balance = min(self.time.burst_s, entry.balance + gained)
        entry.at = now

    def _remember(self, owner: str, now: float) -> _Owner:
        while len(self._owners) >= self._max_owners:
            if not self._forget_one():
                break
        entry = _Owner(self.time.burst_s if self.time is not None else 0.0, now)
        self._owners[owner] = entry
        return entry

    def _forget_one(self) -> bool:
        """Forget the least recently charged owner holding nothing (its debt forgiven)."""
        for name, entry in self._owners.items():
            if entry.held == 0:
                del self._owners[name]
                return True
        return False

    def _hint(self, reason: str, entry: _Owner | None) -> int:
        if reason == "time" and entry is not None and self.time is not None:
            return max(1, math.ceil(-entry.balance / self.time.rate + 1e-9))
        return max(1, math.ceil(self.retry_after_s))


def _quarter(capacity: int) -> int:
    """The reserve the rule keeps: a quarter of ``capacity``, at least one slot, fewer than
    all of them (none of a single slot)."""
    return min(capacity - 1, max(1, capacity // 4)) if capacity > 1 else 0


def _monotonic() -> float:
    return time.monotonic()
