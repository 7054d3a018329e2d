"""The AsyncAPI 3.0 document of the Kafka contract (``schemas/asyncapi.json``), for other teams'
tools. Payloads, addresses and groups come from the code, so a drift test catches any
disagreement; what the code does not name (roles, compaction, inline header names) is stated
here once and checked against the publishers (docs/architecture.md, "Topics and messages")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from worker.api.presence import PresenceRecord
from worker.contract.messages import (
    DECODE_REASONS,
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
from worker.contract.topics import COMPACTED, Topics, co_partitioned
from worker.engine.faults import FAULT_REASONS
from worker.settings import DEFAULT_BOOTSTRAP, Settings
from worker.webhooks.delivery import DeliveryState
from worker.webhooks.delivery_store import AccountDeliveries
from worker.webhooks.endpoints import EVENT_TYPES, EndpointRecord
from worker.webhooks.events import _WIRE_ONLY as WEBHOOK_BODY_DROPS
from worker.webhooks.publish import DeliveryLogBatch, DeliveryLogEntry, Replay

ASYNCAPI_VERSION: Final = "3.0.0"
KAFKA_BINDING_VERSION: Final = "0.5.0"
SCHEMA_REF: Final = "#/components/schemas/{model}"

#: W3C Trace Context (https://www.w3.org/TR/trace-context/) as Kafka headers: optional on
#: every message, so a trace follows a command from the front-end to the webhook.
TRACE_HEADERS: Final[dict[str, Any]] = {
    "traceparent": {
        "type": "string",
        "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
        "description": "W3C Trace Context `traceparent` (version-traceid-parentid-flags) of "
        "the span that produced the record; from a service that records no spans (no "
        "exporter configured), the context it received, passed on unchanged. Every record "
        "our services write has it. Optional for other producers.",
    },
    "tracestate": {
        "type": "string",
        "maxLength": 512,
        "description": "W3C Trace Context `tracestate` (vendor-specific trace data), the "
        "caller's passed on, cut to 512 characters by the W3C rules. Optional.",
    },
}

#: Headers of ``auth.dlq`` (worker/engine/faults.py ``Fault.headers``), after the original record's.
AUTH_DLQ_HEADERS: Final[dict[str, Any]] = {
    "dlq.reason": {
        "type": "string",
        "enum": [*DECODE_REASONS, *FAULT_REASONS],
        "description": "Why the record could not become a command, or why its handling "
        "failed for good (a metrics label).",
    },
    "dlq.detail": {
        "type": "string",
        "description": "The explanation for humans, at most 1024 bytes (UTF-8).",
    },
    "dlq.source": {
        "type": "string",
        "pattern": "^.+:[0-9]+:[0-9]+$",
        "description": "Where the original record was: `topic:partition:offset`.",
    },
    "dlq.attempts": {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": "How many times the record was tried before it was dead-lettered.",
    },
}

#: Headers of a dead letter whose handling failed (not of an undecodable record).
DLQ_FAULT_HEADERS: Final[dict[str, Any]] = {
    "dlq.exception": {
        "type": "string",
        "description": "The exception class of the last attempt.",
    },
    "dlq.fingerprint": {
        "type": "string",
        "pattern": "^[0-9a-f]{16}$",
        "description": "Where and how the last attempt failed (class and call stack, no "
        "message): one bug, one fingerprint.",
    },
}

#: Headers of ``webhook.dlq`` (worker/webhooks/publish.py ``DeliveryPublisher.dead_letter``).
WEBHOOK_DLQ_HEADERS: Final[dict[str, Any]] = {
    "webhook.id": {
        "type": "string",
        "description": "The `webhook-id` every attempt of the delivery was sent under.",
    },
    "webhook.endpoint": {"type": "string", "description": "The endpoint id."},
    "webhook.event_type": {
        "type": "string",
        "enum": list(EVENT_TYPES),
        "description": "The webhook event type.",
    },
    "webhook.attempts": {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": "How many attempts were made (decimal).",
    },
    "webhook.last_status": {
        "type": "string",
        "pattern": "^([0-9]{3})?$",
        "description": "HTTP status of the last attempt; empty when it got no response.",
    },
    "webhook.last_error": {
        "type": "string",
        "description": "Why the last attempt failed, at most 512 bytes (UTF-8); may be empty.",
    },
}

Role = Literal["front-end", "upstream", "worker", "dispatcher"]
ROLES: Final[dict[Role, str]] = {
    "front-end": "The API front-end (`python -m worker api`).",
    "upstream": "Other producers of commands: the account service and the provider webhook "
    "ingester.",
    "worker": "A worker of the pool (`python -m worker run`).",
    "dispatcher": "A webhook dispatcher of the pool (`python -m worker webhooks`).",
}

Key = Literal["AccountId", "EndpointId", "DeadLetterKey", "DeliveryStateKey", "ReplicaId"]


@dataclass(frozen=True)
class _Message:
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


@dataclass(frozen=True)
class _Channel:
    """One topic: ``field`` is its ``Topics`` field, the channel id."""

    field: str
    description: str
    messages: tuple[str, ...]


@dataclass(frozen=True)
class _Operation:
    id: str
    role: Role
    action: Literal["send", "receive"]
    channel: str
    summary: str
    messages: tuple[str, ...] | None = None
    group: str | None = None
    reply: str | None = None


def _default_topics() -> Topics:
    """The default topic names, whatever ``TOPIC_*`` says in this process's environment."""
    return Topics.model_construct()


