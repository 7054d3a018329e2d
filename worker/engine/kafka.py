"""Kafka client construction (one place for TLS/SASL) and topic set-up, from settings: the
admin I/O of ``worker.engine.topics``. Clients are built at start-up and passed in."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    TopicAlreadyExistsError,
    for_code,
)

from worker.engine.topics import (
    Finding,
    TopicObservation,
    TopicsMisconfigured,
    TopicSpec,
    check,
    co_partitioned,
    problems,
    topic_specs,
)
from worker.runtime.logs import get_logger
from worker.runtime.process import Misconfigured
from worker.settings import Settings

log = get_logger(__name__)


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


#: What builds a consumer: ``AIOKafkaConsumer``, or a subclass the development tools inject
#: (``devstack.consumer``) for the embedded broker.
ConsumerClass = type[AIOKafkaConsumer]


def build_consumer(
    settings: Settings,
    *topics: str,
    consumer_class: ConsumerClass = AIOKafkaConsumer,
    **overrides: Any,
) -> AIOKafkaConsumer:
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
    return consumer_class(*topics, **(opts | overrides))


async def ensure_topics(settings: Settings, *, attempts: int = 50) -> list[Finding]:
    """Create every missing topic with its configuration, then check them all; raises
    ``TopicsMisconfigured`` when one is not as specified (an existing topic is never altered).
    The dev stack and the tests set up their topics with it."""
    findings = await topics_report(settings, create=True, attempts=attempts)
    _raise_on_problems(findings)
    return findings


async def verify_topics(
    settings: Settings, names: Sequence[str], *, attempts: int = 50
) -> list[Finding]:
    """A process's start-up check of the topics it uses (``worker.engine.topics.used_by``): missing
    ones are created only with ``KAFKA_AUTO_CREATE_TOPICS``; raises ``TopicsMisconfigured``,
    naming each topic and setting that is wrong, so the process refuses to start."""
    findings = await topics_report(
        settings, names, create=settings.kafka_auto_create_topics, attempts=attempts
    )
    _raise_on_problems(findings)
    return findings


async def topics_report(
    settings: Settings,
    names: Sequence[str] | None = None,
    *,
    create: bool,
    attempts: int = 50,
) -> list[Finding]:
    """The findings of checking ``names`` (default: every topic), after creating the missing
    ones when ``create``. Co-partitioning is checked among the named topics of each group."""
    specs = topic_specs(settings)
    if names is not None:
        wanted = set(names)
        specs = [s for s in specs if s.name in wanted]
    async with _admin(settings, attempts) as admin:
        if create:
            await _create_missing(admin, specs)
        observed = await observe_topics(admin, [s.name for s in specs])
    return check(specs, observed, co_partitioned(settings))


async def observe_topics(
    admin: AIOKafkaAdminClient, names: Sequence[str]
) -> dict[str, TopicObservation | None]:
    """What the cluster says of ``names``: partition count, replication factor, configs;
    ``None`` for a missing topic.

    Only topics already listed are described: a Metadata request naming a missing topic
    creates it, with the broker's defaults, on a cluster with ``auto.create.topics.enable``
    (and always on the embedded broker). Every config is asked for: the embedded broker drops
    the connection on a DescribeConfigs that names the configs it wants.
    """
    existing = set(await admin.list_topics())
    present = [n for n in names if n in existing]
    observed: dict[str, TopicObservation | None] = dict.fromkeys(names)
    if not present:
        return observed
    configs = await _describe_configs(admin, present)
    for meta in await admin.describe_topics(present):
        name, partitions = meta["topic"], meta["partitions"]
        if meta["error_code"] or not partitions:
            continue  # deleted since it was listed
        topic_configs, error = configs.get(name, (None, "not in the DescribeConfigs answer"))
        observed[name] = TopicObservation(
            name=name,
            partitions=len(partitions),
            replication_factor=min(len(p["replicas"]) for p in partitions),
            configs=topic_configs,
            configs_error=error,
        )
    return observed


async def _describe_configs(
    admin: AIOKafkaAdminClient, names: Sequence[str]
) -> dict[str, tuple[dict[str, str] | None, str | None]]:
    """name → (configs, None), or (None, why) where the broker refused to say."""
    resources = [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
    try:
        responses = await admin.describe_configs(resources)
    except KafkaError as exc:
        return dict.fromkeys(names, (None, f"DescribeConfigs failed: {exc!r}"))
    out: dict[str, tuple[dict[str, str] | None, str | None]] = {}
    for response in responses:
        for res in response.to_object()["resources"]:
            if res["error_code"]:
                error = for_code(res["error_code"]).__name__
                out[res["resource_name"]] = (None, f"DescribeConfigs: {error}")
                continue
            out[res["resource_name"]] = (
                {
                    e["config_names"]: e["config_value"]
                    for e in res["config_entries"]
                    if e["config_value"] is not None
                },
                None,
            )
    return out


def _raise_on_problems(findings: Sequence[Finding]) -> None:
    wrong = problems(findings)
    if wrong:
        raise TopicsMisconfigured(
            wrong,
            hint="`python -m worker topics check` prints every topic; `topics create` makes "
            "the missing ones; an existing topic is fixed with the platform's tooling",
        )


async def create_topics(
    settings: Settings, wanted: Mapping[str, int], *, attempts: int = 50
) -> None:
    """Create those of ``wanted`` (name → partition count) that are missing, with the broker's
    defaults: the benchmark's own topics, not the product's (``ensure_topics``)."""
    specs = [
        TopicSpec(name, name, n, settings.kafka_replication_factor, {})
        for name, n in wanted.items()
    ]
    async with _admin(settings, attempts) as admin:
        await _create_missing(admin, specs)


class TopicsNotCreated(Misconfigured):
    """The cluster refused to create a topic (replication factor above the broker count, a
    policy, an invalid config): a configuration error, not an outage."""


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


async def _create_missing(admin: AIOKafkaAdminClient, specs: Sequence[TopicSpec]) -> list[str]:
    """Create the missing ones of ``specs`` with their configuration; returns their names.
    Another process creating one first is fine; any other refusal raises."""
    existing = set(await admin.list_topics())
    missing = [
        NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=dict(s.configs))
        for s in specs
        if s.name not in existing
    ]
    if not missing:
        return []
    response = await admin.create_topics(missing)
    failed = []
    for name, code, *message in response.topic_errors:  # (topic, code[, message]) by version
        error = for_code(code)
        if code and error is not TopicAlreadyExistsError:
            failed.append(f"{name}: {error.__name__} {message[0] if message else ''}".rstrip())
    if failed:
        raise TopicsNotCreated("could not create " + "; ".join(failed))
    log.info("topics_created", topics=[t.name for t in missing])
    return [t.name for t in missing]
