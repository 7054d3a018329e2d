"""The AsyncAPI document's schemas: every wire model, the record keys, the exact webhook body,
and the Kafka headers no model holds (the tests check them against their publishers)."""

from __future__ import annotations

from typing import Any, Final

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from worker.api.idempotency import IdempotencyRecord
from worker.api.presence import PresenceRecord
from worker.contract import messages
from worker.contract.delivery_log import DeliveryLogBatch, DeliveryLogEntry, Replay
from worker.contract.webhook_endpoints import EVENT_TYPES, EndpointRecord
from worker.contract.webhook_events import WIRE_ONLY as WEBHOOK_BODY_DROPS
from worker.dispatcher.delivery import DeliveryState
from worker.dispatcher.delivery_store import AccountDeliveries
from worker.engine.faults import FAULT_REASONS
from worker.webhooks.event_types import EVENT_CATALOGUE

KAFKA_BINDING_VERSION: Final = "0.5.0"
SCHEMA_REF: Final = "#/components/schemas/{model}"

WIRE_MODELS: Final[tuple[type[Any], ...]] = (
    messages.RegisterAccount,
    messages.ObserveAuthState,
    messages.PasskeyConfirm,
    messages.DeregisterAccount,
    messages.GetAuthState,
    messages.Reply,
    messages.AuthStatusChanged,
    messages.AuthError,
    messages.AccountRecord,
    EndpointRecord,
    DeliveryState,
    AccountDeliveries,
    DeliveryLogEntry,
    DeliveryLogBatch,
    Replay,
    PresenceRecord,
    IdempotencyRecord,
)
#: Each record key: its form (``None``: the identifier rule) and what it is.
_KEYS: Final[dict[str, tuple[dict[str, str] | None, str]]] = {
    "AccountId": (
        None,
        "Record key: the account id (UTF-8), so everything about one account lands in the"
        " same partition number of every co-partitioned topic.",
    ),
    "EndpointId": (None, "Record key: the webhook endpoint id (UTF-8, `ep_` + 32 hex)."),
    "ReplicaId": (
        None,
        "Record key: a front-end replica's id (UTF-8, `api_` + 32 hex), new at each process start.",
    ),
    "IdempotencySlot": (
        {"pattern": "^[^/]+/[0-9a-f]{64}/[^/]+$"},
        "Record key: `workspace_id/sha256(Idempotency-Key)/claim_id` (UTF-8), one claim of a"
        " key; the key itself is never written.",
    ),
    "DeliveryStateKey": (
        {"pattern": "^[^/]+/[^/]+$"},
        "Record key: `endpoint_id/account_id` (UTF-8), one (endpoint, account) pair; written"
        " to the account's partition number, not the key's hash.",
    ),
    "DeadLetterKey": (
        {},
        "The dead-lettered record's own key, unchanged (normally the account id; absent or"
        " anything else when that was the record's fault).",
    ),
}


def _h(description: str, **schema: Any) -> dict[str, Any]:
    """A Kafka header: a string, maybe of a ``pattern`` or ``enum``."""
    return {"type": "string", **schema, "description": description}


#: W3C Trace Context (https://www.w3.org/TR/trace-context/) as Kafka headers: optional on
#: every message, so a trace follows a command from the front-end to the webhook.
TRACE_HEADERS: Final = {
    "traceparent": _h(
        "W3C Trace Context `traceparent` (version-traceid-parentid-flags) of the span that"
        " produced the record; from a service that records no spans (no exporter configured),"
        " the context it received, passed on unchanged. Every record our services write has"
        " it. Optional for other producers.",
        pattern="^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
    ),
    "tracestate": _h(
        "W3C Trace Context `tracestate` (vendor-specific trace data), the caller's passed on,"
        " cut to 512 characters by the W3C rules. Optional.",
        maxLength=512,
    ),
}
_COUNT: Final = "^[0-9]+$"
#: Headers of ``auth.dlq`` (worker/engine/faults.py ``Fault.headers``), after the original record's.
AUTH_DLQ_HEADERS: Final = {
    "dlq.reason": _h(
        "Why the record could not become a command, or why its handling failed for good (a"
        " metrics label).",
        enum=[*messages.DECODE_REASONS, *FAULT_REASONS],
    ),
    "dlq.detail": _h("The explanation for humans, at most 1024 bytes (UTF-8)."),
    "dlq.source": _h(
        "Where the original record was: `topic:partition:offset`.", pattern="^.+:[0-9]+:[0-9]+$"
    ),
    "dlq.attempts": _h(
        "How many times the record was tried before it was dead-lettered.", pattern=_COUNT
    ),
}
#: Headers of a dead letter whose handling failed (not of an undecodable record).
DLQ_FAULT_HEADERS: Final = {
    "dlq.exception": _h("The exception class of the last attempt."),
    "dlq.fingerprint": _h(
        "Where and how the last attempt failed (class and call stack, no message): one bug,"
        " one fingerprint.",
        pattern="^[0-9a-f]{16}$",
    ),
}
#: Headers of ``webhook.dlq`` (worker/dispatcher/publish.py ``DeliveryPublisher.dead_letter``).
WEBHOOK_DLQ_HEADERS: Final = {
    "webhook.id": _h("The `webhook-id` every attempt of the delivery was sent under."),
    "webhook.endpoint": _h("The endpoint id."),
    "webhook.event_type": _h("The webhook event type.", enum=list(EVENT_TYPES)),
    "webhook.attempts": _h("How many attempts were made (decimal).", pattern=_COUNT),
    "webhook.last_status": _h(
        "HTTP status of the last attempt; empty when it got no response.", pattern="^([0-9]{3})?$"
    ),
    "webhook.last_error": _h(
        "Why the last attempt failed, at most 512 bytes (UTF-8); may be empty."
    ),
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": SCHEMA_REF.format(model=name)}


def _headers(required: dict[str, Any], optional: dict[str, Any] | None = None) -> Any:
    """Kafka headers as a schema: ``required`` ones, ``optional`` ones and the trace context."""
    schema = {"type": "object", "properties": {**required, **(optional or {}), **TRACE_HEADERS}}
    return schema | ({"required": list(required)} if required else {})


def component_schemas() -> dict[str, Any]:
    """Every wire model's JSON Schema (nested models too) by name, refs into components, and
    the keys', the webhook bodies' and the header sets'."""
    inputs: list[tuple[str, JsonSchemaMode, TypeAdapter[Any]]] = [
        (m.__name__, "validation", TypeAdapter(m)) for m in WIRE_MODELS
    ]
    _, definitions = TypeAdapter.json_schemas(inputs, ref_template=SCHEMA_REF)
    schemas: dict[str, Any] = dict(definitions.get("$defs", {}))
    identifier = TypeAdapter(messages.Identifier).json_schema()
    for name, (form, description) in _KEYS.items():
        base = identifier if form is None else {"type": "string", **form}
        schemas[name] = base | {"title": name, "description": description}
    schemas |= _webhook_body_schemas(schemas)
    for name, headers in {
        "TraceContextHeaders": _headers({}),
        "AuthDeadLetterHeaders": _headers(AUTH_DLQ_HEADERS, DLQ_FAULT_HEADERS),
        "WebhookDeadLetterHeaders": _headers(WEBHOOK_DLQ_HEADERS),
    }.items():
        schemas[name] = {"title": name, **headers}
    return dict(sorted(schemas.items()))


def _webhook_body_schemas(schemas: dict[str, Any]) -> dict[str, Any]:
    """The Standard Webhooks body of every type of the event catalogue, with its example:
    ``data`` is the event's schema minus its wire-only fields."""
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
