"""From a record on auth.status / auth.errors to its webhook body ``{"type", "timestamp",
"data"}``, rendered once at take-in and stored, so every attempt and replay signs the same
bytes."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.contract.messages import MAX_RECORD_BYTES, AuthError, AuthStatusChanged
from worker.contract.webhook_endpoints import EVENT_ERROR, EVENT_STATUS_CHANGED

#: The event record's fields a webhook body leaves out of ``data`` (the catalogue's schemas too).
WIRE_ONLY: Final = frozenset({"type", "schema_version"})


_RFC3339: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


_EARLIEST: Final = datetime.min.replace(tzinfo=UTC)
_LATEST: Final = datetime.max.replace(tzinfo=UTC)


def parse_rfc3339(value: object) -> datetime:
    """An RFC 3339 date-time (``Z`` or an offset required) as an aware datetime in UTC.

    Raises ``ValueError``. A leap second (``:60``) is read as the last microsecond before it.
    RFC 3339 spans years 0000-9999 in any offset; Python's datetime does not (year 0, or
    0001-01-01 east of UTC, 9999-12-31 west of it), so such an instant is clamped to the
    earliest or latest one Python has: as a ``since`` it still means "everything" or
    "nothing", rather than a refusal of a valid date-time.
    """
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string")
    match = _RFC3339.fullmatch(value)  # ASCII digits only, no trailing newline
    if match is None:
        raise ValueError("must be an RFC 3339 date-time such as 2026-01-01T00:00:00Z")
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    leap = second == "60"
    micros = (fraction or "").ljust(6, "0")[:6]
    # Year 0000 is valid RFC 3339 and a leap year, like 0004: the rest is checked as 0004.
    year_zero = year == "0000"
    text = (
        f"{'0004' if year_zero else year}-{month}-{day}T{hour}:{minute}:"
        f"{'59' if leap else second}.{micros}{'+00:00' if offset in ('Z', 'z') else offset}"
    )
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("must be an RFC 3339 date-time such as 2026-01-01T00:00:00Z") from None
    if year_zero:
        return _EARLIEST
    if leap:
        parsed = parsed.replace(microsecond=999_999)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # the instant falls before year 1 or after year 9999 in UTC
        return _EARLIEST if parsed.year == 1 else _LATEST


@dataclass(frozen=True, slots=True)
class WebhookEvent:
    """One event as the dispatcher fans it out."""

    event_type: str
    event_id: str
    account_id: str
    workspace_id: str | None
    version: int | None
    occurred_at: str
    body: str


def from_status(value: bytes) -> WebhookEvent:
    """An ``auth_status_changed`` record; raises ``ValidationError`` for anything else."""
    event = AuthStatusChanged.model_validate_json(value)
    return _event(EVENT_STATUS_CHANGED, event, event.version)


def from_error(value: bytes) -> WebhookEvent:
    """An ``auth_error`` record; raises ``ValidationError`` for anything else."""
    event = AuthError.model_validate_json(value)
    return _event(EVENT_ERROR, event, None)


def _event(
    event_type: str, event: AuthStatusChanged | AuthError, version: int | None
) -> WebhookEvent:
    # pydantic writes ``data`` as ``json.dumps`` (compact, not ASCII-escaped) would write the
    # model's dump, without making that dump first.
    data = event.model_dump_json(exclude=set(WIRE_ONLY))
    timestamp = json.dumps(event.occurred_at, ensure_ascii=False)
    body = f'{{"type":"{event_type}","timestamp":{timestamp},"data":{data}}}'
    return WebhookEvent(
        event_type=event_type,
        event_id=event.event_id,
        account_id=event.account_id,
        workspace_id=event.workspace_id,
        version=version,
        occurred_at=event.occurred_at,
        body=body,
    )


class EventCopy(BaseModel):
    """An event with its rendered body, as the delivery log keeps it: what a resend or a test
    send puts on the replay topic (``Replay.source == "webhook"``) in place of a record of
    auth.status / auth.errors, so the dispatcher sends these exact bytes under the webhook-id
    of ``event_id``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_type: str = Field(max_length=128)
    event_id: str = Field(max_length=128)
    account_id: str = Field(max_length=128)
    workspace_id: str = Field(max_length=128)
    version: int | None = None
    occurred_at: str = Field(max_length=64)
    body: str = Field(max_length=MAX_RECORD_BYTES)

    @classmethod
    def of(cls, event: WebhookEvent, workspace_id: str) -> EventCopy:
        return cls(**{**asdict(event), "workspace_id": workspace_id})


def from_copy(value: bytes) -> WebhookEvent:
    """An ``EventCopy``; raises ``ValidationError`` for anything else."""
    copy = EventCopy.model_validate_json(value)
    return WebhookEvent(
        event_type=copy.event_type,
        event_id=copy.event_id,
        account_id=copy.account_id,
        workspace_id=copy.workspace_id,
        version=copy.version,
        occurred_at=copy.occurred_at,
        body=copy.body,
    )


__all__ = [
    "WIRE_ONLY",
    "EventCopy",
    "ValidationError",
    "WebhookEvent",
    "from_copy",
    "from_error",
    "from_status",
    "parse_rfc3339",
]
