"""The messages of the AsyncAPI document: one per kind of record, its payload, key, headers
and correlation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from worker.api.idempotency import IdempotencyRecord
from worker.api.presence import PresenceRecord
from worker.contract.delivery_log import DeliveryLogBatch, DeliveryLogEntry, Replay
from worker.contract.messages import (
    AccountRecord,
    AuthError,
    AuthStatusChanged,
    DeregisterAccount,
    GetAuthState,
    ObserveAuthState,
    PasskeyConfirm,
    RegisterAccount,
    Reply,
)
from worker.contract.webhook_endpoints import EndpointRecord
from worker.dispatcher.delivery import DeliveryState
from worker.dispatcher.delivery_store import AccountDeliveries
from worker.documents.asyncapi.components import KAFKA_BINDING_VERSION, ref

Key = Literal[
    "AccountId", "EndpointId", "DeadLetterKey", "DeliveryStateKey", "ReplicaId", "IdempotencySlot"
]


@dataclass(frozen=True)
class Message:
    """One kind of record: its component id (the model's ``type`` where it has one)."""

    id: str
    title: str
    summary: str
    payload: dict[str, Any]
    key: Key
    headers: str = "TraceContextHeaders"
    content_type: str = "application/json"
    description: str | None = None
    correlation: str | None = None


def _type_of(model: type[Any]) -> str:
    """The value of the model's ``type`` discriminator (every wire model has one)."""
    if issubclass(model, BaseModel):
        value = model.model_fields["type"].default
    else:
        value = {f.name: f.default for f in dataclasses.fields(model)}["type"]
    assert isinstance(value, str)
    return value


def _summary(model: type[Any]) -> str:
    return " ".join((model.__doc__ or model.__name__).split("\n\n")[0].split())


def all_messages() -> list[Message]:
    def model(m: type[Any], key: Key = "AccountId", **kw: Any) -> Message:
        return Message(_type_of(m), m.__name__, _summary(m), ref(m.__name__), key, **kw)

    by_command = "$message.payload#/command_id"
    return [
        model(RegisterAccount),
        model(ObserveAuthState),
        model(PasskeyConfirm, correlation=by_command),
        model(DeregisterAccount),
        model(GetAuthState, correlation=by_command),
        model(Reply, correlation=by_command),
        model(AuthStatusChanged),
        model(AuthError),
        model(AccountRecord),
        Message(
            "dead_lettered_command",
            "DeadLetteredCommand",
            "A record of auth.commands that could not be decoded, with its original bytes.",
            {"description": "The original value, byte for byte; possibly not JSON at all."},
            "DeadLetterKey",
            headers="AuthDeadLetterHeaders",
            content_type="application/octet-stream",
        ),
        model(EndpointRecord, "EndpointId"),
        Message(
            "webhook_endpoint_deleted",
            "EndpointDeleted",
            "Tombstone: the endpoint of the record key was deleted.",
            {"type": "null", "description": "No value (a Kafka tombstone)."},
            "EndpointId",
        ),
        model(DeliveryState, "DeliveryStateKey"),
        model(AccountDeliveries),
        Message(
            "webhook_account_deliveries_migrated",
            "AccountDeliveriesMigrated",
            "Tombstone: the old-form record of the account key was split into pair records.",
            {"type": "null", "description": "No value (a Kafka tombstone)."},
            "AccountId",
        ),
        model(DeliveryLogEntry, "EndpointId"),
        model(DeliveryLogBatch, "EndpointId"),
        model(Replay),
        Message(
            "webhook_dead_letter",
            "WebhookDeadLetter",
            "A delivery that failed for good: the exact body it was sent with.",
            ref("WebhookBody"),
            "AccountId",
            headers="WebhookDeadLetterHeaders",
        ),
        model(PresenceRecord, "ReplicaId"),
        Message(
            "api_presence_ended",
            "PresenceEnded",
            "Tombstone: the front-end replica of the record key stopped.",
            {"type": "null", "description": "No value (a Kafka tombstone)."},
            "ReplicaId",
        ),
        model(IdempotencyRecord, "IdempotencySlot"),
        Message(
            "api_idempotency_released",
            "IdempotencyReleased",
            "Tombstone: the claim of the record key lost, expired, or its request failed "
            "before an answer.",
            {"type": "null", "description": "No value (a Kafka tombstone)."},
            "IdempotencySlot",
        ),
    ]


def message_object(m: Message) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "name": m.id,
        "title": m.title,
        "summary": m.summary,
        "contentType": m.content_type,
        "headers": ref(m.headers),
        "payload": m.payload,
        "bindings": {
            "kafka": {"key": ref(m.key), "bindingVersion": KAFKA_BINDING_VERSION},
        },
    }
    if m.correlation is not None:
        obj["correlationId"] = {
            "description": "`command_id` pairs a `passkey_confirm` or a `get_auth_state` "
            "with its reply.",
            "location": m.correlation,
        }
    return obj