def _default(setting: str) -> str:
    value = Settings.model_fields[setting].default
    assert isinstance(value, str)
    return value


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
)


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


def _ref(name: str) -> dict[str, str]:
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
    schemas["TraceContextHeaders"] = _headers("TraceContextHeaders", {})
    schemas["AuthDeadLetterHeaders"] = _headers(
        "AuthDeadLetterHeaders", AUTH_DLQ_HEADERS, DLQ_FAULT_HEADERS
    )
    schemas["WebhookDeadLetterHeaders"] = _headers("WebhookDeadLetterHeaders", WEBHOOK_DLQ_HEADERS)
    return dict(sorted(schemas.items()))


def _headers(
    title: str, required: dict[str, Any], optional: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Kafka headers as a schema: ``required`` ones plus ``optional`` ones and the trace
    context."""
    schema: dict[str, Any] = {
        "title": title,
        "type": "object",
        "properties": {**required, **(optional or {}), **TRACE_HEADERS},
    }
    if required:
        schema["required"] = list(required)
    return schema


def _webhook_body_schemas(schemas: dict[str, Any]) -> dict[str, Any]:
    """The Standard Webhooks body (worker/webhooks/events.py): ``data`` is the event minus
    its wire-only fields, so the schemas are the events' schemas minus those properties."""
    out: dict[str, Any] = {}
    variants = []
    for event_type, model in zip(EVENT_TYPES, (AuthStatusChanged, AuthError), strict=True):
        event = schemas[model.__name__]
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
                "data": _ref(f"{model.__name__}Data"),
            },
            "required": ["type", "timestamp", "data"],
        }
        variants.append(_ref(name))
    out["WebhookBody"] = {
        "title": "WebhookBody",
        "description": "The exact body signed and sent to endpoints (Standard Webhooks).",
        "oneOf": variants,
    }
    return out


def _messages() -> list[_Message]:
    def model(m: type[Any], key: Key = "AccountId", **kw: Any) -> _Message:
        return _Message(_type_of(m), m.__name__, _summary(m), _ref(m.__name__), key, **kw)

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
        _Message(
            "dead_lettered_command",
            "DeadLetteredCommand",
            "A record of auth.commands that could not be decoded, with its original bytes.",
            {"description": "The original value, byte for byte; possibly not JSON at all."},
            "DeadLetterKey",
            headers="AuthDeadLetterHeaders",
            content_type="application/octet-stream",
        ),
        model(EndpointRecord, "EndpointId"),
        _Message(
            "webhook_endpoint_deleted",
            "EndpointDeleted",
            "Tombstone: the endpoint of the record key was deleted.",
            {"type": "null", "description": "No value (a Kafka tombstone)."},
            "EndpointId",
        ),
        model(DeliveryState, "DeliveryStateKey"),
        model(AccountDeliveries),
        _Message(
            "webhook_account_deliveries_migrated",
            "AccountDeliveriesMigrated",
            "Tombstone: the old-form record of the account key was split into pair records.",
            {"type": "null", "description": "No value (a Kafka tombstone)."},
            "AccountId",
        ),
        model(DeliveryLogEntry, "EndpointId"),
        model(DeliveryLogBatch, "EndpointId"),
        model(Replay),
        _Message(
            "webhook_dead_letter",
            "WebhookDeadLetter",
            "A delivery that failed for good: the exact body it was sent with.",
            _ref("WebhookBody"),
            "AccountId",
            headers="WebhookDeadLetterHeaders",
        ),
        model(PresenceRecord, "ReplicaId"),
        _Message(
            "api_presence_ended",
            "PresenceEnded",
            "Tombstone: the front-end replica of the record key stopped.",
            {"type": "null", "description": "No value (a Kafka tombstone)."},
            "ReplicaId",
        ),
    ]


