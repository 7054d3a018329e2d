"""The bodies of the delivery-log, resend and test-send routes (docs/api.md), published like
``worker.api.webhooks.bodies``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from worker.api.bodies import DataResponse
from worker.api.webhooks.delivery_log import Delivery, Status, status_of
from worker.contract.delivery_log import AttemptRecord, DeliveryLogEntry
from worker.contract.messages import Identifier, Strict
from worker.contract.webhook_endpoints import EventType
from worker.webhooks.samples import TEST_MARK


class AttemptData(Strict):
    """One HTTP attempt of a delivery."""

    at: str = Field(description="When the attempt started (RFC 3339).")
    status: int | None = Field(description="The receiver's HTTP status; `null` if none came.")
    latency_ms: int | None = Field(description="How long the attempt took; `null` if unknown.")
    response_excerpt: str | None = Field(
        description="The first 256 bytes of the receiver's answer as text (bytes that are"
        " not UTF-8 escaped as `\\xNN`). The receiver's content: show it as text, never as"
        " markup."
    )
    response_truncated: bool = Field(description="The answer was longer than the excerpt.")
    error_kind: str | None = Field(
        description="Why no status came: `blocked`, `dns`, `connect`, `tls`, `timeout`,"
        " `protocol`, `internal` (or, for deliveries logged before attempts were, the last"
        " error)."
    )

    @classmethod
    def of(cls, record: AttemptRecord) -> AttemptData:
        return cls(**record.model_dump())


class DeliveryItem(Strict):
    """One delivery to the endpoint: its latest state in the log."""

    delivery_id: str = Field(
        description="The delivery: its `webhook_id`, followed by `.` and the replay, resend"
        " or test id that queued it when one did."
    )
    webhook_id: str = Field(description="The `webhook-id` header; the same on every attempt.")
    event_id: str
    event_type: str
    account_id: str
    version: int | None
    status: Status = Field(
        description="`succeeded`, `failing` (an attempt failed, a retry is due), `pending`"
        " (not attempted yet) or `failed` (for good)."
    )
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: str | None
    created_at: str = Field(description="When the delivery first appears in the log.")
    updated_at: str
    replay_id: str | None = Field(
        description="The replay (`rp_`), resend (`rs_`) or test send (`ts_`) that queued it."
    )
    test: bool = Field(description=f'A test send (its body holds `"{TEST_MARK}": true`).')

    @classmethod
    def fields_of(cls, delivery: Delivery) -> dict[str, object]:
        """The latest entry's fields of the item's names, as logged, and the derived ones."""
        e = delivery.latest
        logged = DeliveryItem.model_fields.keys() & DeliveryLogEntry.model_fields.keys()
        return e.model_dump(include=logged) | {
            "delivery_id": delivery.delivery_id,
            "status": status_of(e),
            "created_at": delivery.created_at,
            "replay_id": e.replay,
            "test": e.replay is not None and e.replay.startswith("ts_"),
        }

    @classmethod
    def of(cls, delivery: Delivery) -> DeliveryItem:
        return cls.model_validate(cls.fields_of(delivery))


class DeliveryPageResponse(DataResponse[list[DeliveryItem]]):
    """Success: one page of the endpoint's deliveries, newest first."""

    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page (the same filters); `null` on the"
        " last page. Opaque; pages of one cursor do not change while new deliveries arrive."
    )


class DeliveryDetail(DeliveryItem):
    """One delivery with every attempt the log holds and the exact body sent."""

    attempts_detail: list[AttemptData] = Field(description="Every attempt, oldest first.")
    body: str | None = Field(
        description="The exact body signed and sent (what a resend sends again); `null` for"
        " deliveries logged before bodies were."
    )

    @classmethod
    def of_detail(cls, delivery: Delivery) -> DeliveryDetail:
        return cls.model_validate(
            {
                **DeliveryItem.fields_of(delivery),
                "attempts_detail": [AttemptData.of(a) for a in delivery.attempts()],
                "body": delivery.body,
            }
        )


class DeliveryDetailResponse(DataResponse[DeliveryDetail]):
    """Success: the delivery."""


class QueuedData(Strict):
    """What was queued: the new delivery, behind the account's newer events."""

    delivery_id: str = Field(description="The queued delivery, as the log will show it.")
    webhook_id: str = Field(description="The `webhook-id` it is sent under.")
    event_id: str
    event_type: str
    account_id: str
    endpoint_id: Identifier
    kind: Literal["resend", "test"]


class QueuedResponse(DataResponse[QueuedData]):
    """Accepted: the delivery is queued and goes through the normal delivery path."""


class TestSendBody(BaseModel):
    """Which event type to send an example of."""

    __test__ = False  # not a pytest class
    model_config = ConfigDict(frozen=True, extra="forbid")

    event_type: EventType = Field(description="One of the event types the service sends.")


__all__ = [
    "AttemptData",
    "DeliveryDetail",
    "DeliveryDetailResponse",
    "DeliveryItem",
    "DeliveryPageResponse",
    "QueuedData",
    "QueuedResponse",
    "TestSendBody",
]
