"""The product's topics: their names (``Topics``, read from ``TOPIC_*``), how each is kept
(compacted, one partition, short-lived), which must be co-partitioned, and which process uses
which. ``topic_plan`` turns them into the engine's ``TopicPlan``, which ``python -m worker
topics`` and every process's start-up check hold the cluster to (docs/operations.md,
"Topics")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.engine.topics import TopicPlan, TopicSpec

__all__ = [
    "COMPACTED",
    "PROCESS_TOPICS",
    "SHORT_LIVED",
    "SINGLE_PARTITION",
    "Process",
    "TopicSizing",
    "Topics",
    "co_partitioned",
    "topic_plan",
    "topic_specs",
    "used_by",
]


class Topics(BaseSettings):
    """Topic names; configuration, never constants in code."""

    model_config = SettingsConfigDict(env_prefix="TOPIC_", extra="ignore")

    commands: str = "auth.commands"
    state: str = "auth.state"
    status: str = "auth.status"
    errors: str = "auth.errors"
    replies: str = "auth.replies"
    dlq: str = "auth.dlq"
    webhook_endpoints: str = "webhook.endpoints"
    webhook_deliveries: str = "webhook.deliveries"
    webhook_state: str = "webhook.delivery-state"
    webhook_replays: str = "webhook.replays"
    webhook_dlq: str = "webhook.dlq"
    api_presence: str = "api.presence"
    api_idempotency: str = "api.idempotency"

    def all(self) -> list[str]:
        """Every topic name, in field order."""
        return list(self.model_dump().values())


#: ``Topics`` fields of the topics compacted to the latest record per key: the changelogs of
#: the state stores, the endpoint registry and the front-ends' presence (docs/architecture.md,
#: "Topics and messages").
COMPACTED: Final = frozenset(
    {"state", "webhook_endpoints", "webhook_state", "api_presence", "api_idempotency"}
)
#: ``Topics`` fields of the topics with one partition: the front-ends' presence records, whose
#: one order decides which replica's claim of a workspace's last replay slot came first, and
#: the idempotency keys, whose one order decides which request of one key came first.
SINGLE_PARTITION: Final = frozenset({"api_presence", "api_idempotency"})
#: ``Topics`` fields of the streams whose records matter for minutes only (a reply is awaited
#: for ``API_REPLY_TIMEOUT_S``): ``KAFKA_REPLIES_RETENTION_MS``.
SHORT_LIVED: Final = frozenset({"replies"})

#: Which topics each process uses (``Topics`` fields); the front-end's webhook topics only when
#: its webhook routes are configured (``WEBHOOK_SECRETS_KEY``).
PROCESS_TOPICS: Final[Mapping[str, tuple[str, ...]]] = {
    "worker": ("commands", "state", "status", "errors", "replies", "dlq"),
    "api": ("commands", "replies", "api_presence", "api_idempotency"),
    "api-webhooks": (
        "webhook_endpoints",
        "webhook_deliveries",
        "webhook_replays",
        "status",
        "errors",
    ),
    "dispatcher": (
        "status",
        "errors",
        "webhook_replays",
        "webhook_state",
        "webhook_endpoints",
        "webhook_deliveries",
        "webhook_dlq",
        "api_presence",  # a recovered endpoint's replay progress, for the front-ends' board
    ),
}

Process = Literal["worker", "api", "dispatcher"]


@dataclass(frozen=True, slots=True)
class TopicSizing:
    """The deployment's choices for every topic (``COMMANDS_PARTITIONS``,
    ``OTHER_PARTITIONS``, ``KAFKA_REPLICATION_FACTOR``, ``KAFKA_MIN_INSYNC_REPLICAS``,
    ``KAFKA_RETENTION_MS``, ``KAFKA_REPLIES_RETENTION_MS``)."""

    commands_partitions: int
    other_partitions: int
    replication_factor: int
    min_insync_replicas: int
    retention_ms: int
    replies_retention_ms: int


def topic_specs(names: Topics, sizing: TopicSizing) -> list[TopicSpec]:
    """Every topic's intended configuration, in ``Topics.all()`` order. Commands and state share
    ``COMMANDS_PARTITIONS`` (co-partitioned); ``api.presence`` has one; the others have
    ``OTHER_PARTITIONS``."""
    by_field = names.model_dump()
    specs = []
    for name_field in Topics.model_fields:
        common = {"min.insync.replicas": str(sizing.min_insync_replicas)}
        if name_field in COMPACTED:
            configs = {"cleanup.policy": "compact"} | common
        else:
            retention = (
                sizing.replies_retention_ms if name_field in SHORT_LIVED else sizing.retention_ms
            )
            configs = {"cleanup.policy": "delete", "retention.ms": str(retention)} | common
        partitions = (
            sizing.commands_partitions
            if name_field in ("commands", "state")
            else 1
            if name_field in SINGLE_PARTITION
            else sizing.other_partitions
        )
        specs.append(
            TopicSpec(
                name=by_field[name_field],
                topic_field=name_field,
                partitions=partitions,
                replication_factor=sizing.replication_factor,
                configs=configs,
            )
        )
    return specs


def co_partitioned(names: Topics) -> list[tuple[str, ...]]:
    """Topics whose partition numbers must line up: the worker's commands and its state; the
    dispatcher's inputs (events, replays) and its delivery states."""
    t = names
    return [
        (t.commands, t.state),
        (t.status, t.errors, t.webhook_replays, t.webhook_state),
    ]


def topic_plan(names: Topics, sizing: TopicSizing) -> TopicPlan:
    """Every topic of the product, for the engine to create and check."""
    return TopicPlan(tuple(topic_specs(names, sizing)), tuple(co_partitioned(names)))


def used_by(names: Topics, process: Process, *, webhooks: bool = False) -> list[str]:
    """The names of the topics ``process`` reads or writes; ``webhooks``: the front-end serves
    its webhook routes (``WEBHOOK_SECRETS_KEY`` is set)."""
    fields = list(PROCESS_TOPICS[process])
    if process == "api" and webhooks:
        fields += PROCESS_TOPICS["api-webhooks"]
    by_field = names.model_dump()
    return list(dict.fromkeys(by_field[f] for f in fields))
