"""Composition root of a worker process: build every client from settings, wire, run; nothing
else in the package builds a Kafka client, an HTTP client or a metrics registry."""

from __future__ import annotations

from dataclasses import fields

from worker.auth.execute import Executor
from worker.auth.flow import Policy
from worker.auth.metrics import WorkerMetrics
from worker.auth.provider import ProviderRegistry, build_http_client, build_registry
from worker.auth.publish import Publisher
from worker.auth.store import StateStore
from worker.auth.waits import WaitLimits
from worker.engine.home_partition import Router
from worker.engine.kafka import build_producer
from worker.engine.key_hash import KeyPartitioner
from worker.engine.runner import ProbeAddress, ProcessParts, consume_loop, run_consume_loop
from worker.settings import Settings
from worker.startup import DEFAULTS, RootOptions, prologue


def policy_from(settings: Settings, providers: set[str]) -> Policy:
    """The decision's knobs: the ``WORKER_``-prefixed settings of the same names."""
    knobs = {f.name: getattr(settings, f"worker_{f.name}") for f in fields(Policy)[1:]}
    return Policy(frozenset(providers), **knobs)  # ``providers``, the first field, apart


async def run_worker(
    settings: Settings,
    options: RootOptions = DEFAULTS,
    *,
    providers: ProviderRegistry | None = None,
) -> None:
    """One worker of the pool, until SIGTERM/SIGINT (or ``stop``); raises on a fatal loop error
    so the process exits non-zero. ``providers`` replaces the HTTP adapters (benchmark)."""
    started = await prologue(settings, "worker", options.registry)
    registry, health, kafka = started.registry, started.health, started.kafka
    config, topics = settings.loop_config("worker"), settings.topics
    metrics = WorkerMetrics(registry)
    producer = build_producer(kafka, partitioner=KeyPartitioner())
    http = build_http_client(settings)
    if providers is None:  # the benchmark passes an in-process provider instead
        providers = build_registry(
            settings, http, on_call=metrics.provider_call, on_retry=metrics.provider_retry
        )
    metrics.export_breakers(providers.breakers)
    consumer = options.consumer(kafka, config, settings.kafka_consumer_group)
    store = StateStore()
    # Read on scrape, as the dispatcher's: setting it after every write summed the store's
    # partitions once per command (bench/README.md, "Floors").
    metrics.store_accounts.set_function(lambda: float(len(store)))
    executor = Executor(
        store=store,
        publisher=Publisher(producer, topics, health),
        providers=providers,
        policy=policy_from(settings, set(providers)),
        metrics=metrics,
        router=Router(
            topics.commands,
            partitions_for_topic=consumer.partitions_for_topic,
            fallback=settings.commands_partitions,
        ),
        write_ahead=settings.worker_write_ahead_intent,
        wait_limits=WaitLimits(
            process=settings.worker_parked_waits_max,
            per_workspace=settings.worker_parked_waits_per_workspace,
            per_account=settings.worker_parked_waits_per_account,
        ),
    )
    worker = consume_loop(
        kafka,
        config,
        consumer=consumer,
        handler=executor,
        metrics=metrics,
        unordered=executor.unordered,
    )
    probes = ProbeAddress(
        settings.worker_metrics_host, settings.worker_metrics_port, "worker-probes"
    )
    await run_consume_loop(
        worker,
        ProcessParts(
            producer,
            registry,
            health,
            closers=(providers.aclose, http.aclose),
            # Parked long-polls are answered once the loop has ended, on the open producer.
            drains=(executor.waits.close,),
        ),
        options.run("worker", settings.kafka_consumer_group, kafka.bootstrap, probes),
    )
