"""Composition root of a webhook dispatcher process (``python -m worker webhooks``): the
shared consume loop over the event topics, with the delivery states as its store. The
endpoints registry is read to its end first, so no event fans out against a partial view."""

from __future__ import annotations

import asyncio
import functools

from aiokafka import TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from worker.dispatcher.delivery import QueueLimits, parse_schedule
from worker.dispatcher.delivery_store import DeliveryStore
from worker.dispatcher.disabling import ProbeConfig
from worker.dispatcher.dispatch_ports import Ports, Sender
from worker.dispatcher.dispatcher import DispatchConfig, Dispatcher
from worker.dispatcher.endpoint_gate import GateConfig
from worker.dispatcher.metrics import WebhookMetrics
from worker.dispatcher.probing import Prober
from worker.dispatcher.publish import DeliveryPublisher
from worker.dispatcher.sender import Sender as HttpSender
from worker.dispatcher.sender import open_session
from worker.engine.home_partition import home_partition
from worker.engine.kafka import build_consumer, build_producer
from worker.engine.metrics import TailSkips
from worker.engine.runner import ProbeAddress, ProcessParts, consume_loop, run_consume_loop
from worker.runtime.logs import get_logger
from worker.runtime.metrics import WEBHOOK_PREFIX
from worker.settings import Settings
from worker.startup import DEFAULTS, RootOptions, prologue
from worker.webhooks.announcer import Announcer
from worker.webhooks.endpoint_writes import EndpointStore
from worker.webhooks.endpoints import EndpointsTail
from worker.webhooks.replay_scan import ReplayScan
from worker.webhooks.secrets_box import SecretsBox
from worker.webhooks.signing import headers as signed_headers
from worker.webhooks.targets import TargetPolicy

log = get_logger(__name__)

#: How long start-up waits for the endpoints registry to be read to its end.
ENDPOINTS_CATCH_UP_S = 60.0


def secrets_box(settings: Settings) -> SecretsBox:
    if settings.webhook_secrets_key is None:
        raise RuntimeError("WEBHOOK_SECRETS_KEY is not set (base64 of 32 random bytes)")
    return SecretsBox(settings.webhook_secrets_key.get_secret_value())


def gate_config(settings: Settings) -> GateConfig:
    """Each endpoint's share: a waiting pair's fallback wait is one attempt's time-out (by
    then a slot has been freed and its wake given, or the wake went nowhere)."""
    return GateConfig(
        max_in_flight=settings.webhook_endpoint_max_in_flight,
        workspace_max_in_flight=settings.webhook_workspace_max_in_flight,
        max_connections=settings.webhook_max_connections,
        backoff_after=settings.webhook_endpoint_backoff_after,
        backoff_base_s=settings.webhook_endpoint_backoff_base_s,
        backoff_max_s=max(
            settings.webhook_endpoint_backoff_max_s, settings.webhook_endpoint_backoff_base_s
        ),
        park_s=max(settings.webhook_timeout_s, 1.0),
    )


def queue_limits(settings: Settings) -> QueueLimits:
    return QueueLimits(
        max_pending=settings.webhook_pair_max_pending,
        max_bytes=settings.webhook_pair_max_bytes,
        max_pairs_per_endpoint=settings.webhook_max_pairs_per_endpoint,
        workspace_max_pending=settings.webhook_workspace_max_pending,
    )