def _channels() -> list[_Channel]:
    return [
        _Channel(
            "commands",
            "Commands to the worker pool, discriminated by `type`; each one's key must equal "
            "its `account_id` (otherwise it is dead-lettered as `key_mismatch`).",
            (
                "register_account",
                "observe_auth_state",
                "passkey_confirm",
                "deregister_account",
                "get_auth_state",
            ),
        ),
        _Channel(
            "state",
            "The worker's state store changelog: the latest record of each account, written "
            "by the worker owning its partition (single writer).",
            ("account_state",),
        ),
        _Channel(
            "status",
            "One event per real change of `status`/`auth_status` (one per `version`).",
            ("auth_status_changed",),
        ),
        _Channel(
            "errors",
            "One event per failed command and per dead-lettered record with a readable account.",
            ("auth_error",),
        ),
        _Channel(
            "replies",
            "Exactly one reply per `passkey_confirm` and per `get_auth_state`.",
            ("reply",),
        ),
        _Channel(
            "dlq",
            "Undecodable records of auth.commands, with the reason in headers.",
            ("dead_lettered_command",),
        ),
        _Channel(
            "webhook_endpoints",
            "The webhook endpoints, keyed by endpoint id; a tombstone deletes. Secrets are "
            "sealed (AES-GCM) and never in clear.",
            ("webhook_endpoint", "webhook_endpoint_deleted"),
        ),
        _Channel(
            "webhook_state",
            "The dispatcher's state store changelog: the pending deliveries of each "
            "(endpoint, account) pair, in the account's partition. Records of the old form (one "
            "per account, every endpoint's queue) are still read, and tombstoned once split.",
            (
                "webhook_delivery_state",
                "webhook_account_deliveries",
                "webhook_account_deliveries_migrated",
            ),
        ),
        _Channel(
            "webhook_deliveries",
            "The delivery log: each state of each delivery (pending, delivered, failed), keyed "
            "by endpoint id; read by `GET .../deliveries`. One record holds one entry, or the "
            "entries of one endpoint written within the dispatcher's flush window "
            "(`WEBHOOK_LOG_FLUSH_S`); readers accept both.",
            ("webhook_delivery", "webhook_delivery_batch"),
        ),
        _Channel(
            "webhook_replays",
            "Requests to send one event again to one endpoint (`POST .../replay`).",
            ("webhook_replay",),
        ),
        _Channel(
            "webhook_dlq",
            "Deliveries that failed for good, with why and where in headers.",
            ("webhook_dead_letter",),
        ),
        _Channel(
            "api_presence",
            "The live front-end replicas (one partition): each writes its record every 2 s and "
            "when its replays change, and tombstones it when it stops. Each replica divides "
            "a workspace's rate by the live count and decides a replay claim in this order.",
            ("api_presence", "api_presence_ended"),
        ),
    ]


