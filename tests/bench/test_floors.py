"""The floors keep what the processes they stand beside keep (bench/README.md, "Floors"): each
account's order across overlapping batches, the worker's state record with its dedup window
before the reply, the dispatcher's log entries with every field and at its window's cadence.
In process on the session broker, the provider simulator and a loopback receiver; no timings
asserted, only the order and the records."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from bench.floor import WorkerFloor
from bench.floor_loop import Batch, consume_in_batches, group_clients
from bench.webhook_floor import DispatcherFloor
from bench.webhook_receiver import SECRET_ENV
from tests.conftest import SettingsFactory
from worker.contract.delivery_log import decode_log
from worker.contract.messages import (
    AuthStatusChanged,
    PasskeyConfirm,
    RegisterAccount,
    decode_record,
    event_id,
)
from worker.engine.kafka import build_consumer, ensure_topics
from worker.settings import Settings
from worker.webhooks.signing import SECRET_PREFIX


def _batch(topic: str, values: list[tuple[str, bytes]]) -> Batch:
    """One fetch of ``values`` (key, value) on partition 0, offsets from 0."""
    tp = TopicPartition(topic, 0)
    records = [
        ConsumerRecord(topic, 0, i, 0, 0, key.encode(), value, None, len(key), len(value), ())
        for i, (key, value) in enumerate(values)
    ]
    return {tp: records}


async def _read(settings: Settings, topic: str, want: int) -> list[Any]:
    """The first ``want`` records of ``topic`` (every partition), within 20 s."""
    consumer = build_consumer(settings.kafka_config())
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.other_partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + 20
        while len(out) < want and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()


async def test_the_worker_floor_settles_each_account_in_order_with_the_workers_record(
    make_settings: SettingsFactory, simulator: str
) -> None:
    """A repeat confirm fetched while its account's first confirm is still at the provider
    (a ``sim-slow-`` ref, 1.5 s) waits for it: its reply carries the confirmed version and the
    provider is called once. Each state record is the worker's, its window of outcomes
    bounded by ``WORKER_DEDUP_WINDOW``."""
    settings = make_settings(
        partitions=1, provider_urls={"simulator": simulator}, worker_dedup_window=3
    )
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    floor = WorkerFloor(settings)
    await floor.producer.start()
    topic = settings.topics.commands
    now = datetime.now(UTC)
    register = RegisterAccount(
        command_id="reg-floor-1",
        workspace_id="ws_floor",
        account_id="acc-floor-1",
        provider="simulator",
        provider_account_ref="sim-slow-floor-1",
        status="passkey_confirmation",
    )

    def confirm(n: int) -> tuple[str, bytes]:
        cmd = PasskeyConfirm(
            command_id=f"cmd-floor-{n}",
            request_id=f"req-floor-{n}",
            workspace_id="ws_floor",
            account_id="acc-floor-1",
            issued_at=now,
        )
        return "acc-floor-1", cmd.model_dump_json().encode()

    try:
        await floor.handle(_batch(topic, [("acc-floor-1", register.model_dump_json().encode())]))
        first = asyncio.create_task(floor.handle(_batch(topic, [confirm(1)])))
        await asyncio.sleep(0.2)  # the first confirm is at the provider now
        await floor.handle(_batch(topic, [confirm(2), confirm(3), confirm(4)]))
        assert first.done(), "a later batch of the account finished before the earlier one"
        await first
    finally:
        await floor.producer.stop()
        await floor.consumer.stop()  # built with the floor, never started here
        await floor.http.aclose()

    replies = [json.loads(r.value) for r in await _read(settings, settings.topics.replies, 4)]
    version = {r["command_id"]: r["version"] for r in replies}
    # Every repeat answered on the confirmed record:
    assert version == {f"cmd-floor-{n}": 2 for n in (1, 2, 3, 4)}
    states = [decode_record(r.value) for r in await _read(settings, settings.topics.state, 5)]
    assert len(states) == 5  # register, first confirm, three repeats
    last = states[-1]
    assert last.version == 2 and last.follow_up is not None
    assert [o.command_id for o in last.recent] == ["cmd-floor-2", "cmd-floor-3", "cmd-floor-4"]
    assert states[1].in_flight is None and len(states[1].recent) == 2


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[tuple[str, str, float]]]]:
    """A loopback endpoint answering 204; a body with ``"version":1`` is answered after 0.5 s.
    Yields its URL and the (webhook-id, event, answered-at) of every request, in answer order."""
    seen: list[tuple[str, str, float]] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.text()
        if '"version":1' in body:
            await asyncio.sleep(0.5)
        seen.append((request.headers["webhook-id"], body, time.monotonic()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hooks", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/hooks", seen
    finally:
        await runner.cleanup()


async def test_the_dispatcher_floor_keeps_order_and_logs_what_the_dispatcher_logs(
    make_settings: SettingsFactory,
    receiver: tuple[str, list[tuple[str, str, float]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Version 2 of an account, fetched in a later batch while version 1 is still being
    answered, is sent only after version 1 was answered, not after its log entry was
    acknowledged (as the dispatcher's pair goes on once a success's entry is in its window).
    Every log entry carries the body sent, ``occurred_at`` and the attempt; entries of both
    batches written within one window share one record."""
    url, seen = receiver
    monkeypatch.setenv(SECRET_ENV, SECRET_PREFIX + base64.b64encode(b"k" * 24).decode())
    settings = make_settings(
        partitions=1,
        webhook_allow_http=True,
        webhook_allow_private_targets=True,
        webhook_log_flush_s=1.0,
    )
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    floor = DispatcherFloor(settings, "ep_floor", url, "ws_floor")
    topic = settings.topics.status

    def event(account: str, version: int) -> tuple[str, bytes]:
        ev = AuthStatusChanged(
            event_id=event_id("status", account, version),
            account_id=account,
            workspace_id="ws_floor",
            previous_status="passkey_confirmation",
            status="passkey_confirmation_sent",
            auth_status="passkey_confirmation_sent",
            version=version,
            occurred_at="2026-11-29T12:00:00.000Z",
        )
        return account, ev.model_dump_json().encode()

    stop = asyncio.Event()
    run = asyncio.create_task(floor.run(stop))  # starts its clients; its input stays empty
    try:
        for _ in range(400):
            if floor.consumer.assignment():
                break
            await asyncio.sleep(0.05)
        first = asyncio.create_task(floor.handle(_batch(topic, [event("acc-a", 1)])))
        await asyncio.sleep(0.1)  # version 1 is at the receiver now
        await floor.handle(_batch(topic, [event("acc-a", 2), event("acc-b", 2)]))
        await first
    finally:
        stop.set()
        await run

    order = [body for _, body, _ in seen if '"acc-a"' in body]
    assert ['"version":1' in b for b in order] == [True, False], "version 2 overtook version 1"
    records = [
        decode_log(r.value) for r in await _read(settings, settings.topics.webhook_deliveries, 1)
    ]
    # One window (1 s) holds all three: acc-a's version 2 went once version 1 was answered,
    # without waiting for version 1's record. acc-a's two in their order; acc-b's anywhere.
    record = records[0]
    assert sorted((e.account_id, e.version) for e in record) == [
        ("acc-a", 1),
        ("acc-a", 2),
        ("acc-b", 2),
    ]
    assert [e.version for e in record if e.account_id == "acc-a"] == [1, 2]
    entries = [e for r in records for e in r]
    sent = {wid: body for wid, body, _ in seen}
    for entry in entries:
        assert entry.state == "delivered" and entry.attempts == 1
        assert entry.body == sent[entry.webhook_id]  # what a resend sends
        assert entry.occurred_at == "2026-11-29T12:00:00.000Z"
        assert entry.attempt is not None and entry.attempt.status == 204


