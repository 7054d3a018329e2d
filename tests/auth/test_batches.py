"""The worker takes a fetched batch as its unit of work (``Executor.handle_batch``): the
batch's state records go out under one acknowledgement wait before any of its replies, a
command whose handling raises is retried and dead-lettered alone while the others are
answered, and a long-poll parked on an account is answered by the batch's version
(docs/architecture.md, "Per-account lanes", "Guarantees"). Every write is watched at the
worker's write path (``worker.auth.publish``), the records still sent to a real broker."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from tests.harness import Bus, bus, confirm_cmd, register_cmd, running_worker
from worker.auth import flow, publish
from worker.contract.messages import AccountRecord, GetAuthState
from worker.engine.writes import acknowledged, enqueue
from worker.settings import Settings

pytestmark = pytest.mark.integration

#: ("send", topic, key) when a record is handed to the producer; ("acked", [(topic, key)])
#: once a wait for acknowledgements returned.
Events = list[tuple[Any, ...]]


def watch_writes(monkeypatch: pytest.MonkeyPatch) -> Events:
    events: Events = []

    async def sending(producer: Any, topic: str, value: Any, **options: Any) -> Any:
        events.append(("send", topic, options["key"]))
        return await enqueue(producer, topic, value, **options)

    async def waiting(producer: Any, health: Any, sent: Any) -> None:
        await acknowledged(producer, health, sent)
        events.append(("acked", [(s.topic, s.key) for s in sent]))

    monkeypatch.setattr(publish, "enqueue", sending)
    monkeypatch.setattr(publish, "acknowledged", waiting)
    return events


def states_per_wait(events: Events, settings: Settings, accounts: list[str]) -> list[int]:
    """How many state records of ``accounts`` each acknowledgement wait held."""
    keys = {a.encode() for a in accounts}
    counts = [
        sum(1 for topic, key in e[1] if topic == settings.topics.state and key in keys)
        for e in events
        if e[0] == "acked"
    ]
    return [n for n in counts if n]


def assert_states_acked_before_replies(
    events: Events, settings: Settings, accounts: list[str]
) -> None:
    """Each account's state record is acknowledged before its reply is handed over."""
    t = settings.topics
    for account in accounts:
        key = account.encode()
        acked = next(i for i, e in enumerate(events) if e[0] == "acked" and (t.state, key) in e[1])
        replied = next(
            i for i, e in enumerate(events) if e[:2] == ("send", t.replies) and e[2] == key
        )
        assert acked < replied, f"{account}: reply handed over before its state's ack"


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def registered(b: Bus, accounts: list[str], ref: str | None = None) -> None:
    commands = [register_cmd(a, ref or uid("ok")) for a in accounts]
    for cmd in commands:
        await b.send(cmd)
    ids = {cmd.command_id for cmd in commands}
    await b.wait_for(lambda: ids <= {e["command_id"] for e in b.status_events()})


async def send_at_once(b: Bus, commands: list[Any]) -> None:
    """In one go, so that one fetch reads them."""
    topic = b.settings.topics.commands
    sent = [
        await b.producer.send(topic, c.model_dump_json().encode(), key=c.account_id.encode())
        for c in commands
    ]
    await asyncio.gather(*sent)


def status_of(b: Bus, command_id: str) -> int:
    return int(b.replies(command_id=command_id)[0]["http_status"])


async def confirm_calls(sim_url: str, key: str) -> int:
    async with httpx.AsyncClient() as client:
        stats = (await client.get(f"{sim_url}/_sim/stats")).json()
    return int(stats["confirm_calls"].get(key, 0))


async def test_a_batchs_states_are_acknowledged_under_one_wait_before_its_replies(
    make_settings: Any, simulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=1)
    accounts = [uid("acc") for _ in range(6)]
    async with bus(settings) as b, running_worker(settings):
        await registered(b, accounts)
        events = watch_writes(monkeypatch)
        confirms = [confirm_cmd(a) for a in accounts]
        await send_at_once(b, confirms)
        await b.until_answered([c.command_id for c in confirms], timeout=60)
        assert all(status_of(b, c.command_id) == 200 for c in confirms)
        waits = states_per_wait(events, settings, accounts)
        assert sum(waits) == len(accounts)
        assert max(waits) > 1, f"one state wait per command: {waits}"
        assert_states_acked_before_replies(events, settings, accounts)


async def test_a_command_that_raises_in_a_batch_is_dead_lettered_alone(
    make_settings: Any, simulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its intent is in the store as a retry finds it: the retries re-drive it (the provider
    asked, never confirmed twice), then it is dead-lettered with a 500; the others of its
    batch are answered from the batch."""
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=1)
    cursed, *fine = accounts = [uid("acc") for _ in range(4)]
    async with bus(settings) as b, running_worker(settings):
        await registered(b, accounts)

        def settle(record: AccountRecord, result: Any, **kw: Any) -> Any:
            if record.account_id == cursed:
                raise ZeroDivisionError("a bug after the provider's answer")
            return flow.settle_confirm(record, result, **kw)

        monkeypatch.setattr("worker.auth.execute.settle_confirm", settle)
        events = watch_writes(monkeypatch)
        confirms = [confirm_cmd(a) for a in accounts]
        await send_at_once(b, confirms)
        await b.until_answered([c.command_id for c in confirms], timeout=60)
        assert [status_of(b, c.command_id) for c in confirms] == [500, 200, 200, 200]
        await b.wait_for(lambda: bool(b.raw.get(settings.topics.dlq)))
        [(key, _, headers)] = b.raw[settings.topics.dlq]
        assert key == cursed.encode()
        assert dict(headers)["dlq.attempts"] == b"3"
        assert await confirm_calls(simulator, confirms[0].command_id) == 1
        assert max(states_per_wait(events, settings, fine)) > 1, "the others as a batch"


async def test_a_parked_long_poll_is_answered_by_the_batchs_version(
    make_settings: Any, simulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=1)
    accounts = [uid("acc") for _ in range(4)]
    async with bus(settings) as b, running_worker(settings) as running:
        await registered(b, accounts)
        query = GetAuthState(
            command_id=uid("q"),
            request_id=uid("req"),
            workspace_id="ws_a",
            account_id=accounts[0],
            wait_ms=30_000,
        )
        await b.send(query)
        waits = running.worker.executor.waits  # type: ignore[attr-defined]
        for _ in range(1000):
            if waits.parked:
                break
            await asyncio.sleep(0.01)
        assert waits.parked == 1
        events = watch_writes(monkeypatch)
        await send_at_once(b, [confirm_cmd(a) for a in accounts])
        answer = await b.reply_to(query.command_id, timeout=20)
        assert answer["body"]["data"]["status"] == "passkey_confirmation_sent"
        assert max(states_per_wait(events, settings, accounts)) > 1, "from the batch"


async def test_a_record_a_batch_leaves_does_not_wait_for_its_slow_calls(
    make_settings: Any, simulator: str
) -> None:
    """A register fetched with a confirm whose provider is slow goes to the per-record path at
    once: it is decided and published while the confirm's call is still out."""
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=1)
    slow = uid("acc")
    async with bus(settings) as b, running_worker(settings):
        await registered(b, [slow], ref=uid("sim-slow"))
        confirm, newcomer = confirm_cmd(slow), register_cmd(uid("acc"), uid("ok"))
        await send_at_once(b, [confirm, newcomer])
        await b.wait_for(lambda: bool(b.status_events(command_id=newcomer.command_id)))
        assert not b.replies(command_id=confirm.command_id), "the slow call still out"
        assert (await b.reply_to(confirm.command_id))["http_status"] == 200
