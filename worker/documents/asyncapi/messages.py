"""The messages of the AsyncAPI document: one per kind of record, its payload, key, headers
and correlation; a wire model's from the model (its ``type`` and docstring)."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from pydantic import BaseModel

from worker.documents.asyncapi.components import KAFKA_BINDING_VERSION, WIRE_MODELS, ref

#: The record key of each wire model that is not keyed by its account.
_KEYS: Final = {
    "EndpointRecord": "EndpointId",
    "DeliveryState": "DeliveryStateKey",
    "DeliveryLogEntry": "EndpointId",
    "DeliveryLogBatch": "EndpointId",
    "PresenceRecord": "ReplicaId",
    "IdempotencyRecord": "IdempotencySlot",
}
_TOMBSTONE: Final = {"type": "null", "description": "No value (a Kafka tombstone)."}
#: Each tombstone: its title, its key and what it means.
_TOMBSTONES: Final = {
    "webhook_endpoint_deleted": (
        "EndpointDeleted",
        "EndpointId",
        "the endpoint of the record key was deleted.",
    ),
    "webhook_account_deliveries_migrated": (
        "AccountDeliveriesMigrated",
        "AccountId",
        "the old-form record of the account key was split into pair records.",
    ),
    "api_presence_ended": (
        "PresenceEnded",
        "ReplicaId",
        "the front-end replica of the record key stopped.",
    ),
    "api_idempotency_released": (
        "IdempotencyReleased",
        "IdempotencySlot",
        "the claim of the record key lost, expired, or its request failed before an answer.",
    ),
}
#: The models a ``command_id`` pairs: a command and its reply.
_PAIRED: Final = {"PasskeyConfirm", "GetAuthState", "Reply"}


def _message(name: str, title: str, summary: str, payload: Any, key: str, **more: Any) -> Any:
    """A message; ``more`` overrides its ``headers`` or ``contentType``."""
    return {
        "name": name,
        "title": title,
        "summary": summary,
        "contentType": "application/json",
        "headers": ref("TraceContextHeaders"),
        "payload": payload,
        "bindings": {"kafka": {"key": ref(key), "bindingVersion": KAFKA_BINDING_VERSION}},
        **more,
    }


def _wire(model: type[Any]) -> dict[str, Any]:
    """A wire model's message: its id is the value of its ``type`` discriminator."""
    if issubclass(model, BaseModel):
        kind = model.model_fields["type"].default
    else:
        kind = {f.name: f.default for f in dataclasses.fields(model)}["type"]
    summary = " ".join((model.__doc__ or model.__name__).split("\n\n")[0].split())
    key = _KEYS.get(model.__name__, "AccountId")
    message: dict[str, Any] = _message(kind, model.__name__, summary, ref(model.__name__), key)
    if model.__name__ in _PAIRED:
        message["correlationId"] = {
            "description": "`command_id` pairs a `passkey_confirm` or a `get_auth_state` "
            "with its reply.",
            "location": "$message.payload#/command_id",
        }
    return message


def messages() -> dict[str, Any]:
    """Every message by its id."""
    found = [
        *(_wire(model) for model in WIRE_MODELS),
        _message(
            "dead_lettered_command",
            "DeadLetteredCommand",
            "A record of auth.commands that could not be decoded, with its original bytes.",
            {"description": "The original value, byte for byte; possibly not JSON at all."},
            "DeadLetterKey",
            headers=ref("AuthDeadLetterHeaders"),
            contentType="application/octet-stream",
        ),
        _message(
            "webhook_dead_letter",
            "WebhookDeadLetter",
            "A delivery that failed for good: the exact body it was sent with.",
            ref("WebhookBody"),
            "AccountId",
            headers=ref("WebhookDeadLetterHeaders"),
        ),
        *(
            _message(name, title, f"Tombstone: {summary}", _TOMBSTONE, key)
            for name, (title, key, summary) in _TOMBSTONES.items()
        ),
    ]
    return {message["name"]: message for message in found}
