"""Kafka client construction (one place for TLS/SASL) and topic set-up: the admin I/O of
``worker.engine.topics``. Everything here takes a ``KafkaConfig``, built once by a process's
composition root; clients are built at start-up and passed in."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
    TopicPlan,
    TopicsMisconfigured,
    TopicSpec,
    check,
    problems,
)
from worker.runtime.logs import get_logger
from worker.runtime.process import Misconfigured

log = get_logger(__name__)


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """How every client of a process reaches the cluster, and the client-side timeouts they
    share. The defaults are aiokafka's and the settings' (``KAFKA_*``, docs/configuration.md)."""

    bootstrap: str
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    request_timeout_ms: int = 40_000
    fetch_max_wait_ms: int = 500
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    idempotent_producer: bool = False
    offset_gap_hold_s: float = 0.0
    """How long a reader of a topic with dense offsets holds back a record past an offset it
    never saw (``worker.engine.fetch.GapWatch``); 0: no watch (Kafka has no such gap)."""


def client_options(kafka: KafkaConfig) -> dict[str, Any]:
    """Connection options shared by producers, consumers and the admin client."""
    opts: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap,
        "security_protocol": kafka.security_protocol,
        "request_timeout_ms": kafka.request_timeout_ms,
    }
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        ctx = ssl.create_default_context(cafile=str(kafka.ssl_cafile) if kafka.ssl_cafile else None)
        if kafka.ssl_certfile:
            ctx.load_cert_chain(
                str(kafka.ssl_certfile),
                str(kafka.ssl_keyfile) if kafka.ssl_keyfile else None,
            )
        opts["ssl_context"] = ctx
    if kafka.security_protocol.startswith("SASL"):
        opts["sasl_mechanism"] = kafka.sasl_mechanism or "PLAIN"
        opts["sasl_plain_username"] = kafka.sasl_username
        opts["sasl_plain_password"] = kafka.sasl_password
    return opts


def build_producer(kafka: KafkaConfig, **overrides: Any) -> AIOKafkaProducer:
    """acks=all always; the idempotent producer only where the broker supports it (real
    Kafka), because the embedded broker fails InitProducerId (docs/architecture.md, "The
    embedded broker")."""
    opts = client_options(kafka) | {
        "acks": "all",
        "enable_idempotence": kafka.idempotent_producer,
        "linger_ms": 2,
        "max_batch_size": 256 * 1024,
    }
    return AIOKafkaProducer(**(opts | overrides))


#: What builds a consumer: ``AIOKafkaConsumer``, or a subclass the development tools inject
#: (``devstack.consumer``) for the embedded broker.
ConsumerClass = type[AIOKafkaConsumer]


def build_consumer(
    kafka: KafkaConfig,
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
    opts = client_options(kafka) | {
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": "read_uncommitted",
        "fetch_max_wait_ms": kafka.fetch_max_wait_ms,
    }
    if "group_id" in overrides:
        rebalance_ms = overrides.get("rebalance_timeout_ms") or overrides.get(
            "session_timeout_ms", kafka.session_timeout_ms
        )
        opts["request_timeout_ms"] = max(opts["request_timeout_ms"], int(rebalance_ms) + 5_000)
    return consumer_class(*topics, **(opts | overrides))


async def ensure_topics(
    kafka: KafkaConfig, plan: TopicPlan, *, attempts: int = 50
) -> list[Finding]:
    """Create every missing topic of ``plan`` with its configuration, then check them all (an
    existing topic is never altered): how the dev stack and the tests set up their topics."""
    return await verify_topics(kafka, plan, None, create=True, attempts=attempts)


async def verify_topics(
    kafka: KafkaConfig,
    plan: TopicPlan,
    names: Sequence[str] | None,
    *,
    create: bool,
    attempts: int = 50,
) -> list[Finding]:
    """A process's start-up check of the topics it uses (``names``; ``None``: all): missing
    ones are created only when ``create`` (``KAFKA_AUTO_CREATE_TOPICS``); raises
    ``TopicsMisconfigured``, naming each topic and setting that is wrong, so the process
    refuses to start."""
    findings = await topics_report(kafka, plan, names, create=create, attempts=attempts)
    wrong = problems(findings)
    if wrong:
        raise TopicsMisconfigured(
            wrong,
            hint="`python -m worker topics check` prints every topic; `topics create` makes "
            "the missing ones; an existing topic is fixed with the platform's tooling",
        )
    return findings


async def topics_report(
    kafka: KafkaConfig,
    plan: TopicPlan,
    names: Sequence[str] | None = None,
    *,
    create: bool,
    attempts: int = 50,
) -> list[Finding]:
    """The findings of checking ``names`` of ``plan`` (default: every topic), after creating
    the missing ones when ``create``. Co-partitioning is checked among the named topics of
    each group."""
    plan = plan.only(names)
    async with _admin(kafka, attempts) as admin:
        if create:
            await _create_missing(admin, plan.specs)
        observed = await observe_topics(admin, [s.name for s in plan.specs])
    return check(plan.specs, observed, plan.co_partitioned)


async def observe_topics(
    admin: AIOKafkaAdminClient, names: Sequence[str]
) -> dict[str, TopicObservation | None]:
    """What the cluster says of ``names`` (``None``: missing). Only listed topics are
    described: naming a missing one may create it (``auto.create.topics.enable``, and always
    on the embedded broker). Every config is asked for: the embedded broker drops the
    connection on a DescribeConfigs that names the ones it wants."""
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
            entries = [(e["config_names"], e["config_value"]) for e in res["config_entries"]]
            out[res["resource_name"]] = ({k: v for k, v in entries if v is not None}, None)
    return out


async def create_topics(
    kafka: KafkaConfig,
    wanted: Mapping[str, int],
    *,
    replication_factor: int,
    attempts: int = 50,
) -> None:
    """Create those of ``wanted`` (name → partition count) that are missing, with the broker's
    defaults: the benchmark's own topics, not the product's (``ensure_topics``)."""
    specs = [TopicSpec(name, name, n, replication_factor, {}) for name, n in wanted.items()]
    async with _admin(kafka, attempts) as admin:
        await _create_missing(admin, specs)


class TopicsNotCreated(Misconfigured):
    """The cluster refused to create a topic (replication factor above the broker count, a
    policy, an invalid config): a configuration error, not an outage."""


async def partition_counts(
    kafka: KafkaConfig, topics: list[str], *, attempts: int = 5
) -> dict[str, int]:
    """The partition count of each of ``topics`` that exists (missing ones are left out)."""
    async with _admin(kafka, attempts) as admin:
        described = await admin.describe_topics(topics)
    return {
        d["topic"]: len(d["partitions"])
        for d in described
        if d.get("error_code") == 0 and d.get("partitions")
    }


@contextlib.asynccontextmanager
async def _admin(kafka: KafkaConfig, attempts: int) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client; the broker may still be coming up, so connecting is retried."""
    admin = AIOKafkaAdminClient(**client_options(kafka))
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


async def _create_missing(admin: AIOKafkaAdminClient, specs: Sequence[TopicSpec]) -> None:
    """Create the missing ones of ``specs`` with their configuration. Another process creating
    one first is fine; any other refusal raises."""
    existing = set(await admin.list_topics())
    missing = [
        NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=dict(s.configs))
        for s in specs
        if s.name not in existing
    ]
    if not missing:
        return
    response = await admin.create_topics(missing)
    failed = []
    for name, code, *message in response.topic_errors:  # (topic, code[, message]) by version
        error = for_code(code)
        if code and error is not TopicAlreadyExistsError:
            failed.append(f"{name}: {error.__name__} {message[0] if message else ''}".rstrip())
    if failed:
        raise TopicsNotCreated("could not create " + "; ".join(failed))
    log.info("topics_created", topics=[t.name for t in missing])
