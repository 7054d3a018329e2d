"""The life of a consuming process (worker, webhook dispatcher): serve the probes, start the
clients, run the consume loop until a stop signal, then close every client within a bound
(docs/architecture.md, "Bounded shutdown"; docs/operations.md, "Kafka outages")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from worker.engine.broker_health import BrokerHealth, metadata_probe
from worker.engine.consume_loop import FINAL_COMMIT_TIMEOUT_S, ConsumeLoop, LoopConfig
from worker.engine.handler import Handler
from worker.engine.kafka import ConsumerClass, KafkaConfig, build_consumer
from worker.engine.metrics import LoopSeries
from worker.runtime.eventloop import running_loop_name
from worker.runtime.logs import get_logger
from worker.runtime.probes import build_probe_app
from worker.runtime.process import on_stop_signals
from worker.runtime.serving import serving
from worker.runtime.shutdown import bounded, graceful_then_forced

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ProbeAddress:
    host: str
    port: int
    name: str


@dataclass(frozen=True, slots=True)
class ProcessParts:
    """The clients a consuming process runs its loop with, built by the caller:
    ``run_consume_loop`` starts ``producer`` and the consumer and closes them at the end, then
    runs ``closers``; ``drains`` run after the loop, before the clients close (answers still
    owed go out on the open producer). ``health`` is probed through the producer's client and
    turns ``/readyz`` red during an outage, as ``also_ready`` (the process's other conditions)
    does when false; ``registry`` is what ``/metrics`` serves."""

    producer: AIOKafkaProducer
    registry: CollectorRegistry
    health: BrokerHealth
    closers: Sequence[Callable[[], Awaitable[None]]] = ()
    drains: Sequence[Callable[[], Awaitable[None]]] = ()
    also_ready: Callable[[], bool] = lambda: True


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How one run of a consume loop is named (``name``: of its start and stop log events;
    ``group``, ``bootstrap``: for the start log), served (``probes``; ``None``: none) and
    stopped (``stop`` set: as by a signal); ``on_start`` runs once the clients started."""

    name: str
    group: str
    bootstrap: str
    probes: ProbeAddress | None = None
    install_signals: bool = True
    stop: asyncio.Event | None = None
    on_start: Callable[[ConsumeLoop], None] | None = None


async def run_consume_loop(loop: ConsumeLoop, parts: ProcessParts, run: RunOptions) -> None:
    """Run ``loop`` with its clients until it stops; raises when the loop failed or Kafka
    stayed unreachable past the tolerance. A stop signal drains for the loop's
    ``shutdown_grace_s`` before the forced exit's watchdog (``shutdown_hard_limit``)."""
    consumer, producer, health = loop.consumer, parts.producer, parts.health
    served: contextlib.AbstractAsyncContextManager[object] = contextlib.nullcontext()
    if run.probes is not None:
        also_ready = parts.also_ready
        app = build_probe_app(
            parts.registry,
            last_beat=lambda: loop.last_beat,
            ready=lambda: loop.ready and health.reachable and also_ready(),
        )
        served = serving(app, host=run.probes.host, port=run.probes.port, name=run.probes.name)
    # Installed for the whole run, close steps included: a second signal during them still
    # exits at once (130).
    on_signal = graceful_then_forced(
        loop.stop, hard_limit_s=shutdown_hard_limit(loop.config.shutdown_grace_s)
    )
    with on_stop_signals(on_signal, enabled=run.install_signals):
        stop = run.stop
        stopper = asyncio.create_task(_stop_when(stop, loop)) if stop is not None else None
        try:
            async with served:
                await producer.start()
                await consumer.start()
                if run.on_start is not None:
                    run.on_start(loop)
                log.info(
                    f"{run.name}_started",
                    bootstrap=run.bootstrap,
                    group=run.group,
                    event_loop=running_loop_name(),
                )
                probe = metadata_probe(producer.client, loop.config.topics[0])
                await _run_watched(loop, health.monitor(probe))
        finally:
            if stopper is not None:
                stopper.cancel()
            for drain in parts.drains:
                await bounded(drain(), "drain", CLOSE_STEP_TIMEOUT_S)
            await bounded(consumer.stop(), "consumer_stop", CLOSE_STEP_TIMEOUT_S)
            await bounded(producer.stop(), "producer_stop", CLOSE_STEP_TIMEOUT_S)
            for close in parts.closers:
                await close()
            log.info(f"{run.name}_stopped")


async def _run_watched(loop: ConsumeLoop, monitor: Coroutine[Any, Any, None]) -> None:
    """``loop.run()`` beside the outage ``monitor``: when the monitor raises (the outage
    outlasted the tolerance), the loop is cancelled rather than drained, since none of its
    writes could be acknowledged, and the monitor's error is raised."""
    running = asyncio.ensure_future(loop.run())
    watching = asyncio.ensure_future(monitor)
    try:
        await asyncio.wait({running, watching}, return_when=asyncio.FIRST_COMPLETED)
        if watching.done() and not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            watching.result()  # BrokerOutageExceeded
        await running
    finally:
        for task in (running, watching):
            task.cancel()
        await asyncio.gather(running, watching, return_exceptions=True)


#: Upper bound of each client-closing step after the drain (consumer, producer).
CLOSE_STEP_TIMEOUT_S = 10.0


def shutdown_hard_limit(shutdown_grace_s: float) -> float:
    """Seconds from SIGTERM to a forced exit: the drain, the final commit, both close steps
    and a margin, each bounded on its own, so only a hung event loop reaches it. Kubernetes'
    ``terminationGracePeriodSeconds`` must exceed it (deploy/: 60 s against 50 s), so the
    process ends by its own hand, with a log line, not by the kubelet's SIGKILL."""
    return shutdown_grace_s + FINAL_COMMIT_TIMEOUT_S + 2 * CLOSE_STEP_TIMEOUT_S + 5.0


async def _stop_when(event: asyncio.Event, loop: ConsumeLoop) -> None:
    await event.wait()
    loop.stop()


def group_consumer(
    kafka: KafkaConfig,
    config: LoopConfig,
    group_id: str,
    *,
    consumer_class: ConsumerClass = AIOKafkaConsumer,
    **extra: Any,
) -> AIOKafkaConsumer:
    """The consumer of a consume loop: the group's liveness and rebalance timeouts are sized
    from the drain grace, so a member that drains on revocation is not thrown out for it.
    ``consumer_class``: see ``worker.engine.kafka.ConsumerClass``."""
    grace_ms = int(config.shutdown_grace_s * 1000)
    return build_consumer(
        kafka,
        consumer_class=consumer_class,
        group_id=group_id,
        session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=kafka.heartbeat_interval_ms,
        max_poll_interval_ms=max(300_000, int(config.shutdown_grace_s * 2000)),
        rebalance_timeout_ms=max(kafka.session_timeout_ms, grace_ms),
        **extra,
    )


def consume_loop(
    kafka: KafkaConfig,
    config: LoopConfig,
    *,
    consumer: AIOKafkaConsumer,
    handler: Handler,
    metrics: LoopSeries,
    unordered: Callable[[ConsumerRecord[bytes, bytes]], bool] | None = None,
) -> ConsumeLoop:
    """The consume loop ``config`` describes, on ``consumer`` (``group_consumer``), handing
    records to ``handler``; ``unordered`` picks the records run beside their key's lane
    (``ConsumeLoop``). Its state is restored through group-less consumers of ``kafka``."""
    return ConsumeLoop(
        consumer=consumer,
        restore_consumer=lambda: build_consumer(kafka),
        executor=handler,
        metrics=metrics,
        config=config,
        unordered=unordered,
        gap_hold_s=kafka.offset_gap_hold_s,
    )