def _operations() -> list[_Operation]:
    workers = _default("kafka_consumer_group")
    dispatchers = _default("webhook_consumer_group")
    upstream_commands = ("register_account", "observe_auth_state", "deregister_account")
    return [
        _Operation(
            "frontEndSendsPasskeyConfirm",
            "front-end",
            "send",
            "commands",
            "`POST .../passkey-confirm` becomes a command; the reply comes on auth.replies.",
            messages=("passkey_confirm",),
            reply="replies",
        ),
        _Operation(
            "frontEndSendsAuthStateQuery",
            "front-end",
            "send",
            "commands",
            "`GET .../auth` becomes a query the owner of the account's partition answers from "
            "its store, behind any earlier command of the account; the reply comes on "
            "auth.replies. It changes nothing.",
            messages=("get_auth_state",),
            reply="replies",
        ),
        _Operation(
            "frontEndReceivesReplies",
            "front-end",
            "receive",
            "replies",
            "Each replica reads its own partition (its `reply-partition` header) and answers "
            "the waiting request.",
        ),
        _Operation(
            "frontEndSendsEndpoints",
            "front-end",
            "send",
            "webhook_endpoints",
            "`/v1/webhook-endpoints` writes: create, update, rotate, delete (tombstone).",
        ),
        _Operation(
            "frontEndReceivesEndpoints",
            "front-end",
            "receive",
            "webhook_endpoints",
            "The endpoint registry every replica keeps (every partition, no group).",
        ),
        _Operation(
            "frontEndSendsPresence",
            "front-end",
            "send",
            "api_presence",
            "A heartbeat every 2 s and at each replay claim or release; a tombstone at stop.",
        ),
        _Operation(
            "frontEndReceivesPresence",
            "front-end",
            "receive",
            "api_presence",
            "Every replica reads every replica's records (no group): the live count and the "
            "replays each holds.",
        ),
        _Operation(
            "frontEndSendsReplays",
            "front-end",
            "send",
            "webhook_replays",
            "`POST .../replay`.",
        ),
        _Operation(
            "frontEndReceivesDeliveries",
            "front-end",
            "receive",
            "webhook_deliveries",
            "`GET .../deliveries` reads the last records of the endpoint's partition on "
            "demand (no group, no permanent reader).",
        ),
        _Operation(
            "upstreamSendsCommands",
            "upstream",
            "send",
            "commands",
            "Accounts enter and leave the flow; the provider reports progress.",
            messages=upstream_commands,
        ),
        _Operation(
            "workerReceivesCommands",
            "worker",
            "receive",
            "commands",
            "The pool shares the partitions; each account is handled by one worker in order.",
            group=workers,
        ),
        _Operation(
            "workerReceivesState",
            "worker",
            "receive",
            "state",
            "Restore: the owned partitions are read from the beginning on assignment.",
        ),
        _Operation(
            "workerSendsState", "worker", "send", "state", "After every change of a record."
        ),
        _Operation("workerSendsStatus", "worker", "send", "status", "On a real transition."),
        _Operation("workerSendsErrors", "worker", "send", "errors", "On a failed command."),
        _Operation(
            "workerSendsReplies",
            "worker",
            "send",
            "replies",
            "One per `passkey_confirm` and per `get_auth_state`.",
        ),
        _Operation("workerSendsDeadLetters", "worker", "send", "dlq", "Undecodable commands."),
        _Operation(
            "dispatcherReceivesStatus",
            "dispatcher",
            "receive",
            "status",
            "Status changes become `account.auth_status_changed` webhooks.",
            group=dispatchers,
        ),
        _Operation(
            "dispatcherReceivesErrors",
            "dispatcher",
            "receive",
            "errors",
            "Errors become `account.auth_error` webhooks.",
            group=dispatchers,
        ),
        _Operation(
            "dispatcherReceivesReplays",
            "dispatcher",
            "receive",
            "webhook_replays",
            "A replay reaches the lane of its account like the event did.",
            group=dispatchers,
        ),
        _Operation(
            "dispatcherReceivesEndpoints",
            "dispatcher",
            "receive",
            "webhook_endpoints",
            "The endpoint registry (every partition, no group).",
        ),
        _Operation(
            "dispatcherReceivesDeliveryState",
            "dispatcher",
            "receive",
            "webhook_state",
            "Restore: the owned partitions are read from the beginning on assignment.",
        ),
        _Operation(
            "dispatcherSendsDeliveryState",
            "dispatcher",
            "send",
            "webhook_state",
            "Acknowledged before an event's offset is committed (durably scheduled).",
        ),
        _Operation(
            "dispatcherSendsDeliveries",
            "dispatcher",
            "send",
            "webhook_deliveries",
            "Each state of each delivery.",
        ),
        _Operation(
            "dispatcherSendsDeadLetters",
            "dispatcher",
            "send",
            "webhook_dlq",
            "A delivery that failed for good.",
        ),
        _Operation(
            "dispatcherSendsEndpoints",
            "dispatcher",
            "send",
            "webhook_endpoints",
            "Disables an endpoint that answered 410 or kept failing.",
            messages=("webhook_endpoint",),
        ),
    ]