async def run_dispatcher(
    settings: Settings, options: RootOptions = DEFAULTS, *, sender: Sender | None = None
) -> None:
    """One dispatcher of the pool, until SIGTERM/SIGINT (or ``stop``); raises on a fatal loop
    error, and ``TopicsMisconfigured`` before it starts when its topics are not as specified.
    ``sender`` replaces the HTTP sender built from settings (tests)."""
    box = secrets_box(settings)
    started = await prologue(settings, "dispatcher", options.registry)
    registry, health, kafka = started.registry, started.health, started.kafka
    config, topics = settings.loop_config("dispatcher"), settings.topics
    metrics = WebhookMetrics(registry)
    producer = build_producer(kafka)
    tail = EndpointsTail(build_consumer(kafka), topics.webhook_endpoints)
    registry.register(TailSkips(WEBHOOK_PREFIX, lambda: (tail,)))
    schedule = parse_schedule(settings.webhook_retry_schedule_s)
    session = None
    if sender is None:
        session = open_session(
            TargetPolicy.of(settings),
            max_connections=settings.webhook_max_connections,
            max_connections_per_host=settings.webhook_max_connections_per_host,
        )
        sender = HttpSender(
            session,
            timeout_s=settings.webhook_timeout_s,
            # A receiver's Retry-After never asks for more than the schedule's longest step.
            retry_after_max_s=max(schedule, default=0.0),
        )
    writer = EndpointStore(
        producer=producer,
        topic=topics.webhook_endpoints,
        registry=tail.registry,
        cipher=box,
        timeout_s=settings.webhook_store_timeout_s,
        overlap_s=settings.webhook_secret_overlap_s,
        health=health,
    )
    probe = ProbeConfig(
        first_s=settings.webhook_probe_first_s,
        max_s=max(settings.webhook_probe_max_s, settings.webhook_probe_first_s),
        for_s=settings.webhook_probe_for_s,
        max_in_flight=settings.webhook_probe_max_in_flight,
    )
    publisher = DeliveryPublisher(
        producer,
        state_topic=topics.webhook_state,
        log_topic=topics.webhook_deliveries,
        dlq_topic=topics.webhook_dlq,
        health=health,
        on_state=metrics.state_record_bytes.observe,
        log_flush_s=settings.webhook_log_flush_s,
    )
    announcer = Announcer(producer, topics.webhook_replays, health)
    ports = Ports(tail.registry, writer, sender, signed_headers, publisher, announcer)
    dispatcher = Dispatcher(
        store=DeliveryStore(workspace_of=tail.registry.workspace_of),
        ports=ports,
        endpoints_to_end=functools.partial(
            tail.read_to_end, timeout=settings.webhook_store_timeout_s
        ),
        config=DispatchConfig(
            status_topic=topics.status,
            replay_topic=topics.webhook_replays,
            schedule=schedule,
            disable_after_s=settings.webhook_disable_after_s,
            limits=queue_limits(settings),
            gate=gate_config(settings),
            hold_s=settings.webhook_take_in_hold_s,
            probe=probe,
        ),
        metrics=metrics,
    )
    # A re-enabled endpoint's missed events: scanned as the front-end's replays are.
    scan = ReplayScan(
        consumer_factory=lambda: build_consumer(kafka),
        producer=producer,
        topics=topics,
        health=health,
    )
    # An endpoint's probing is the member's holding the partition its operational events
    # are keyed to (its id on webhook.replays), as the producer's partitioner places them.
    plan = settings.topic_plan().specs
    replays = next(s.partitions for s in plan if s.name == topics.webhook_replays)
    prober = Prober(
        ports=ports,
        owns=lambda i: dispatcher.store.owns(home_partition(i.encode(), replays)),
        config=probe,
        scan=scan,
        progress=functools.partial(scan.publish, topics.api_presence),
    )
    # Pairs held now, read at scrape time (idle pairs are dropped, so this follows what is
    # pending, not every account ever delivered).
    metrics.store_accounts.set_function(lambda: float(len(dispatcher.store)))
    consumer = options.consumer(
        kafka,
        config,
        settings.webhook_consumer_group,
        # The same partition number of every input topic to one member: an account's events
        # and replays, and its delivery state, live on one partition number.
        partition_assignment_strategy=(RangePartitionAssignor,),
    )
    loop = consume_loop(kafka, config, consumer=consumer, handler=dispatcher, metrics=metrics)
    dispatcher.missed_first.replays_taken = lambda p: loop.completed(
        TopicPartition(topics.webhook_replays, p)
    )
    # A pair woken for a freed slot at its endpoint is looked for at once, not at the tick.
    dispatcher.store.sweep_soon = loop.sweep_soon
    await tail.start()

    # Without a current registry, events would be fanned out to a stale set of endpoints:
    # a dead tail stops the dispatcher, which then exits non-zero (restarted by Kubernetes).
    def tail_stopped(_: asyncio.Task[None]) -> None:
        log.error("endpoints_tail_stopped")
        loop.stop()

    tail.task.add_done_callback(tail_stopped)
    probing: asyncio.Task[None] | None = None
    try:
        if not await tail.wait_caught_up(ENDPOINTS_CATCH_UP_S):
            raise RuntimeError("the webhook endpoints topic could not be read to its end")
        probing = asyncio.create_task(prober.run())
        probes = ProbeAddress(
            settings.webhook_metrics_host, settings.webhook_metrics_port, "webhook-probes"
        )
        closers = () if session is None else (session.close,)
        await run_consume_loop(
            loop,
            ProcessParts(producer, registry, health, closers, also_ready=lambda: tail.running),
            options.run("dispatcher", settings.webhook_consumer_group, kafka.bootstrap, probes),
        )
    finally:
        tail.task.remove_done_callback(tail_stopped)
        if probing is not None:
            probing.cancel()
            await asyncio.gather(probing, return_exceptions=True)
        await tail.stop()
    if tail.failure is not None:
        raise RuntimeError("the webhook endpoints tail failed") from tail.failure
