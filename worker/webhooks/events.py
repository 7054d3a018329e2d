"""From a record on auth.status / auth.errors to its webhook body ``{"type", "timestamp",
"data"}``, rendered once at take-in and stored, so every attempt and replay signs the same
bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from pydantic import ValidationError

from worker.contract.messages import AuthError, AuthStatusChanged
from worker.webhooks.endpoints import EVENT_ERROR, EVENT_STATUS_CHANGED

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


__all__ = ["WIRE_ONLY", "ValidationError", "WebhookEvent", "from_error", "from_status"]