async def test_the_floors_commit_at_the_processes_cadence_not_per_batch(
    make_settings: SettingsFactory,
) -> None:
    """Finished batches' offsets wait for the commit interval (the processes commit every
    ``WORKER_COMMIT_INTERVAL_MS``), then go out together: none within a long interval."""
    settings = make_settings(partitions=1)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    producer, consumer = group_clients(
        settings, settings.topics.commands, settings.kafka_consumer_group
    )
    handled: list[int] = []
    stop = asyncio.Event()

    async def handle(batch: Batch) -> None:
        handled.extend(r.offset for records in batch.values() for r in records)
        if len(handled) >= 20:
            stop.set()

    await producer.start()
    try:
        for i in range(20):
            await producer.send_and_wait(settings.topics.commands, b"x", key=str(i).encode())
    finally:
        await producer.stop()
    await consumer.start()
    tp = TopicPartition(settings.topics.commands, 0)
    try:
        await asyncio.wait_for(
            consume_in_batches(
                consumer, handle, limit=5, max_records=5, stop=stop, commit_interval_s=3600
            ),
            timeout=30,
        )
        assert sorted(handled) == list(range(20))
        assert await consumer.committed(tp) is None
    finally:
        await consumer.stop()


async def test_the_worker_floor_calls_the_provider_for_a_confirm_fetched_with_its_registration(
    make_settings: SettingsFactory, simulator: str
) -> None:
    """A registration and its account's first confirm in one batch: the confirm is settled on
    the registered record, so it calls the provider and answers the confirmed version."""
    settings = make_settings(partitions=1, provider_urls={"simulator": simulator})
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    floor = WorkerFloor(settings)
    await floor.producer.start()
    register = RegisterAccount(
        command_id="reg-floor-2",
        workspace_id="ws_floor",
        account_id="acc-floor-2",
        provider="simulator",
        provider_account_ref="ref-floor-2",
        status="passkey_confirmation",
    )
    confirm = PasskeyConfirm(
        command_id="cmd-floor-2",
        request_id="req-floor-2",
        workspace_id="ws_floor",
        account_id="acc-floor-2",
        issued_at=datetime.now(UTC),
    )
    values = [(c.account_id, c.model_dump_json().encode()) for c in (register, confirm)]
    try:
        await floor.handle(_batch(settings.topics.commands, values))
    finally:
        await floor.producer.stop()
        await floor.consumer.stop()
        await floor.http.aclose()
    [reply] = [json.loads(r.value) for r in await _read(settings, settings.topics.replies, 1)]
    assert (reply["command_id"], reply["http_status"], reply["version"]) == ("cmd-floor-2", 200, 2)
