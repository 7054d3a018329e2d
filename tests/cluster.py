"""The Kafka the suite runs against: the embedded broker it starts, or an existing cluster named
by ``KAFKA_BOOTSTRAP_SERVERS`` (README, "Running against an existing cluster").

On an existing cluster every topic and consumer group a test makes carries this session's
``RUN`` token, so two runs (or a pid reused by a later one) never share a topic, and the
session deletes its topics at the end (``delete_session_topics``). Consumer groups cannot be
deleted through aiokafka's admin client; Kafka drops empty ones after
``offsets.retention.minutes`` (7 days by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from dataclasses import dataclass
from typing import Final

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from worker.engine.kafka import client_options
from worker.settings import Settings

#: This session's token in every topic and group name the fixtures make.
RUN: Final = uuid.uuid4().hex[:8]

#: Topic-configuration settings the fixtures give the embedded broker (one broker, so one
#: replica) unless the environment sets them for an existing cluster.
SINGLE_BROKER: Final = {"KAFKA_REPLICATION_FACTOR": "1", "KAFKA_MIN_INSYNC_REPLICAS": "1"}


@dataclass(frozen=True, slots=True)
class ExistingCluster:
    """A cluster the suite did not start: ``KAFKA_BOOTSTRAP_SERVERS``, with the
    ``KAFKA_SECURITY_PROTOCOL`` / ``KAFKA_SASL_*`` / ``KAFKA_SSL_*`` of the environment."""

    bootstrap: str


def existing_cluster() -> ExistingCluster | None:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    return ExistingCluster(bootstrap) if bootstrap else None


def topic_settings() -> dict[str, object]:
    """Overrides of the fixtures' settings for topic creation and checks: created on demand
    (``KAFKA_AUTO_CREATE_TOPICS``), one replica on the embedded broker, the environment's
    replication on an existing cluster."""
    values: dict[str, object] = {"kafka_auto_create_topics": True}
    for var, value in SINGLE_BROKER.items():
        if var not in os.environ:
            values[var.lower()] = int(value)
    return values


def kafka_env(settings: Settings) -> dict[str, str]:
    """The ``KAFKA_*`` variables of a child process bound to ``settings``' cluster and topic
    configuration (children get a scrubbed environment, so the connection's security settings
    and the topic check's expectations are passed on explicitly). No secret is logged: this is
    an environment, never a log line."""
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap,
        "KAFKA_SECURITY_PROTOCOL": settings.kafka_security_protocol,
        "KAFKA_AUTO_CREATE_TOPICS": str(settings.kafka_auto_create_topics).lower(),
        "KAFKA_REPLICATION_FACTOR": str(settings.kafka_replication_factor),
        "KAFKA_MIN_INSYNC_REPLICAS": str(settings.kafka_min_insync_replicas),
        "KAFKA_RETENTION_MS": str(settings.kafka_retention_ms),
        "KAFKA_REPLIES_RETENTION_MS": str(settings.kafka_replies_retention_ms),
        "KAFKA_IDEMPOTENT_PRODUCER": str(settings.kafka_idempotent_producer).lower(),
        "KAFKA_OFFSET_GAP_HOLD_S": str(settings.kafka_offset_gap_hold_s),
    }
    optional = {
        "KAFKA_SASL_MECHANISM": settings.kafka_sasl_mechanism,
        "KAFKA_SASL_USERNAME": settings.kafka_sasl_username,
        "KAFKA_SASL_PASSWORD": settings.kafka_sasl_password,
        "KAFKA_SSL_CAFILE": settings.kafka_ssl_cafile,
        "KAFKA_SSL_CERTFILE": settings.kafka_ssl_certfile,
        "KAFKA_SSL_KEYFILE": settings.kafka_ssl_keyfile,
    }
    env.update({k: str(v) for k, v in optional.items() if v is not None})
    return env


async def delete_session_topics(bootstrap: str, *, timeout_s: float = 30.0) -> list[str]:
    """Delete every topic whose name carries ``RUN``; returns their names. Best effort: a
    failure is reported, never raised, so it cannot hide the session's own result."""
    settings = Settings(kafka_bootstrap_servers=bootstrap)
    admin = AIOKafkaAdminClient(**client_options(settings.kafka_config()))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        mine = [t for t in await admin.list_topics() if RUN in t]
        if mine:
            await asyncio.wait_for(admin.delete_topics(mine), timeout_s)
        return mine
    except (KafkaError, TimeoutError) as exc:
        print(f"tests/cluster.py: could not delete this session's topics ({RUN}): {exc!r}")
        return []
    finally:
        with contextlib.suppress(KafkaError):
            await admin.close()
