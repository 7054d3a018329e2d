"""The AsyncAPI 3.0 document: one channel per topic (what it holds, its cleanup policy, its
co-partitioned topics) and who sends or receives on each, in which group, with which reply."""

from __future__ import annotations

import re
from typing import Any, Final

from worker.contract.messages import COMMAND_TYPES
from worker.contract.topics import COMPACTED, Topics, co_partitioned
from worker.documents.asyncapi.components import KAFKA_BINDING_VERSION, component_schemas
from worker.documents.asyncapi.messages import messages
from worker.settings import DEFAULT_BOOTSTRAP, Settings

ASYNCAPI_VERSION: Final = "3.0.0"
ROLES: Final = {
    "front-end": "The API front-end (`python -m worker api`).",
    "upstream": "Other producers of commands: the account service and the provider webhook "
    "ingester.",
    "worker": "A worker of the pool (`python -m worker run`).",
    "dispatcher": "A webhook dispatcher of the pool (`python -m worker webhooks`).",
}
#: Each topic by its ``Topics`` field (the channel id): what it holds, its messages, and the
#: operations on it by id (which names the role and action) with their summaries.
CHANNELS: Final[dict[str, tuple[str, tuple[str, ...], dict[str, str]]]] = {
    "commands": (
        "Commands to the worker pool, discriminated by `type`; each one's key must equal its"
        " `account_id` (otherwise it is dead-lettered as `key_mismatch`).",
        COMMAND_TYPES,
        {
            "frontEndSendsPasskeyConfirm": "`POST .../passkey-confirm` becomes a command; the"
            " reply comes on auth.replies.",
            "frontEndSendsAuthStateQuery": "`GET .../auth` becomes a query the owner of the"
            " account's partition answers from its store, behind any earlier command of the"
            " account; the reply comes on auth.replies. It changes nothing.",
            "upstreamSendsCommands": "Accounts enter and leave the flow; the provider reports"
            " progress.",
            "workerReceivesCommands": "The pool shares the partitions; each account is handled by"
            " one worker in order.",
        },
    ),
    "state": (
        "The worker's state store changelog: the latest record of each account, written by the"
        " worker owning its partition (single writer).",
        ("account_state",),
        {
            "workerReceivesState": "Restore: the owned partitions are read from the beginning on"
            " assignment.",
            "workerSendsState": "After every change of a record.",
        },
    ),
    "status": (
        "One event per real change of `status`/`auth_status` (one per `version`).",
        ("auth_status_changed",),
        {
            "workerSendsStatus": "On a real transition.",
            "dispatcherReceivesStatus": "Status changes become `account.auth_status_changed`"
            " webhooks.",
        },
    ),
    "errors": (
        "One event per failed command and per dead-lettered record with a readable account.",
        ("auth_error",),
        {
            "workerSendsErrors": "On a failed command.",
            "dispatcherReceivesErrors": "Errors become `account.auth_error` webhooks.",
        },
    ),
    "replies": (
        "Exactly one reply per `passkey_confirm` and per `get_auth_state`.",
        ("reply",),
        {
            "frontEndReceivesReplies": "Each replica reads its own partition (its"
            " `reply-partition` header) and answers the waiting request.",
            "workerSendsReplies": "One per `passkey_confirm` and per `get_auth_state`.",
        },
    ),
    "dlq": (
        "Undecodable records of auth.commands, with the reason in headers.",
        ("dead_lettered_command",),
        {
            "workerSendsDeadLetters": "Undecodable commands.",
        },
    ),
    "webhook_endpoints": (
        "The webhook endpoints, keyed by endpoint id; a tombstone deletes. Secrets are sealed"
        " (AES-GCM) and never in clear.",
        ("webhook_endpoint", "webhook_endpoint_deleted"),
        {
            "frontEndSendsEndpoints": "`/v1/webhook-endpoints` writes: create, update, rotate,"
            " delete (tombstone).",
            "frontEndReceivesEndpoints": "The endpoint registry every replica keeps (every"
            " partition, no group).",
            "dispatcherReceivesEndpoints": "The endpoint registry (every partition, no group).",
            "dispatcherSendsEndpoints": "Disables an endpoint that answered 410 or kept failing.",
        },
    ),
    "webhook_state": (
        "The dispatcher's state store changelog: the pending deliveries of each (endpoint,"
        " account) pair, in the account's partition. Records of the old form (one per account,"
        " every endpoint's queue) are still read, and tombstoned once split.",
        (
            "webhook_delivery_state",
            "webhook_account_deliveries",
            "webhook_account_deliveries_migrated",
        ),
        {
            "dispatcherReceivesDeliveryState": "Restore: the owned partitions are read from the"
            " beginning on assignment.",
            "dispatcherSendsDeliveryState": "Acknowledged before an event's offset is committed"
            " (durably scheduled).",
        },
    ),
    "webhook_deliveries": (
        "The delivery log: each state of each delivery (pending, delivered, failed), keyed by"
        " endpoint id, each entry after an attempt with that attempt and the body; read by `GET"
        " .../deliveries`. One record holds one entry, or the entries of one endpoint written"
        " within the dispatcher's flush window (`WEBHOOK_LOG_FLUSH_S`); readers accept both.",
        ("webhook_delivery", "webhook_delivery_batch"),
        {
            "frontEndReceivesDeliveries": "`GET .../deliveries` reads the last records of the"
            " endpoint's partition on demand (no group, no permanent reader).",
            "dispatcherSendsDeliveries": "Each state of each delivery.",
        },
    ),
    "webhook_replays": (
        "Requests to send one event again to one endpoint (`POST .../replay`), or one logged"
        " delivery with its body (`source` `webhook`: a resend or a test send).",
        ("webhook_replay",),
        {
            "frontEndSendsReplays": "`POST .../replay`.",
            "dispatcherReceivesReplays": "A replay reaches the lane of its account like the event"
            " did.",
        },
    ),
    "webhook_dlq": (
        "Deliveries that failed for good, with why and where in headers.",
        ("webhook_dead_letter",),
        {
            "dispatcherSendsDeadLetters": "A delivery that failed for good.",
        },
    ),
    "api_presence": (
        "The live front-end replicas (one partition): each writes its record every 2 s and when"
        " its replays change, and tombstones it when it stops. Each replica divides a workspace's"
        " rate by the live count and decides a replay claim in this order.",
        ("api_presence", "api_presence_ended"),
        {
            "frontEndSendsPresence": "A heartbeat every 2 s and at each replay claim or release; a"
            " tombstone at stop.",
            "frontEndReceivesPresence": "Every replica reads every replica's records (no group):"
            " the live count and the replays each holds.",
        },
    ),
    "api_idempotency": (
        "The confirms' `Idempotency-Key`s of the last 24 h (one partition): a request's claim of a"
        " key, then its answer under the same record key. Every replica reads every record; the"
        " first claim of a key in this order holds it.",
        ("api_idempotency", "api_idempotency_released"),
        {
            "frontEndSendsIdempotency": "A confirm's claim of its `Idempotency-Key`, its answer,"
            " and tombstones of lost, failed or expired claims.",
            "frontEndReceivesIdempotency": "Every replica reads every record (no group): the keys"
            " held and their answers.",
        },
    ),
}
#: The operations that carry only some of their channel's messages.
_ONLY: Final = {
    "frontEndSendsPasskeyConfirm": ("passkey_confirm",),
    "frontEndSendsAuthStateQuery": ("get_auth_state",),
    "upstreamSendsCommands": ("register_account", "observe_auth_state", "deregister_account"),
    "dispatcherSendsEndpoints": ("webhook_endpoint",),
}
#: The consumer group (its setting) of the operations that read in one.
_GROUPS: Final = {
    "workerReceivesCommands": "kafka_consumer_group",
    "dispatcherReceivesStatus": "webhook_consumer_group",
    "dispatcherReceivesErrors": "webhook_consumer_group",
    "dispatcherReceivesReplays": "webhook_consumer_group",
}
_REPLIES: Final = {"frontEndSendsPasskeyConfirm", "frontEndSendsAuthStateQuery"}


