"""Kafka client construction and topic set-up, from settings; one place for TLS/SASL.

Clients are built at start-up and passed in; nothing here is module-level state.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from worker.settings import Settings


def client_options(settings: Settings) -> dict[str, Any]:
    """Connection options shared by producers, consumers and the admin client."""
    opts: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap,
        "security_protocol": settings.kafka_security_protocol,
        "request_timeout_ms": settings.kafka_request_timeout_ms,
    }
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        ctx = ssl.create_default_context(
            cafile=str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
        )
        if settings.kafka_ssl_certfile:
            ctx.load_cert_chain(
                str(settings.kafka_ssl_certfile),
                str(settings.kafka_ssl_keyfile) if settings.kafka_ssl_keyfile else None,
            )
        opts["ssl_context"] = ctx
    if settings.kafka_security_protocol.startswith("SASL"):
        opts["sasl_mechanism"] = settings.kafka_sasl_mechanism or "PLAIN"
        opts["sasl_plain_username"] = settings.kafka_sasl_username
        opts["sasl_plain_password"] = settings.kafka_sasl_password
    return opts


def build_producer(settings: Settings, **overrides: Any) -> AIOKafkaProducer:
    """acks=all always; the idempotent producer only where the broker supports it (real
    Kafka), because the embedded broker fails InitProducerId (docs/architecture.md, "The
    embedded broker")."""
    opts = client_options(settings) | {
        "acks": "all",
        "enable_idempotence": settings.kafka_idempotent_producer,
        "linger_ms": 2,
        "max_batch_size": 256 * 1024,
    }
    return AIOKafkaProducer(**(opts | overrides))


def build_consumer(settings: Settings, *topics: str, **overrides: Any) -> AIOKafkaConsumer:
    """Manual commits only: an offset is committed after its effects are published.

    A group member's JoinGroup request is held by the coordinator until the rebalance
    completes (up to ``rebalance_timeout_ms``), and aiokafka bounds it by the request timeout:
    for a member the request timeout is never below the rebalance timeout + 5 s (the Java
    client's rule), however short ``KAFKA_REQUEST_TIMEOUT_MS`` is.
    """
    opts = client_options(settings) | {
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": "read_uncommitted",
        "fetch_max_wait_ms": settings.kafka_fetch_max_wait_ms,
    }
    if "group_id" in overrides:
        rebalance_ms = overrides.get("rebalance_timeout_ms") or overrides.get(
            "session_timeout_ms", settings.kafka_session_timeout_ms
        )
        opts["request_timeout_ms"] = max(opts["request_timeout_ms"], int(rebalance_ms) + 5_000)
    return AIOKafkaConsumer(*topics, **(opts | overrides))


def topic_partitions(settings: Settings) -> dict[str, int]:
    """Commands and state share a partition count: a worker restores the state of exactly the
    command partitions it owns (co-partitioning)."""
    t = settings.topics
    counts = {name: settings.other_partitions for name in t.all()}
    counts[t.commands] = settings.commands_partitions
    counts[t.state] = settings.commands_partitions
    return counts


def co_partitioned(settings: Settings) -> list[tuple[str, ...]]:
    """Topics whose partition numbers must line up: the worker's commands and its state; the
    dispatcher's inputs (events, replays) and its delivery states."""
    t = settings.topics
    return [
        (t.commands, t.state),
        (t.status, t.errors, t.webhook_replays, t.webhook_state),
    ]


async def ensure_topics(settings: Settings, *, attempts: int = 50) -> dict[str, int]:
    """Create missing topics; verify the co-partitioning of existing ones."""
    wanted = topic_partitions(settings)
    async with _admin(settings, attempts) as admin:
        await _create_missing(admin, wanted)
        for group in co_partitioned(settings):
            described = await admin.describe_topics(list(group))
            counts = {d["topic"]: len(d["partitions"]) for d in described}
            if len(set(counts.values())) != 1:
                raise RuntimeError(
                    f"{', '.join(group)} must have the same partition count (co-partitioned), "
                    f"found {counts}"
                )
    return wanted


async def create_topics(
    settings: Settings, wanted: Mapping[str, int], *, attempts: int = 50
) -> None:
    """Create those of ``wanted`` (name → partition count) that are missing."""
    async with _admin(settings, attempts) as admin:
        await _create_missing(admin, wanted)


async def partition_counts(
    settings: Settings, topics: list[str], *, attempts: int = 5
) -> dict[str, int]:
    """The partition count of each of ``topics`` that exists (missing ones are left out)."""
    async with _admin(settings, attempts) as admin:
        described = await admin.describe_topics(topics)
    return {
        d["topic"]: len(d["partitions"])
        for d in described
        if d.get("error_code") == 0 and d.get("partitions")
    }


@contextlib.asynccontextmanager
async def _admin(settings: Settings, attempts: int) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client; the broker may still be coming up, so connecting is retried."""
    admin = AIOKafkaAdminClient(**client_options(settings))
    for attempt in range(attempts):
        try:
            await admin.start()
            break
        except KafkaConnectionError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.1)
    try:
        yield admin
    finally:
        await admin.close()


async def _create_missing(admin: AIOKafkaAdminClient, wanted: Mapping[str, int]) -> None:
    existing = set(await admin.list_topics())
    missing = [
        NewTopic(name, n, replication_factor=1)
        for name, n in wanted.items()
        if name not in existing
    ]
    if missing:
        # another process may win the race; that is fine
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics(missing)
