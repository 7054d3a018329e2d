"""The operations of the AsyncAPI document: who (front-end, upstream, worker, dispatcher)
sends or receives on each channel, in which consumer group, with which reply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from worker.documents.asyncapi.channels import Channel
from worker.documents.asyncapi.components import KAFKA_BINDING_VERSION
from worker.settings import Settings

Role = Literal["front-end", "upstream", "worker", "dispatcher"]
ROLES: Final[dict[Role, str]] = {
    "front-end": "The API front-end (`python -m worker api`).",
    "upstream": "Other producers of commands: the account service and the provider webhook "
    "ingester.",
    "worker": "A worker of the pool (`python -m worker run`).",
    "dispatcher": "A webhook dispatcher of the pool (`python -m worker webhooks`).",
}


@dataclass(frozen=True)
class Operation:
    id: str
    role: Role
    action: Literal["send", "receive"]
    channel: str
    summary: str
    messages: tuple[str, ...] | None = None
    group: str | None = None
    reply: str | None = None


def _default(setting: str) -> str:
    value = Settings.model_fields[setting].default
    assert isinstance(value, str)
    return value


def all_operations() -> list[Operation]:
    workers = _default("kafka_consumer_group")
    dispatchers = _default("webhook_consumer_group")
    upstream_commands = ("register_account", "observe_auth_state", "deregister_account")
    return [
        Operation(
            "frontEndSendsPasskeyConfirm",
            "front-end",
            "send",
            "commands",
            "`POST .../passkey-confirm` becomes a command; the reply comes on auth.replies.",
            messages=("passkey_confirm",),
            reply="replies",
        ),
        Operation(
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
        Operation(
            "frontEndReceivesReplies",
            "front-end",
            "receive",
            "replies",
            "Each replica reads its own partition (its `reply-partition` header) and answers "
            "the waiting request.",
        ),
        Operation(
            "frontEndSendsEndpoints",
            "front-end",
            "send",
            "webhook_endpoints",
            "`/v1/webhook-endpoints` writes: create, update, rotate, delete (tombstone).",
        ),
        Operation(
            "frontEndReceivesEndpoints",
            "front-end",
            "receive",
            "webhook_endpoints",
            "The endpoint registry every replica keeps (every partition, no group).",
        ),
        Operation(
            "frontEndSendsPresence",
            "front-end",
            "send",
            "api_presence",
            "A heartbeat every 2 s and at each replay claim or release; a tombstone at stop.",
        ),
        Operation(
            "frontEndReceivesPresence",
            "front-end",
            "receive",
            "api_presence",
            "Every replica reads every replica's records (no group): the live count and the "
            "replays each holds.",
        ),
        Operation(
            "frontEndSendsIdempotency",
            "front-end",
            "send",
            "api_idempotency",
            "A confirm's claim of its `Idempotency-Key`, its answer, and tombstones of lost, "
            "failed or expired claims.",
        ),
        Operation(
            "frontEndReceivesIdempotency",
            "front-end",
            "receive",
            "api_idempotency",
            "Every replica reads every record (no group): the keys held and their answers.",
        ),
        Operation(
            "frontEndSendsReplays",
            "front-end",
            "send",
            "webhook_replays",
            "`POST .../replay`.",
        ),
        Operation(
            "frontEndReceivesDeliveries",
            "front-end",
            "receive",
            "webhook_deliveries",
            "`GET .../deliveries` reads the last records of the endpoint's partition on "
            "demand (no group, no permanent reader).",
        ),
        Operation(
            "upstreamSendsCommands",
            "upstream",
            "send",
            "commands",
            "Accounts enter and leave the flow; the provider reports progress.",
            messages=upstream_commands,
        ),
        Operation(
            "workerReceivesCommands",
            "worker",
            "receive",
            "commands",
            "The pool shares the partitions; each account is handled by one worker in order.",
            group=workers,
        ),
        Operation(
            "workerReceivesState",
            "worker",
            "receive",
            "state",
            "Restore: the owned partitions are read from the beginning on assignment.",
        ),
        Operation("workerSendsState", "worker", "send", "state", "After every change of a record."),
        Operation("workerSendsStatus", "worker", "send", "status", "On a real transition."),
        Operation("workerSendsErrors", "worker", "send", "errors", "On a failed command."),
        Operation(
            "workerSendsReplies",
            "worker",
            "send",
            "replies",
            "One per `passkey_confirm` and per `get_auth_state`.",
        ),
        Operation("workerSendsDeadLetters", "worker", "send", "dlq", "Undecodable commands."),
        Operation(
            "dispatcherReceivesStatus",
            "dispatcher",
            "receive",
            "status",
            "Status changes become `account.auth_status_changed` webhooks.",
            group=dispatchers,
        ),
        Operation(
            "dispatcherReceivesErrors",
            "dispatcher",
            "receive",
            "errors",
            "Errors become `account.auth_error` webhooks.",
            group=dispatchers,
        ),
        Operation(
            "dispatcherReceivesReplays",
            "dispatcher",
            "receive",
            "webhook_replays",
            "A replay reaches the lane of its account like the event did.",
            group=dispatchers,
        ),
        Operation(
            "dispatcherReceivesEndpoints",
            "dispatcher",
            "receive",
            "webhook_endpoints",
            "The endpoint registry (every partition, no group).",
        ),
        Operation(
            "dispatcherReceivesDeliveryState",
            "dispatcher",
            "receive",
            "webhook_state",
            "Restore: the owned partitions are read from the beginning on assignment.",
        ),
        Operation(
            "dispatcherSendsDeliveryState",
            "dispatcher",
            "send",
            "webhook_state",
            "Acknowledged before an event's offset is committed (durably scheduled).",
        ),
        Operation(
            "dispatcherSendsDeliveries",
            "dispatcher",
            "send",
            "webhook_deliveries",
            "Each state of each delivery.",
        ),
        Operation(
            "dispatcherSendsDeadLetters",
            "dispatcher",
            "send",
            "webhook_dlq",
            "A delivery that failed for good.",
        ),
        Operation(
            "dispatcherSendsEndpoints",
            "dispatcher",
            "send",
            "webhook_endpoints",
            "Disables an endpoint that answered 410 or kept failing.",
            messages=("webhook_endpoint",),
        ),
    ]


def operation_object(o: Operation, channels: dict[str, Channel]) -> dict[str, Any]:
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