def _message_object(m: _Message) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "name": m.id,
        "title": m.title,
        "summary": m.summary,
        "contentType": m.content_type,
        "headers": _ref(m.headers),
        "payload": m.payload,
        "bindings": {
            "kafka": {"key": _ref(m.key), "bindingVersion": KAFKA_BINDING_VERSION},
        },
    }
    if m.correlation is not None:
        obj["correlationId"] = {
            "description": "`command_id` pairs a `passkey_confirm` or a `get_auth_state` "
            "with its reply.",
            "location": m.correlation,
        }
    return obj


def _channel_object(c: _Channel, address: str, partners: list[str]) -> dict[str, Any]:
    description = c.description
    if partners:
        description += (
            f" Co-partitioned with {', '.join(partners)} (same partition count; an account "
            "is on the same partition number of each)."
        )
    policy = "compact" if c.field in COMPACTED else "delete"
    return {
        "address": address,
        "description": description,
        "messages": {m: {"$ref": f"#/components/messages/{m}"} for m in c.messages},
        "bindings": {
            "kafka": {
                "topicConfiguration": {"cleanup.policy": [policy]},
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        },
    }


def _operation_object(o: _Operation, channels: dict[str, _Channel]) -> dict[str, Any]:
    messages = o.messages if o.messages is not None else channels[o.channel].messages
    obj: dict[str, Any] = {
        "action": o.action,
        "channel": {"$ref": f"#/channels/{o.channel}"},
        "summary": o.summary,
        "tags": [{"$ref": f"#/components/tags/{o.role}"}],
        "messages": [{"$ref": f"#/channels/{o.channel}/messages/{m}"} for m in messages],
    }
    if o.group is not None:
        obj["bindings"] = {
            "kafka": {
                "groupId": {"type": "string", "enum": [o.group]},
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        }
    if o.reply is not None:
        reply = channels[o.reply]
        obj["reply"] = {
            "channel": {"$ref": f"#/channels/{o.reply}"},
            "messages": [{"$ref": f"#/channels/{o.reply}/messages/{m}"} for m in reply.messages],
        }
    return obj


def asyncapi_document() -> dict[str, Any]:
    """The whole document, deterministic (the drift test compares it byte for byte)."""
    topics = _default_topics()
    addresses: dict[str, str] = topics.model_dump()
    field_of = {address: field for field, address in addresses.items()}
    groups = co_partitioned(topics)
    channels = {c.field: c for c in _channels()}
    channel_objects = {}
    for field, c in channels.items():
        address = addresses[field]
        partners = [a for g in groups if address in g for a in g if a != address]
        channel_objects[field] = _channel_object(c, address, partners)
    assert set(field_of.values()) == set(channels), "every topic needs a channel"
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "id": "urn:passkey-auth-worker:kafka",
        "info": {
            "title": "Passkey auth-flow: Kafka contract",
            "version": "1.0.0",
            "description": "Every topic of the passkey auth-flow worker, its front-end and the "
            "webhook dispatcher: keys, headers, payloads and who sends or receives them. "
            'Generated from the code (`make schemas`); docs/architecture.md, "Topics and '
            'messages", explains the design. Values are UTF-8 JSON with `type` and '
            "`schema_version`; adding optional fields is compatible, renaming is not. Topic "
            "names are settings (`TOPIC_*`): the addresses here are the defaults.",
            "license": {"name": "Apache-2.0"},
            "tags": [{"$ref": f"#/components/tags/{role}"} for role in ROLES],
        },
        "defaultContentType": "application/json",
        "servers": {
            "production": {
                "host": "{bootstrap}",
                "protocol": "kafka",
                "description": "The production cluster (`KAFKA_BOOTSTRAP_SERVERS`).",
                "variables": {
                    "bootstrap": {
                        "default": "kafka.example.internal:9092",
                        "description": "A bootstrap server of the cluster (placeholder).",
                    }
                },
            },
            "development": {
                "host": DEFAULT_BOOTSTRAP,
                "protocol": "kafka",
                "description": "The embedded broker of `make run`.",
            },
        },
        "channels": channel_objects,
        "operations": {o.id: _operation_object(o, channels) for o in _operations()},
        "components": {
            "schemas": component_schemas(),
            "messages": {m.id: _message_object(m) for m in _messages()},
            "tags": {role: {"name": role, "description": text} for role, text in ROLES.items()},
        },
    }
