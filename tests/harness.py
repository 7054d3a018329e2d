"""Test helpers around a real broker: send commands, collect outputs, run workers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry

from devstack.consumer import EmbeddedBrokerConsumer
from tests.cluster import kafka_env
from worker.auth.app import run_worker
from worker.auth.metrics import WorkerMetrics
from worker.contract.messages import PasskeyConfirm, RegisterAccount
from worker.contract.topics import Topics
from worker.engine.consume_loop import ConsumeLoop
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.runner import consume_loop, group_consumer
from worker.engine.tail import partitions_of
from worker.settings import Settings
from worker.startup import RootOptions

REPO = Path(__file__).resolve().parents[1]


def confirm_cmd(
    account_id: str, workspace_id: str = "ws_a", command_id: str | None = None
) -> PasskeyConfirm:
    cid = command_id or str(uuid.uuid4())
    return PasskeyConfirm(
        command_id=cid,
        request_id=f"req-{cid}",
        workspace_id=workspace_id,
        account_id=account_id,
        issued_at=datetime.now(UTC),
    )


def register_cmd(
    account_id: str,
    ref: str,
    *,
    workspace_id: str = "ws_a",
    status: str = "passkey_confirmation",
    provider: str | None = "simulator",
) -> RegisterAccount:
    return RegisterAccount(
        command_id=f"reg-{account_id}-{uuid.uuid4().hex[:8]}",
        workspace_id=workspace_id,
        account_id=account_id,
        provider=provider,
        provider_account_ref=ref,
        status=status,
    )


@dataclass
class Bus:
    """A producer for commands and a group-less reader of every output topic."""

    settings: Settings
    producer: AIOKafkaProducer
    reader: AIOKafkaConsumer
    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    raw: dict[str, list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]] = field(
        default_factory=dict
    )

    async def send(self, cmd: Any, *, key: str | None = None) -> None:
        await self.send_raw((key or cmd.account_id).encode(), cmd.model_dump_json().encode())

    async def send_raw(self, key: bytes | None, value: bytes | None) -> None:
        await self.producer.send_and_wait(self.settings.topics.commands, value, key=key)

    async def pump(self, timeout_ms: int = 100) -> None:
        batch = await self.reader.getmany(timeout_ms=timeout_ms)
        for tp, records in batch.items():
            for msg in records:
                self.raw.setdefault(tp.topic, []).append((msg.key, msg.value, list(msg.headers)))
                if tp.topic == self.settings.topics.dlq or msg.value is None:
                    continue
                self.seen.setdefault(tp.topic, []).append(json.loads(msg.value))

    def of(self, topic: str, **match: Any) -> list[dict[str, Any]]:
        return [v for v in self.seen.get(topic, []) if all(v.get(k) == m for k, m in match.items())]

    def replies(self, **match: Any) -> list[dict[str, Any]]:
        return self.of(self.settings.topics.replies, **match)

    def status_events(self, **match: Any) -> list[dict[str, Any]]:
        return self.of(self.settings.topics.status, **match)

    def errors(self, **match: Any) -> list[dict[str, Any]]:
        return self.of(self.settings.topics.errors, **match)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
        """Pump until ``predicate`` holds; ``timeout`` only ends a wait that would fail anyway
        (generous: a loaded machine answers late, not wrongly)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    "condition not met; seen: "
                    + json.dumps({k: len(v) for k, v in self.seen.items()})
                )
            await self.pump()

    async def reply_to(self, command_id: str, timeout: float = 60.0) -> dict[str, Any]:
        await self.wait_for(lambda: bool(self.replies(command_id=command_id)), timeout)
        return self.replies(command_id=command_id)[0]

    async def until_answered(self, command_ids: Iterable[str], timeout: float) -> None:
        """Pump until every one of ``command_ids`` has a reply; fail naming a few missing."""
        wanted = list(command_ids)
        deadline = time.monotonic() + timeout
        while True:
            await self.pump(200)
            answered = {r["command_id"] for r in self.replies()}
            missing = [c for c in wanted if c not in answered]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(missing)} commands never answered, e.g. {missing[:3]}")


@contextlib.asynccontextmanager
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    producer = build_producer(settings.kafka_config())
    reader = build_consumer(settings.kafka_config())
    await producer.start()
    await reader.start()
    try:
        t = settings.topics
        tps = []
        deadline = time.monotonic() + 30
        for topic in (t.replies, t.status, t.errors, t.dlq, t.state):
            parts = await partitions_of(reader, topic, deadline=deadline)
            tps += [TopicPartition(topic, p) for p in parts]
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        yield Bus(settings, producer, reader)
    finally:
        await reader.stop()
        await producer.stop()


