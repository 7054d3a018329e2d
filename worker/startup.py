"""The start-up prologue every composition root runs first (worker, dispatcher, front-end): the
process's metrics registry with the standard families, its broker-health state exported on it,
and its topics checked against the plan (created when ``KAFKA_AUTO_CREATE_TOPICS``), so no
process starts against topics that are not as specified (docs/architecture.md, "The process
model")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry

from worker.contract.topics import Process, used_by
from worker.engine.broker_health import BrokerHealth
from worker.engine.kafka import KafkaConfig, verify_topics
from worker.runtime import tracing
from worker.runtime.metrics import API_PREFIX, WEBHOOK_PREFIX, WORKER_PREFIX, export_process_metrics
from worker.settings import Settings

#: Each process's service name (traces, ``passkey_build_info``) and metric prefix.
_NAMES: Final = {
    "worker": (tracing.SERVICE_WORKER, WORKER_PREFIX),
    "dispatcher": (tracing.SERVICE_WEBHOOKS, WEBHOOK_PREFIX),
    "api": (tracing.SERVICE_API, API_PREFIX),
}


@dataclass(frozen=True, slots=True)
class Started:
    registry: CollectorRegistry
    health: BrokerHealth
    kafka: KafkaConfig


async def prologue(
    settings: Settings,
    process: Process,
    registry: CollectorRegistry | None = None,
    *,
    webhooks: bool = False,
) -> Started:
    """``registry`` (a new one if None) with the process families and broker health, and the
    process's topics verified; raises ``TopicsMisconfigured`` when they are not as specified.
    ``webhooks``: the front-end serves its webhook routes (``used_by``)."""
    registry = registry if registry is not None else CollectorRegistry()
    service, prefix = _NAMES[process]
    export_process_metrics(registry, service)
    health = BrokerHealth(settings.kafka_outage_tolerance_s, name=process)
    health.export(registry, prefix)
    kafka = settings.kafka_config()
    await verify_topics(
        kafka,
        settings.topic_plan(),
        used_by(settings.topics, process, webhooks=webhooks),
        create=settings.kafka_auto_create_topics,
    )
    return Started(registry, health, kafka)
