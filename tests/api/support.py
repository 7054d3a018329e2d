"""Helpers for the front-end tests: a real uvicorn front-end on a loopback port, a tiny
in-test responder standing in for the worker, state records, and a real worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry

from tests.harness import running_worker as running_worker  # re-exported for the API tests
from worker.api.app import ApiRuntime, serve_api
from worker.api.keys import KeyStore, hash_key
from worker.contract.catalogue import ServiceError
from worker.contract.messages import (
    AccountRecord,
    GetAuthState,
    PasskeyConfirm,
    RegisterAccount,
    Reply,
    decode_command,
    encode_record,
)
from worker.documents.openapi.document import document_routes
from worker.engine.fetch import GapWatch, gap_logger, skipping
from worker.engine.fetch import getmany as fetch_records
from worker.engine.home_partition import reply_partition
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.tail import assign_all
from worker.settings import Settings

KEY_A = "pk_test-key-workspace-a"
KEY_B = "pk_test-key-workspace-b"
KEY_DISABLED = "pk_test-key-disabled"
ALLOWED_ORIGIN = "https://console.example"


def write_keys(path: Path) -> Path:
    """Keys file with ws_a, ws_b and a disabled key of ws_a."""
    entries = [
        {"workspace_id": "ws_a", "key_id": "key_a", "sha256": hash_key(KEY_A), "active": True},
        {"workspace_id": "ws_b", "key_id": "key_b", "sha256": hash_key(KEY_B), "active": True},
        {
            "workspace_id": "ws_a",
            "key_id": "key_off",
            "sha256": hash_key(KEY_DISABLED),
            "active": False,
        },
    ]
    path.write_text(json.dumps({"keys": entries}), encoding="utf-8")
    return path


def headers(key: str = KEY_A, **extra: str) -> dict[str, str]:
    return {"X-Api-Key": key, **extra}


async def wait_until(
    predicate: Callable[[], bool], *, timeout: float = 60.0, what: str = "condition"
) -> None:
    """Until ``predicate`` holds; ``timeout`` only ends a wait that would fail anyway."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met after {timeout}s")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running_api(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    keys: KeyStore | None = None,
    ready: bool = True,
) -> AsyncIterator[ApiRuntime]:
    """``serve_api`` as a task of this loop on a free loopback port; stopped on exit."""
    assert settings.api_host == "127.0.0.1"
    settings = settings.model_copy(update={"api_port": 0, "api_metrics_port": 0})
    stop = asyncio.Event()
    started: list[ApiRuntime] = []
    task = asyncio.create_task(
        serve_api(
            settings,
            install_signals=False,
            stop=stop,
            registry=registry or CollectorRegistry(),
            keys=keys,
            on_started=started.append,
            documents=document_routes,
        )
    )
    try:
        deadline = time.monotonic() + 30
        while not started:
            if task.done():
                task.result()
                raise RuntimeError("serve_api returned before starting")
            if time.monotonic() > deadline:
                raise TimeoutError("front-end did not start")
            await asyncio.sleep(0.01)
        runtime = started[0]
        if ready:
            await wait_until(
                lambda: runtime.replies.ready and all(t.caught_up for t in runtime.tails),
                what="front-end ready",
            )
        yield runtime
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


Answer = Callable[[PasskeyConfirm], tuple[int, dict[str, Any]] | None]
QueryAnswer = Callable[[GetAuthState], tuple[int, dict[str, Any]] | None]


def unknown_answer(query: GetAuthState) -> tuple[int, dict[str, Any]]:
    """What a worker without the account answers a ``get_auth_state`` query: 404."""
    return 404, {"request_id": query.request_id, "error": ServiceError.of("not_found").body()}


def ok_answer(cmd: PasskeyConfirm) -> tuple[int, dict[str, Any]]:
    """What the worker answers for a pending challenge: 200 with passkey_confirmation_sent."""
    return 200, {
        "request_id": cmd.request_id,
        "data": {
            "account_id": cmd.account_id,
            "status": "passkey_confirmation_sent",
            "auth_status": "passkey_confirmation_sent",
        },
    }


@dataclass
class Responder:
    """Stands in for the worker: reads auth.commands (group-less, every partition) and
    answers each passkey_confirm with ``answer(cmd)`` and each get_auth_state query with
    ``query(cmd)`` (``None``: no reply)."""

    commands: list[PasskeyConfirm] = field(default_factory=list)
    queries: list[GetAuthState] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    #: The ``reply-partition`` header of each passkey_confirm, in arrival order.
    reply_to: list[int | None] = field(default_factory=list)


