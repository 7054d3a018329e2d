"""The schemas of the AsyncAPI document's components: every wire model, the record keys, the
exact webhook body and the header sets, all from the code that reads and writes them."""

from __future__ import annotations

from typing import Any, Final

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from worker.api.idempotency import IdempotencyRecord
from worker.api.presence import PresenceRecord
from worker.contract.delivery_log import DeliveryLogBatch, DeliveryLogEntry, Replay
from worker.contract.messages import (
    AccountRecord,
    AuthError,
    AuthStatusChanged,
    DeregisterAccount,
    GetAuthState,
    Identifier,
    ObserveAuthState,
    PasskeyConfirm,
    RegisterAccount,
    Reply,
)
from worker.contract.webhook_endpoints import EndpointRecord
from worker.contract.webhook_events import WIRE_ONLY as WEBHOOK_BODY_DROPS
from worker.dispatcher.delivery import DeliveryState
from worker.dispatcher.delivery_store import AccountDeliveries
from worker.documents.asyncapi.headers import header_schemas
from worker.webhooks.event_types import EVENT_CATALOGUE

KAFKA_BINDING_VERSION: Final = "0.5.0"
SCHEMA_REF: Final = "#/components/schemas/{model}"

WIRE_MODELS: Final[tuple[type[Any], ...]] = (
    RegisterAccount,
    ObserveAuthState,
    PasskeyConfirm,
    DeregisterAccount,
    GetAuthState,
    Reply,
    AuthStatusChanged,
    AuthError,
    AccountRecord,
    EndpointRecord,
    DeliveryState,
    AccountDeliveries,
    DeliveryLogEntry,
    DeliveryLogBatch,
    Replay,
    PresenceRecord,
    IdempotencyRecord,
)


def ref(name: str) -> dict[str, str]:
    return {"$ref": SCHEMA_REF.format(model=name)}


def component_schemas() -> dict[str, Any]:
    """Every wire model's JSON Schema (nested models too) by name, refs into components."""
    inputs: list[tuple[str, JsonSchemaMode, TypeAdapter[Any]]] = [
        (m.__name__, "validation", TypeAdapter(m)) for m in WIRE_MODELS
    ]
    _, definitions = TypeAdapter.json_schemas(inputs, ref_template=SCHEMA_REF)
    schemas: dict[str, Any] = dict(definitions.get("$defs", {}))
    identifier = TypeAdapter(Identifier).json_schema()
    schemas["AccountId"] = identifier | {
        "title": "AccountId",
        "description": "Record key: the account id (UTF-8), so everything about one account "
        "lands in the same partition number of every co-partitioned topic.",
    }
    schemas["EndpointId"] = identifier | {
        "title": "EndpointId",
        "description": "Record key: the webhook endpoint id (UTF-8, `ep_` + 32 hex).",
    }
    schemas["ReplicaId"] = identifier | {
        "title": "ReplicaId",
        "description": "Record key: a front-end replica's id (UTF-8, `api_` + 32 hex), new at "
        "each process start.",
    }
    schemas["IdempotencySlot"] = {
        "title": "IdempotencySlot",
        "type": "string",
        "pattern": "^[^/]+/[0-9a-f]{64}/[^/]+$",
        "description": "Record key: `workspace_id/sha256(Idempotency-Key)/claim_id` (UTF-8), "
        "one claim of a key; the key itself is never written.",
    }
    schemas["DeliveryStateKey"] = {
        "title": "DeliveryStateKey",
        "type": "string",
        "pattern": "^[^/]+/[^/]+$",
        "description": "Record key: `endpoint_id/account_id` (UTF-8), one (endpoint, account) "
        "pair; written to the account's partition number, not the key's hash.",
    }
    schemas["DeadLetterKey"] = {
        "title": "DeadLetterKey",
        "type": "string",
        "description": "The dead-lettered record's own key, unchanged (normally the account "
        "id; absent or anything else when that was the record's fault).",
    }
    schemas |= _webhook_body_schemas(schemas)
    schemas |= header_schemas()
    return dict(sorted(schemas.items()))


def _webhook_body_schemas(schemas: dict[str, Any]) -> dict[str, Any]:
    """The Standard Webhooks body of every type of the event catalogue
    (worker/webhooks/event_types.py): ``data`` is the event minus its wire-only fields, so the
    schemas are the events' schemas minus those properties; each with the catalogue's
    example."""
    out: dict[str, Any] = {}
    variants = []
    for kind in EVENT_CATALOGUE:
        event_type, model = kind.name, kind.model
        event = schemas.get(model.__name__) or _inlined(kind.data_schema())
        data = {
            **event,
            "title": f"{model.__name__}Data",
            "description": f"The `data` of an `{event_type}` webhook: the {model.__name__} "
            "event without its wire-only fields.",
            "properties": {
                k: v for k, v in event["properties"].items() if k not in WEBHOOK_BODY_DROPS
            },
            "required": [k for k in event.get("required", []) if k not in WEBHOOK_BODY_DROPS],
        }
        out[f"{model.__name__}Data"] = data
        name = f"{model.__name__}Webhook"
        out[name] = {
            "title": name,
            "type": "object",
            "properties": {
                "type": {"const": event_type, "type": "string"},
                "timestamp": {"type": "string", "description": "The event's `occurred_at`."},
                "data": ref(f"{model.__name__}Data"),
                "test": {
                    "const": True,
                    "type": "boolean",
                    "description": "Present only on a test send (`POST .../test`): an example"
                    " event, not a real one.",
                },
            },
            "required": ["type", "timestamp", "data"],
            "description": kind.description,
            "examples": [kind.example_body()],
        }
        variants.append(ref(name))
    out["WebhookBody"] = {
        "title": "WebhookBody",
        "description": "The exact body signed and sent to endpoints (Standard Webhooks).",
        "oneOf": variants,
    }
    return out


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` written in place of their ``$ref``s: an event's data that
    is not a wire model of its own (the operational events) has no component to point at."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            target = node.get("$ref", "")
            if isinstance(target, str) and target.startswith("#/$defs/"):
                return walk(defs[target.removeprefix("#/$defs/")])
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    inlined: dict[str, Any] = walk(schema)
    return inlined
