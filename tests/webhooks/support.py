"""Webhook test helpers: a receiver on loopback that verifies every request with the
specification's reference library (``standardwebhooks``), an endpoint writer, event records
like the worker's, and a dispatcher running in this event loop; for the isolation tests also
endpoints in bulk, a server that never answers, a sender that counts what is under way, and
a topic reader."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from aiohttp import web
from standardwebhooks.webhooks import Webhook

from tests.harness import RunningWorker, running_loop
from tests.webhooks import published_schemas
from worker.contract.delivery_log import DeliveryLogEntry, decode_log
from worker.contract.messages import AuthStatusChanged, event_id
from worker.contract.webhook_endpoints import (
    EndpointRecord,
    StoredSecret,
    new_endpoint_id,
    now_rfc3339,
)
from worker.dispatcher.app import run_dispatcher, secrets_box
from worker.dispatcher.sender import DeliveryResult, Sender
from worker.engine.catch_up import catch_up
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.tail import assign_all
from worker.settings import Settings
from worker.webhooks.endpoint_writes import EndpointStore
from worker.webhooks.endpoints import EndpointsTail
from worker.webhooks.replay_scan import ReplayScan
from worker.webhooks.signing import generate_secret


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
        published_schemas.observe(body)
        tries = sum(1 for d in self.seen if d.webhook_id == headers["webhook-id"])
        status = self.answer(body, tries) if verified else 401
        self.seen.append(
            Delivery(headers["webhook-id"], body, verified, status, headers.get("traceparent"))
        )
        return web.Response(status=status)


class Receiving(Protocol):
    """What ``receiving`` serves: an aiohttp handler, and where it is reached."""

    url: str

    async def handle(self, request: web.Request) -> web.StreamResponse: ...


ReceiverT = TypeVar("ReceiverT", bound=Receiving)


@contextlib.asynccontextmanager
async def receiving(receiver: ReceiverT) -> AsyncIterator[ReceiverT]:
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
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    producer = build_producer(settings.kafka_config())
    await producer.start()
    tail = EndpointsTail(
        build_consumer(settings.kafka_config(), enable_auto_commit=False),
        settings.topics.webhook_endpoints,
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


async def endpoint_of(
    store: EndpointStore, receiver: Receiver, *, workspace: str = "ws_a", **fields: Any
) -> EndpointRecord:
    """An endpoint of ``workspace`` at ``receiver``, which verifies with its secret."""
    record, secret = await create_endpoint(store, workspace, receiver.url, **fields)
    receiver.secrets.append(secret)
    return record


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
    producer = build_producer(settings.kafka_config())
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
    settings: Settings, *, ready_timeout: float = 30.0, sender: Any = None
) -> contextlib.AbstractAsyncContextManager[RunningWorker]:
    """A dispatcher in this event loop; yields once it owns and restored its partitions.
    ``sender`` replaces the HTTP sender built from settings."""
    return running_loop(run_dispatcher, settings, ready_timeout=ready_timeout, sender=sender)


async def wait_until(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    """Until ``predicate`` holds; the bound only ends a test that fails anyway, so it leaves
    room for a loaded machine."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


async def wait_for_count(
    count: Callable[[], int], target: int, *, stalled_s: float = 60.0, cap_s: float = 240.0
) -> None:
    """Until ``count()`` reaches ``target``, for as long as it keeps growing: a slow machine
    takes longer, a stuck one stops the wait once nothing came for ``stalled_s``."""
    started = last_change = time.monotonic()
    seen = count()
    while seen < target:
        now = time.monotonic()
        if now - last_change > stalled_s or now - started > cap_s:
            raise TimeoutError(f"{seen} of {target} after {now - started:.0f} s")
        await asyncio.sleep(0.05)
        if (current := count()) != seen:
            seen, last_change = current, time.monotonic()


def new_account() -> str:
    return f"acc_{uuid.uuid4().hex[:10]}"


async def bulk_endpoints(
    settings: Settings, workspace: str, url: str, count: int
) -> tuple[list[EndpointRecord], str]:
    """``count`` endpoints of ``workspace`` written straight to the endpoints topic in one
    burst (as endpoints created before any quota existed would be), all signing with one
    secret, which is returned."""
    box = secrets_box(settings)
    secret = generate_secret()
    stamp = now_rfc3339()
    records = []
    for _ in range(count):
        endpoint_id = new_endpoint_id()
        records.append(
            EndpointRecord(
                id=endpoint_id,
                workspace_id=workspace,
                url=url,
                created_at=stamp,
                updated_at=stamp,
                revision=1,
                secrets=(
                    StoredSecret(
                        ciphertext=box.encrypt(secret, endpoint_id.encode()), created_at=stamp
                    ),
                ),
            )
        )
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        sent = [
            await producer.send(
                settings.topics.webhook_endpoints,
                r.model_dump_json().encode(),
                key=r.id.encode(),
            )
            for r in records
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return records, secret


async def read_topic(settings: Settings, topic: str) -> list[Any]:
    """Every record of ``topic`` up to its high-water marks, partition by partition."""
    consumer = build_consumer(settings.kafka_config(), enable_auto_commit=False)
    await consumer.start()
    out: list[Any] = []

    def take(_: Any, records: list[Any]) -> None:
        out.extend(records)

    try:
        tps = await assign_all(consumer, topic)
        await catch_up(consumer, tps, take)
    finally:
        await consumer.stop()
    return out


async def read_log(settings: Settings) -> list[DeliveryLogEntry]:
    """Every delivery-log entry written, a batch record's in its order (``read_topic``)."""
    records = await read_topic(settings, settings.topics.webhook_deliveries)
    return [entry for r in records for entry in decode_log(r.value or b"")]


@dataclass
class Hanging:
    """A loopback HTTP server that accepts every connection, reads the request and never
    answers (until the client gives up and closes)."""

    url: str = ""
    connections: int = 0
    open: int = 0
    max_open: int = 0


@contextlib.asynccontextmanager
async def hanging(server: Hanging) -> AsyncIterator[Hanging]:
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        server.connections += 1
        server.open += 1
        server.max_open = max(server.max_open, server.open)
        try:
            while await reader.read(65536):
                pass  # read whatever comes; answer nothing
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            server.open -= 1
            writer.close()

    listener = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/hooks"
    try:
        yield server
    finally:
        listener.close()
        for writer in writers:
            writer.close()
        await listener.wait_closed()


class CountingSender:
    """The real HTTP sender, counting the attempts under way per URL and their peak."""

    def __init__(self, inner: Sender) -> None:
        self._inner = inner
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult:
        self.now[url] += 1
        self.calls[url] += 1
        self.peak[url] = max(self.peak[url], self.now[url])
        try:
            return await self._inner.post(url, body, headers)
        finally:
            self.now[url] -= 1


def replay_scan(
    settings: Settings,
    producer: Any,
    *,
    wrap: Callable[[Any], Any] = lambda consumer: consumer,
    **options: Any,
) -> ReplayScan:
    """The replay scan on the settings' topics, its readers group-less consumers fetching with
    a short wait (``wrap`` may stand in front of each), sending through ``producer``."""
    return ReplayScan(
        consumer_factory=lambda: wrap(
            build_consumer(settings.kafka_config(), fetch_max_wait_ms=50)
        ),
        producer=producer,
        topics=settings.topics,
        **options,
    )
