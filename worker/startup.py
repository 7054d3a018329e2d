"""The start-up prologue every composition root runs first: metrics registry, broker health, and the
topics checked against the plan, so no process starts against topics not as specified."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from worker.contract.topics import Process, used_by
from worker.engine.broker_health import BrokerHealth
from worker.engine.consume_loop import ConsumeLoop, LoopConfig
from worker.engine.kafka import ConsumerClass, KafkaConfig, verify_topics
from worker.engine.runner import ProbeAddress, RunOptions, group_consumer
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
class RootOptions:
    """How a consuming composition root (``run_worker``, ``run_dispatcher``) is embedded; the
    defaults are the process's own. Tests, the benchmark and the dev stack pass their registry,
    ``stop`` event, no signal handlers or probes, an ``on_start`` hook or another group
    consumer class (``worker.engine.kafka.ConsumerClass``)."""

    registry: CollectorRegistry | None = None
    stop: asyncio.Event | None = None
    install_signals: bool = True
    serve_probes: bool = True
    on_start: Callable[[ConsumeLoop], None] | None = None
    consumer_class: ConsumerClass = AIOKafkaConsumer

    def consumer(
        self, kafka: KafkaConfig, config: LoopConfig, group: str, **extra: Any
    ) -> AIOKafkaConsumer:
        """The consume loop's group consumer (``group_consumer``), of ``consumer_class``."""
        return group_consumer(kafka, config, group, consumer_class=self.consumer_class, **extra)

    def run(self, name: str, group: str, bootstrap: str, probes: ProbeAddress) -> RunOptions:
        """The consume loop's ``RunOptions``; ``probes`` served only when ``serve_probes``."""
        return RunOptions(
            name=name,
            group=group,
            bootstrap=bootstrap,
            probes=probes if self.serve_probes else None,
            install_signals=self.install_signals,
            stop=self.stop,
            on_start=self.on_start,
        )


#: As ``python -m worker`` runs a root: a new registry, signal handlers, probes served.
DEFAULTS: Final = RootOptions()


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