@contextlib.asynccontextmanager
async def responder(
    settings: Settings,
    answer: Answer = ok_answer,
    *,
    query: QueryAnswer = unknown_answer,
    max_delay_s: float = 0.0,
) -> AsyncIterator[Responder]:
    """Run a responder; ``max_delay_s`` delays each reply randomly so replies overtake."""
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    consumer = build_consumer(settings.kafka_config(), fetch_max_wait_ms=10)
    producer = build_producer(settings.kafka_config())
    await consumer.start()
    await producer.start()
    state = Responder()
    sends: set[asyncio.Task[None]] = set()

    async def reply(
        cmd: PasskeyConfirm | GetAuthState, status: int, body: dict[str, Any], to: int | None
    ) -> None:
        if max_delay_s:
            await asyncio.sleep(random.uniform(0, max_delay_s))
        message = Reply(
            command_id=cmd.command_id,
            request_id=cmd.request_id,
            account_id=cmd.account_id,
            http_status=status,
            body=body,
        )
        await producer.send_and_wait(
            settings.topics.replies,
            message.model_dump_json(exclude_none=True).encode(),
            key=cmd.account_id.encode(),
            partition=to,
        )

    # Read as the worker reads (worker.engine.fetch): on the embedded broker a fetch tailing
    # a partition two producers write (two front-end replicas) can skip a batch not stored
    # yet, and a responder that skipped a command would leave its request to time out.
    gaps = GapWatch(gap_logger(structlog.get_logger(__name__), "test-responder"))
    skip = skipping("test-responder", structlog.get_logger(__name__))

    async def loop() -> None:
        await assign_all(consumer, settings.topics.commands)
        while True:
            batch = await fetch_records(
                consumer, timeout_ms=100, max_records=None, on_unreadable=skip, gaps=gaps
            )
            for records in batch.values():
                for msg in records:
                    cmd = decode_command(msg.key, msg.value)
                    answered: tuple[int, dict[str, Any]] | None
                    if isinstance(cmd, GetAuthState):
                        state.queries.append(cmd)
                        answered = query(cmd)
                    elif isinstance(cmd, PasskeyConfirm):
                        state.commands.append(cmd)
                        state.keys.append(msg.key)
                        state.reply_to.append(reply_partition(msg.headers))
                        answered = answer(cmd)
                    else:
                        continue
                    if answered is not None:
                        to = reply_partition(msg.headers)  # as the worker does
                        task = asyncio.create_task(reply(cmd, *answered, to))
                        sends.add(task)
                        task.add_done_callback(sends.discard)

    runner = asyncio.create_task(loop())
    try:
        yield state
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        if sends:
            await asyncio.gather(*sends, return_exceptions=True)
        await consumer.stop()
        await producer.stop()


def state_record(
    account_id: str,
    workspace_id: str = "ws_a",
    status: str = "passkey_confirmation",
    *,
    version: int = 1,
    deregistered: bool = False,
) -> AccountRecord:
    return AccountRecord(
        account_id=account_id,
        workspace_id=workspace_id,
        status=status,
        auth_status=status,
        version=version,
        updated_at=time.time(),
        provider="simulator",
        provider_account_ref=f"ref-{account_id}",
        deregistered=deregistered,
    )


async def produce(
    settings: Settings,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None]],
    *,
    partition: int | None = None,
) -> None:
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    producer: AIOKafkaProducer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, partition=partition)
            for key, value in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def put_state(settings: Settings, *records: AccountRecord) -> None:
    await produce(
        settings,
        settings.topics.state,
        [(r.account_id.encode(), encode_record(r)) for r in records],
    )


async def register(
    settings: Settings,
    account_id: str,
    ref: str,
    *,
    workspace_id: str = "ws_a",
    status: str = "passkey_confirmation",
) -> None:
    """What the account service does: a register_account command on auth.commands."""
    cmd = RegisterAccount(
        command_id=f"reg-{uuid.uuid4().hex}",
        workspace_id=workspace_id,
        account_id=account_id,
        provider="simulator",
        provider_account_ref=ref,
        status=status,
    )
    await produce(
        settings, settings.topics.commands, [(account_id.encode(), cmd.model_dump_json().encode())]
    )
