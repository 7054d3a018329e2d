"""The channels of the AsyncAPI document: one per topic, what it holds, its cleanup policy
and the topics it is co-partitioned with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.contract.topics import COMPACTED
from worker.documents.asyncapi.components import KAFKA_BINDING_VERSION


@dataclass(frozen=True)
class Channel:
    """One topic: ``field`` is its ``Topics`` field, the channel id."""

    field: str
    description: str
    messages: tuple[str, ...]


def all_channels() -> list[Channel]:
    return [
        Channel(
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
        Channel(
            "state",
            "The worker's state store changelog: the latest record of each account, written "
            "by the worker owning its partition (single writer).",
            ("account_state",),
        ),
        Channel(
            "status",
            "One event per real change of `status`/`auth_status` (one per `version`).",
            ("auth_status_changed",),
        ),
        Channel(
            "errors",
            "One event per failed command and per dead-lettered record with a readable account.",
            ("auth_error",),
        ),
        Channel(
            "replies",
            "Exactly one reply per `passkey_confirm` and per `get_auth_state`.",
            ("reply",),
        ),
        Channel(
            "dlq",
            "Undecodable records of auth.commands, with the reason in headers.",
            ("dead_lettered_command",),
        ),
        Channel(
            "webhook_endpoints",
            "The webhook endpoints, keyed by endpoint id; a tombstone deletes. Secrets are "
            "sealed (AES-GCM) and never in clear.",
            ("webhook_endpoint", "webhook_endpoint_deleted"),
        ),
        Channel(
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
        Channel(
            "webhook_deliveries",
            "The delivery log: each state of each delivery (pending, delivered, failed), keyed "
            "by endpoint id, each entry after an attempt with that attempt and the body; read by "
            "`GET .../deliveries`. One record holds one entry, or the "
            "entries of one endpoint written within the dispatcher's flush window "
            "(`WEBHOOK_LOG_FLUSH_S`); readers accept both.",
            ("webhook_delivery", "webhook_delivery_batch"),
        ),
        Channel(
            "webhook_replays",
            "Requests to send one event again to one endpoint (`POST .../replay`), or one"
            " logged delivery with its body (`source` `webhook`: a resend or a test send).",
            ("webhook_replay",),
        ),
        Channel(
            "webhook_dlq",
            "Deliveries that failed for good, with why and where in headers.",
            ("webhook_dead_letter",),
        ),
        Channel(
            "api_presence",
            "The live front-end replicas (one partition): each writes its record every 2 s and "
            "when its replays change, and tombstones it when it stops. Each replica divides "
            "a workspace's rate by the live count and decides a replay claim in this order.",
            ("api_presence", "api_presence_ended"),
        ),
        Channel(
            "api_idempotency",
            "The confirms' `Idempotency-Key`s of the last 24 h (one partition): a request's "
            "claim of a key, then its answer under the same record key. Every replica reads "
            "every record; the first claim of a key in this order holds it.",
            ("api_idempotency", "api_idempotency_released"),
        ),
    ]


def channel_object(c: Channel, address: str, partners: list[str]) -> dict[str, Any]:
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
