"""Composition root of a worker process: build every client from settings, wire, run.

Nothing else in the package builds a Kafka client, an HTTP client or a metrics registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import CollectorRegistry

from worker.consumer import LoopConfig, Worker
from worker.eventloop import running_loop_name
from worker.execute import Executor
from worker.flow import Policy
from worker.kafka import build_consumer, build_producer, ensure_topics
from worker.logs import get_logger
from worker.metrics import WorkerMetrics
from worker.probes import build_probe_app
from worker.process import on_stop_signals
from worker.provider import ProviderRegistry, build_http_client, build_registry
from worker.publish import Publisher
from worker.serving import serving
from worker.settings import Settings
from worker.store import StateStore

log = get_logger(__name__)


def policy_from(settings: Settings, providers: set[str]) -> Policy:
    return Policy(
        providers=frozenset(providers),
        dedup_window=settings.worker_dedup_window,
        follow_up_poll_s=settings.worker_follow_up_poll_s,
        follow_up_deadline_s=settings.worker_follow_up_deadline_s,
        command_deadline_s=settings.worker_command_deadline_s,
    )


async def run_worker(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    stop: asyncio.Event | None = None,
    install_signals: bool = True,
    serve_probes: bool = True,
    on_start: Callable[[Worker], None] | None = None,
    providers: ProviderRegistry | None = None,
) -> None:
    """One worker of the pool, until SIGTERM/SIGINT (or ``stop``). Raises on a fatal loop
    error so the process exits non-zero. ``providers`` replaces the HTTP adapters built from
    ``PROVIDER_URLS`` (the benchmark's in-process provider)."""
    registry = registry or CollectorRegistry()
    metrics = WorkerMetrics(registry)
    await ensure_topics(settings)
    topics = settings.topics
    producer = build_producer(settings)
    http = build_http_client(settings)
    if providers is None:  # the benchmark passes an in-process provider instead
        providers = build_registry(
            settings, http, on_call=metrics.provider_call, on_retry=metrics.provider_retry
        )
    consumer = build_consumer(
        settings,
        group_id=settings.kafka_consumer_group,
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=settings.kafka_heartbeat_interval_ms,
        max_poll_interval_ms=max(300_000, int(settings.worker_shutdown_grace_s * 2000)),
        rebalance_timeout_ms=max(
            settings.kafka_session_timeout_ms, int(settings.worker_shutdown_grace_s * 1000)
        ),
    )
    store = StateStore()
    executor = Executor(
        store=store,
        publisher=Publisher(producer, topics),
        providers=providers,
        policy=policy_from(settings, set(providers)),
        metrics=metrics,
    )
    loop_config = LoopConfig(
        topic=topics.commands,
        state_topic=topics.state,
        max_in_flight=settings.worker_max_in_flight,
        commit_interval_s=settings.worker_commit_interval_ms / 1000,
        rebalance_budget_s=min(settings.worker_shutdown_grace_s, 30.0),
        shutdown_grace_s=settings.worker_shutdown_grace_s,
        max_poll_records=settings.kafka_max_poll_records,
    )
    worker = Worker(
        consumer=consumer,
        restore_consumer=lambda: build_consumer(settings, enable_auto_commit=False),
        executor=executor,
        metrics=metrics,
        config=loop_config,
    )
    probes: contextlib.AbstractAsyncContextManager[object] = contextlib.nullcontext()
    if serve_probes:
        app = build_probe_app(
            registry, last_beat=lambda: worker.last_beat, ready=lambda: worker.ready
        )
        probes = serving(
            app,
            host=settings.worker_metrics_host,
            port=settings.worker_metrics_port,
            name="worker-probes",
        )
    # Installed for the whole run, close steps included: a second signal during them still
    # exits at once (130).
    on_signal = _graceful_then_forced(worker, hard_limit_s=shutdown_hard_limit(settings))
    with on_stop_signals(on_signal, enabled=install_signals):
        stopper = asyncio.create_task(_stop_when(stop, worker)) if stop is not None else None
        try:
            async with probes:
                await producer.start()
                await consumer.start()
                if on_start is not None:
                    on_start(worker)
                log.info(
                    "worker_started",
                    bootstrap=settings.bootstrap,
                    group=settings.kafka_consumer_group,
                    event_loop=running_loop_name(),
                )
                await worker.run()
        finally:
            if stopper is not None:
                stopper.cancel()
            # Every step is bounded: a broker that vanished must not keep the process alive.
            await _bounded(consumer.stop(), "consumer_stop", CLOSE_STEP_TIMEOUT_S)
            await _bounded(producer.stop(), "producer_stop", CLOSE_STEP_TIMEOUT_S)
            await providers.aclose()
            await http.aclose()
            log.info("worker_stopped")


#: Upper bound of each client-closing step after the drain (consumer, producer).
CLOSE_STEP_TIMEOUT_S = 10.0


def shutdown_hard_limit(settings: Settings) -> float:
    """Seconds from SIGTERM to a forced exit: the drain, both close steps, and a margin.

    Kubernetes' ``terminationGracePeriodSeconds`` must exceed it (deploy/ uses 60 s; the
    limit is 45 s for the default 20 s grace), so the process always ends by its own hand,
    with a log line saying why, rather than by the kubelet's SIGKILL.
    """
    return settings.worker_shutdown_grace_s + 2 * CLOSE_STEP_TIMEOUT_S + 5.0


def _graceful_then_forced(worker: Worker, *, hard_limit_s: float) -> Callable[[], None]:
    """First SIGTERM/SIGINT: drain and leave, with a watchdog that exits (code 70) if the
    clean stop overruns ``hard_limit_s``. A second signal: exit at once (code 130)."""
    signals = 0

    def overran() -> None:
        log.error("shutdown_overran", hard_limit_s=hard_limit_s)
        os._exit(70)

    def handler() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.error("forced_exit")
            os._exit(130)
            return  # only reached when os._exit is replaced (tests)
        log.info("stop_requested", hard_limit_s=hard_limit_s)
        asyncio.get_running_loop().call_later(hard_limit_s, overran)
        worker.stop()

    return handler


async def _bounded(step: Coroutine[Any, Any, None], what: str, timeout: float) -> None:
    """Run a shutdown step for at most ``timeout`` seconds.

    ``asyncio.wait`` rather than ``wait_for``: on time-out ``wait_for`` waits for the
    cancelled step to finish, which a library that absorbs the cancellation (a rebalance in
    the middle of ``consumer.stop()``) can make unbounded. Here the step is cancelled and
    left behind; the process is about to exit.
    """
    started = time.monotonic()
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        log.error("shutdown_step_timed_out", step=what, timeout_s=timeout)
        return
    if task.cancelled() or (exc := task.exception()) is not None:
        error = "cancelled" if task.cancelled() else repr(exc)
        log.warning("shutdown_step_failed", step=what, error=error)
        return
    log.info("shutdown_step_done", step=what, seconds=round(time.monotonic() - started, 3))


async def _stop_when(event: asyncio.Event, worker: Worker) -> None:
    await event.wait()
    worker.stop()