@dataclass
class RunningWorker:
    task: asyncio.Task[None]
    stop: asyncio.Event
    worker: ConsumeLoop
    registry: CollectorRegistry


@contextlib.asynccontextmanager
async def engine_loop(
    kafka: Any, settings: Settings, handler: Any, **config: Any
) -> AsyncIterator[tuple[ConsumeLoop, asyncio.Task[None]]]:
    """A worker consume loop over ``handler`` in the settings' group, at most 100 records in
    flight and fast retries (0.01 s, then 0.05 s; ``config``: more ``LoopConfig`` fields),
    consuming in a task for the block; then stopped (its task given 30 s) and its consumer
    closed."""
    loop_config = replace(settings.loop_config("worker"), max_in_flight=100)
    loop = consume_loop(
        kafka,
        loop_config,
        consumer=group_consumer(kafka, loop_config, settings.kafka_consumer_group),
        handler=handler,
        metrics=WorkerMetrics(CollectorRegistry()),
    )
    loop.config = replace(loop.config, retry_backoff_s=(0.01, 0.05), **config)
    await loop.consumer.start()
    task = asyncio.create_task(loop.run())
    try:
        yield loop, task
    finally:
        loop.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
        await loop.consumer.stop()


async def stop_loop(loop: ConsumeLoop, running: asyncio.Task[None] | None, consumer: Any) -> None:
    """Stop a consume loop started by hand: its task given 15 s, then cancelled, and
    ``consumer`` given 10 s to close."""
    loop.stop()
    if running is not None:
        await asyncio.wait({running}, timeout=15)
        if not running.done():
            running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    await asyncio.wait({asyncio.ensure_future(consumer.stop())}, timeout=10)


async def loop_until(
    predicate: Callable[[], bool], task: asyncio.Task[None], timeout: float
) -> None:
    """Until ``predicate`` holds; fails at once if the consume loop's ``task`` ended, and past
    ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if task.done():
            task.result()
            raise AssertionError("the loop ended")
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running_loop(
    run: Callable[..., Coroutine[Any, Any, None]],
    settings: Settings,
    *,
    ready_timeout: float = 30.0,
    **options: Any,
) -> AsyncIterator[RunningWorker]:
    """A consuming process's main (``run_worker``, ``run_dispatcher``) in this event loop;
    yields once its loop owns and restored its partitions, stops it on exit. Its group
    consumer is the development tools' (``devstack.consumer``); ``options``: the root's own
    keywords (``sender``)."""
    stop = asyncio.Event()
    registry = CollectorRegistry()
    holder: list[ConsumeLoop] = []
    embedded = RootOptions(
        registry=registry,
        stop=stop,
        install_signals=False,
        serve_probes=False,
        on_start=holder.append,
        consumer_class=EmbeddedBrokerConsumer,
    )
    task = asyncio.create_task(run(settings, embedded, **options))
    deadline = time.monotonic() + ready_timeout
    while not (holder and holder[0].ready and holder[0].active):
        if task.done():
            task.result()
        if time.monotonic() > deadline:
            stop.set()
            raise TimeoutError(f"{run.__name__} did not become ready")
        await asyncio.sleep(0.05)
    running = RunningWorker(task, stop, holder[0], registry)
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


def running_worker(
    settings: Settings, *, ready_timeout: float = 30.0
) -> contextlib.AbstractAsyncContextManager[RunningWorker]:
    """A worker in this event loop; yields once it owns and restored its partitions."""
    return running_loop(run_worker, settings, ready_timeout=ready_timeout)


def worker_env(settings: Settings, metrics_port: int, **extra: str) -> dict[str, str]:
    """Environment for a ``python -m worker run`` (or ``devstack worker``) subprocess bound to
    ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOPIC_", "KAFKA_"))}
    env.update(kafka_env(settings))
    env.update(
        {
            "ENVIRONMENT": "development",
            "KAFKA_CONSUMER_GROUP": settings.kafka_consumer_group,
            "KAFKA_SESSION_TIMEOUT_MS": "6000",
            "KAFKA_HEARTBEAT_INTERVAL_MS": "500",
            "KAFKA_FETCH_MAX_WAIT_MS": str(settings.kafka_fetch_max_wait_ms),
            "COMMANDS_PARTITIONS": str(settings.commands_partitions),
            "OTHER_PARTITIONS": str(settings.other_partitions),
            "PROVIDER_URLS": json.dumps(settings.provider_urls),
            "WORKER_METRICS_PORT": str(metrics_port),
            "WORKER_SHUTDOWN_GRACE_S": "5",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update({f"TOPIC_{f.upper()}": getattr(settings.topics, f) for f in Topics.model_fields})
    env.update(extra)
    return env
