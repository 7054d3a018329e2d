"""From a record on auth.status / auth.errors to its webhook body ``{"type", "timestamp",
"data"}``, rendered once at take-in and stored, so every attempt and replay signs the same
bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.contract.messages import MAX_RECORD_BYTES, AuthError, AuthStatusChanged
from worker.contract.webhook_endpoints import EVENT_ERROR, EVENT_STATUS_CHANGED

#: The event record's fields a webhook body leaves out of ``data`` (the catalogue's schemas too).
WIRE_ONLY: Final = frozenset({"type", "schema_version"})


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
    data = event.model_dump(mode="json", exclude=set(WIRE_ONLY))
    body = json.dumps(
        {"type": event_type, "timestamp": event.occurred_at, "data": data},
        separators=(",", ":"),
        ensure_ascii=False,
    )
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
        return cls(
            event_type=event.event_type,
            event_id=event.event_id,
            account_id=event.account_id,
            workspace_id=workspace_id,
            version=event.version,
            occurred_at=event.occurred_at,
            body=event.body,
        )


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
]
