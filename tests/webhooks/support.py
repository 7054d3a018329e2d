"""Webhook test helpers: a receiver on loopback that verifies every request with the
specification's reference library (``standardwebhooks``), an endpoint writer, event records
like the worker's, and a dispatcher running in this event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook

from tests.harness import RunningWorker, running_loop
from worker.kafka import build_consumer, build_producer, ensure_topics
from worker.messages import AuthStatusChanged, event_id
from worker.settings import Settings
from worker.webhooks.app import run_dispatcher, secrets_box
from worker.webhooks.endpoints import EndpointRecord, EndpointsTail
from worker.webhooks.store import EndpointStore


@dataclass
class Delivery:
    webhook_id: str
    body: dict[str, Any]
    verified: bool
    status: int
    traceparent: str | None = None


@dataclass
class Receiver:
    """Answers 2xx unless ``answer`` says otherwise; keeps every request it saw."""

    secrets: list[str] = field(default_factory=list)
    seen: list[Delivery] = field(default_factory=list)
    answer: Callable[[dict[str, Any], int], int] = lambda body, n: 204
    url: str = ""

    def verified_once(self) -> dict[str, Delivery]:
        """The delivered (2xx) requests by webhook-id."""
        out: dict[str, Delivery] = {}
        for d in self.seen:
            if 200 <= d.status < 300:
                out[d.webhook_id] = d
        return out

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        verified = False
        for secret in self.secrets:
            with contextlib.suppress(Exception):
                Webhook(secret).verify(raw, headers)
                verified = True
        body = json.loads(raw)
        tries = sum(1 for d in self.seen if d.webhook_id == headers["webhook-id"])
        status = self.answer(body, tries) if verified else 401
        self.seen.append(
            Delivery(headers["webhook-id"], body, verified, status, headers.get("traceparent"))
        )
        return web.Response(status=status)


@contextlib.asynccontextmanager
async def receiving(receiver: Receiver) -> AsyncIterator[Receiver]:
    app = web.Application()
    app.router.add_post("/hooks", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    receiver.url = f"http://127.0.0.1:{port}/hooks"
    try:
        yield receiver
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def endpoint_store(settings: Settings) -> AsyncIterator[EndpointStore]:
    """An ``EndpointStore`` with its own producer and registry tail (the front-end's shape)."""
    await ensure_topics(settings)
    producer = build_producer(settings)
    await producer.start()
    tail = EndpointsTail(
        build_consumer(settings, enable_auto_commit=False), settings.topics.webhook_endpoints
    )
    await tail.start()
    try:
        yield EndpointStore(
            producer=producer,
            topic=settings.topics.webhook_endpoints,
            registry=tail.registry,
            cipher=secrets_box(settings),
            overlap_s=settings.webhook_secret_overlap_s,
        )
    finally:
        await tail.stop()
        await producer.stop()


async def create_endpoint(
    store: EndpointStore, workspace: str, url: str, **fields: Any
) -> tuple[EndpointRecord, str]:
    return await store.create(
        workspace,
        url=url,
        event_types=fields.get("event_types"),
        description=fields.get("description"),
    )


def status_event(account_id: str, version: int, *, workspace: str = "ws_a") -> AuthStatusChanged:
    statuses = ["passkey_confirmation", "passkey_confirmation_sent", "authorized", "failed"]
    status = statuses[min(version, len(statuses) - 1)]
    return AuthStatusChanged(
        event_id=event_id("status", account_id, version),
        account_id=account_id,
        workspace_id=workspace,
        previous_status=statuses[min(version - 1, len(statuses) - 1)],
        status=status,
        auth_status=status,
        version=version,
        occurred_at=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    )


async def publish_events(settings: Settings, events: list[AuthStatusChanged]) -> None:
    producer = build_producer(settings)
    await producer.start()
    try:
        for ev in events:
            await producer.send_and_wait(
                settings.topics.status,
                ev.model_dump_json().encode(),
                key=ev.account_id.encode(),
            )
    finally:
        await producer.stop()


def running_dispatcher(
    settings: Settings, *, ready_timeout: float = 30.0
) -> contextlib.AbstractAsyncContextManager[RunningWorker]:
    """A dispatcher in this event loop; yields once it owns and restored its partitions."""
    return running_loop(run_dispatcher, settings, ready_timeout=ready_timeout)


async def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


def new_account() -> str:
    return f"acc_{uuid.uuid4().hex[:10]}"
