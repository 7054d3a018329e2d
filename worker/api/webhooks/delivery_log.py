"""The delivery log as an integrator reads it: a slice of the endpoint's log partition grouped into
deliveries, paged by a cursor that pins the slice, so pages neither repeat nor skip a delivery
while new ones arrive (docs/architecture.md, "The delivery log an integrator reads")."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from worker.api.reading import invalid_query
from worker.api.webhooks.delivery_log_scan import LogSlice
from worker.contract.catalogue import ServiceError
from worker.contract.delivery_log import AttemptRecord, DeliveryLogEntry
from worker.contract.webhook_events import parse_rfc3339

Status = Literal["succeeded", "failing", "pending", "failed"]
STATUSES: Final[tuple[Status, ...]] = ("succeeded", "failing", "pending", "failed")
PAGE_DEFAULT: Final = 20
PAGE_MAX: Final = 100
CURSOR_MAX_CHARS: Final = 256
Position = tuple[int, int]
"""(offset of the record, index of the entry in it)."""


def delivery_id(entry: DeliveryLogEntry) -> str:
    """One delivery: its webhook-id, with the replay, resend or test id that queued it again
    (``msg_...`` alone for the event's own delivery)."""
    return entry.webhook_id if entry.replay is None else f"{entry.webhook_id}.{entry.replay}"


def status_of(entry: DeliveryLogEntry) -> Status:
    """``succeeded``, ``failed`` (for good), ``failing`` (a retry due) or ``pending``."""
    if entry.state == "delivered":
        return "succeeded"
    if entry.state == "failed":
        return "failed"
    return "failing" if entry.attempts > 0 else "pending"


@dataclass
class Delivery:
    """One delivery's entries in a slice: where it first appears, and every entry since."""

    delivery_id: str
    first: Position
    entries: list[DeliveryLogEntry] = field(default_factory=list)

    @property
    def latest(self) -> DeliveryLogEntry:
        return self.entries[-1]

    @property
    def created_at(self) -> str:
        return self.entries[0].updated_at

    @property
    def body(self) -> str | None:
        """The exact body sent (entries written before bodies were logged have none)."""
        return next((e.body for e in reversed(self.entries) if e.body is not None), None)

    def attempts(self) -> list[AttemptRecord]:
        """Every attempt the slice holds, oldest first; an entry written before attempts were
        logged gives what it has (its time, last status, last error)."""
        out: list[AttemptRecord] = []
        seen = 0
        for entry in self.entries:
            if entry.attempt is not None:
                out.append(entry.attempt)
            elif entry.attempts > seen:
                out.append(
                    AttemptRecord(
                        at=entry.updated_at,
                        status=entry.last_status,
                        error_kind=None if entry.last_error is None else entry.last_error[:64],
                    )
                )
            seen = max(seen, entry.attempts)
        return out


def deliveries(found: LogSlice) -> list[Delivery]:
    """The slice's deliveries, newest (latest first entry) first."""
    by_id: dict[str, Delivery] = {}
    for position, entry in found.entries:
        key = delivery_id(entry)
        one = by_id.get(key)
        if one is None:
            one = by_id[key] = Delivery(key, position)
        one.entries.append(entry)
    return sorted(by_id.values(), key=lambda d: d.first, reverse=True)


@dataclass(frozen=True, slots=True)
class Filters:
    """What a list request keeps; ``None`` keeps all. ``since``/``until`` bound when the
    delivery first appears in the log (``created_at``), ``until`` excluded."""

    status: Status | None = None
    event_type: str | None = None
    account_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def keeps(self, delivery: Delivery) -> bool:
        latest = delivery.latest
        if self.status is not None and status_of(latest) != self.status:
            return False
        if self.event_type is not None and latest.event_type != self.event_type:
            return False
        if self.account_id is not None and latest.account_id != self.account_id:
            return False
        if self.since is not None or self.until is not None:
            try:
                created = parse_rfc3339(delivery.created_at)
            except ValueError:
                return False
            if self.since is not None and created < self.since:
                return False
            if self.until is not None and created >= self.until:
                return False
        return True


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next page starts: the slice (``partition``, ``[lo, hi)``) and the position of
    the last delivery shown; opaque to callers, any value of its form read and clamped."""

    partition: int
    lo: int
    hi: int
    before: Position

    def encode(self) -> str:
        return ".".join(("c1", *(str(n) for n in (self.partition, self.lo, self.hi, *self.before))))


CURSOR_PATTERN: Final = r"^c1(\.[0-9]{1,18}){5}$"
_CURSOR: Final = re.compile(CURSOR_PATTERN.replace("^", "").replace("$", ""))


def bad_cursor() -> ServiceError:
    return invalid_query("cursor must be a next_cursor this route answered")


def decode_cursor(text: str, *, window: int) -> Cursor:
    """A cursor of the form this route answers, its slice clamped to at most ``window``
    records ending at its ``hi`` (a forged cursor cannot buy a longer scan, and reads at worst
    an empty page); raises ``ServiceError`` (400) for anything not of that form."""
    if len(text) > CURSOR_MAX_CHARS or _CURSOR.fullmatch(text) is None:
        raise bad_cursor()
    partition, lo, hi, offset, index = (int(n) for n in text.split(".")[1:])
    lo = min(max(lo, hi - window), hi)
    return Cursor(partition, lo, hi, (offset, index))


def page(
    found: LogSlice, filters: Filters, *, before: Position | None, limit: int
) -> tuple[list[Delivery], Cursor | None]:
    """Up to ``limit`` deliveries the filters keep, newest first, from ``before`` (excluded);
    and the cursor of the next page, when there is one."""
    kept = [
        d for d in deliveries(found) if (before is None or d.first < before) and filters.keeps(d)
    ]
    shown = kept[:limit]
    if len(kept) <= limit:
        return shown, None
    return shown, Cursor(found.partition, found.lo, found.hi, shown[-1].first)


def find(found: LogSlice, wanted: str) -> Delivery | None:
    return next((d for d in deliveries(found) if d.delivery_id == wanted), None)


__all__ = [
    "CURSOR_PATTERN",
    "PAGE_DEFAULT",
    "PAGE_MAX",
    "STATUSES",
    "Cursor",
    "Delivery",
    "Filters",
    "Status",
    "bad_cursor",
    "decode_cursor",
    "deliveries",
    "delivery_id",
    "find",
    "page",
    "status_of",
]
