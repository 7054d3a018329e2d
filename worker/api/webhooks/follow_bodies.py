"""Response bodies of following a replay and polling an account's events (docs/api.md,
"Following a replay" and "Polling an account's events")."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from worker.api.bodies import DataResponse
from worker.api.webhooks.account_events import FoundEvent
from worker.contract.messages import Identifier, rfc3339
from worker.webhooks.replay_scan import ReplayProgress, ReplayState


class ReplayStatusData(BaseModel):
    """A replay's state and counts, as the replica running it last wrote them."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "replay_id": "rp_0f1e2d3c4b5a69788796a5b4c3d2e1f0",
                    "endpoint_id": "ep_0f1e2d3c4b5a69788796a5b4c3d2e1f0",
                    "since": "2026-11-27T09:00:00.000000Z",
                    "state": "running",
                    "events_found": 120,
                    "events_sent": 100,
                    "events_failed": 0,
                    "records_scanned": 5400,
                    "cancel_requested": False,
                    "error": None,
                    "created_at": "2026-11-27T09:30:00.000Z",
                    "updated_at": "2026-11-27T09:30:04.000Z",
                }
            ]
        },
    )

    replay_id: str
    endpoint_id: Identifier
    since: str
    state: ReplayState = Field(
        description="`queued` (waiting for a slot), `running`, `done`, `cancelled`, `failed`"
        " (see `error`; also when the replica running it stopped)."
    )
    events_found: int = Field(description="Events of the endpoint's types since `since`.")
    events_sent: int = Field(
        description="Events handed to the dispatcher (acknowledged by the broker); their"
        " deliveries show in the delivery log with this `replay_id`."
    )
    events_failed: int = Field(description="Events found that could not be handed over.")
    records_scanned: int = Field(description="Records read (every account's, for the cost).")
    cancel_requested: bool
    error: str | None
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, progress: ReplayProgress) -> ReplayStatusData:
        times = {"created_at", "updated_at"}
        fields = progress.model_dump(include=cls.model_fields.keys() - times)
        return cls(**fields, **{name: rfc3339(getattr(progress, name)) for name in times})


class ReplayStatusResponse(DataResponse[ReplayStatusData]):
    """Success: one replay."""


class AccountEventData(BaseModel):
    """One event of the account: the same `event_id`, `version` and body as its webhook."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "event_id": "evt_3b0c1f4e2d5a4c6b8e9f0a1b2c3d4e5f",
                    "event_type": "account.auth_status_changed",
                    "account_id": "acc_demo_1",
                    "version": 3,
                    "occurred_at": "2026-11-27T09:30:00.000Z",
                    "body": {
                        "type": "account.auth_status_changed",
                        "timestamp": "2026-11-27T09:30:00.000Z",
                        "data": {"event_id": "evt_3b0c1f4e2d5a4c6b8e9f0a1b2c3d4e5f"},
                    },
                }
            ]
        },
    )

    event_id: str
    event_type: Literal["account.auth_status_changed", "account.auth_error"]
    account_id: Identifier
    version: int | None = Field(description="The status event's version; null for errors.")
    occurred_at: str
    body: dict[str, Any] = Field(
        description="The webhook body (`type`, `timestamp`, `data`), equal as JSON to what"
        " endpoints receive."
    )

    @classmethod
    def of(cls, found: FoundEvent) -> AccountEventData:
        event = found.event
        return cls.model_validate(
            {
                "event_id": event.event_id,
                "event_type": event.event_type,
                "account_id": event.account_id,
                "version": event.version,
                "occurred_at": event.occurred_at,
                "body": json.loads(event.body),
            }
        )


class AccountEventsResponse(DataResponse[list[AccountEventData]]):
    """Success: a page of the account's events, oldest first."""

    next_cursor: str = Field(
        description="Pass as `cursor` for the next page, now or later (new events arrive after it)."
    )
    has_more: bool = Field(
        description="The page stopped short of the newest event read: ask again at once."
    )


__all__ = [
    "AccountEventData",
    "AccountEventsResponse",
    "ReplayStatusData",
    "ReplayStatusResponse",
]