def _refs(channel: str, names: tuple[str, ...]) -> list[dict[str, str]]:
    return [{"$ref": f"#/channels/{channel}/messages/{m}"} for m in names]


def _operation(op_id: str, channel: str, summary: str) -> dict[str, Any]:
    found = re.match(r"(frontEnd|upstream|worker|dispatcher)(Send|Receive)s", op_id)
    assert found is not None, op_id
    role = "front-end" if found[1] == "frontEnd" else found[1]
    operation: dict[str, Any] = {
        "action": found[2].lower(),
        "channel": {"$ref": f"#/channels/{channel}"},
        "summary": summary,
        "tags": [{"$ref": f"#/components/tags/{role}"}],
        "messages": _refs(channel, _ONLY.get(op_id, CHANNELS[channel][1])),
    }
    if op_id in _GROUPS:
        group = Settings.model_fields[_GROUPS[op_id]].default
        operation["bindings"] = {
            "kafka": {
                "groupId": {"type": "string", "enum": [group]},
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        }
    if op_id in _REPLIES:
        replies = {"$ref": "#/channels/replies"}
        operation["reply"] = {"channel": replies, "messages": _refs("replies", ("reply",))}
    return operation


def _channel(field: str, address: str, groups: list[tuple[str, ...]]) -> dict[str, Any]:
    description, names, _ = CHANNELS[field]
    partners = [a for g in groups if address in g for a in g if a != address]
    if partners:
        description += (
            f" Co-partitioned with {', '.join(partners)} (same partition count; an account "
            "is on the same partition number of each)."
        )
    policy = "compact" if field in COMPACTED else "delete"
    return {
        "address": address,
        "description": description,
        "messages": {m: {"$ref": f"#/components/messages/{m}"} for m in names},
        "bindings": {
            "kafka": {
                "topicConfiguration": {"cleanup.policy": [policy]},
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        },
    }


def asyncapi_document() -> dict[str, Any]:
    """The whole document, deterministic (the drift test compares it byte for byte), at the
    default topic names whatever ``TOPIC_*`` says in this process's environment."""
    topics = Topics.model_construct()
    addresses: dict[str, str] = topics.model_dump()
    assert set(addresses) == set(CHANNELS), "every topic needs a channel"
    groups = co_partitioned(topics)
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
                "description": "The development broker of `make run`.",
            },
        },
        "channels": {f: _channel(f, addresses[f], groups) for f in CHANNELS},
        "operations": {
            op: _operation(op, field, summary)
            for field, (_, _, operations) in CHANNELS.items()
            for op, summary in operations.items()
        },
        "components": {
            "schemas": component_schemas(),
            "messages": messages(),
            "tags": {role: {"name": role, "description": text} for role, text in ROLES.items()},
        },
    }
