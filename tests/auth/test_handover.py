"""A confirm costs no write-ahead record (docs/architecture.md, "Write-ahead intent"): a new
owner re-drives what a previous owner may have sent, which is known without one, on a real
broker with the provider mocked at its HTTP boundary."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from tests.auth.provider.hostile import STATE, HostileProvider, http, written
from tests.harness import Bus, bus, confirm_cmd, register_cmd, running_worker
from worker.auth import flow
from worker.auth.store import StateStore
from worker.contract.messages import AccountRecord, PasskeyConfirm, decode_record
from worker.engine.home_partition import home_partition
from worker.settings import Settings

pytestmark = pytest.mark.integration


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def state_records(b: Bus, account: str) -> list[AccountRecord]:
    """Every auth.state record of ``account`` read so far, in order."""
    return [
        decode_record(value)
        for key, value, _ in b.raw.get(b.settings.topics.state, [])
        if key == account.encode() and value
    ]


async def registered(b: Bus, account: str, ref: str) -> None:
    cmd = register_cmd(account, ref)
    await b.send(cmd)
    await b.wait_for(lambda: bool(b.status_events(account_id=account, command_id=cmd.command_id)))


async def sent_at(b: Bus, cmd: PasskeyConfirm) -> tuple[int, int]:
    """Produce ``cmd`` to its home partition; its (partition, offset)."""
    key = cmd.account_id.encode()
    meta = await b.producer.send_and_wait(
        b.settings.topics.commands,
        cmd.model_dump_json().encode(),
        key=key,
        partition=home_partition(key, b.settings.commands_partitions),
    )
    return meta.partition, meta.offset


def hanging(seen: asyncio.Event) -> Callable[[asyncio.StreamWriter], Awaitable[None]]:
    """A provider that takes the confirm (the effect happens) and never answers: the worker
    is stopped while it waits, as a crash between the call and the result's write."""

    async def script(writer: asyncio.StreamWriter) -> None:
        seen.set()
        await asyncio.Event().wait()

    return script


@pytest.mark.parametrize("write_ahead", [False, True])
async def test_a_confirm_writes_two_state_records(
    make_settings: Any, simulator: str, write_ahead: bool
) -> None:
    """Register, confirm, follow-up to authorized: the confirm costs the result and the
    follow-up's observation on auth.state, and no record carries an intent; with
    WORKER_WRITE_AHEAD_INTENT (while older versions share the group) the intent comes first."""
    settings = make_settings(
        provider_urls={"simulator": simulator}, worker_write_ahead_intent=write_ahead
    )
    async with bus(settings) as b, running_worker(settings):
        acc = uid("acc")
        await registered(b, acc, uid("ok"))
        await b.wait_for(lambda: len(state_records(b, acc)) == 1)
        cmd = confirm_cmd(acc)
        await b.send(cmd)
        assert (await b.reply_to(cmd.command_id))["http_status"] == 200
        await b.wait_for(lambda: bool(b.status_events(account_id=acc, status="authorized")))
        await b.wait_for(lambda: len(state_records(b, acc)) >= 3 + write_ahead)
        for _ in range(10):  # polls that find nothing new write nothing
            await b.pump()
        records = state_records(b, acc)
        intent = ["passkey_confirmation"] if write_ahead else []
        assert [r.status for r in records] == [
            "passkey_confirmation",
            *intent,
            "passkey_confirmation_sent",
            "authorized",
        ]
        carrying = [r.in_flight.command_id for r in records if r.in_flight is not None]
        assert carrying == ([cmd.command_id] if write_ahead else [])


async def test_a_confirm_a_previous_owner_may_have_sent_asks_the_provider_first(
    make_settings: Any,
) -> None:
    """The first owner sends the confirm and stops before the result is written: no intent
    is on auth.state and the offset is not committed. The next owner finds the command below
    the partition's end at its assignment, asks the provider's state first and does not
    confirm again; a command that arrives after its assignment is confirmed directly."""
    async with HostileProvider() as provider:
        posted = asyncio.Event()
        provider.by_method["POST"] = hanging(posted)
        provider.by_method["GET"] = written(http(b"200 OK", STATE))
        settings: Settings = make_settings(
            partitions=1,
            provider_urls={"simulator": provider.url},
            provider_max_attempts=1,
            worker_follow_up_poll_s=60.0,
            worker_shutdown_grace_s=0.5,
        )
        acc, later = uid("acc"), uid("later")
        cmd = confirm_cmd(acc)
        async with bus(settings) as b:
            async with running_worker(settings):
                await registered(b, acc, uid("ref"))
                await registered(b, later, uid("ref"))
                partition, offset = await sent_at(b, cmd)
                await asyncio.wait_for(posted.wait(), timeout=20)
            # stopped mid-call: the provider took the confirm, nothing else was written
            assert provider.requests == ["POST"]
            for _ in range(5):
                await b.pump()
            assert b.replies(command_id=cmd.command_id) == []
            assert [r.in_flight for r in state_records(b, acc)] == [None]

            provider.by_method["POST"] = written(http(b"200 OK", STATE))
            async with running_worker(settings) as second:
                store = second.worker.store
                assert isinstance(store, StateStore)
                assert store.inherited(settings.topics.commands, partition, offset)
                reply = await b.reply_to(cmd.command_id)
                assert reply["http_status"] == 200
                assert reply["body"]["data"]["status"] == "passkey_confirmation_sent"
                assert provider.requests == ["POST", "GET"]  # asked, not confirmed again

                fresh = confirm_cmd(later)
                partition, offset = await sent_at(b, fresh)
                assert not store.inherited(settings.topics.commands, partition, offset)
                assert (await b.reply_to(fresh.command_id))["http_status"] == 200
                assert provider.requests == ["POST", "GET", "POST"]  # confirmed, not asked
            sent = [r for r in state_records(b, acc) if r.status == "passkey_confirmation_sent"]
            assert len(sent) == 1 and sent[0].in_flight is None


async def test_a_confirm_let_go_unsettled_leaves_its_intent(
    make_settings: Any, simulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug after the provider's answer: the retries re-drive the confirm (the intent in
    memory), the command is dead-lettered, and only then is the intent written. A new owner
    that sees the same command again re-drives it: one confirm call in all."""
    settings: Settings = make_settings(
        partitions=1, provider_urls={"simulator": simulator}, worker_follow_up_poll_s=60.0
    )
    acc = uid("acc")
    cmd = confirm_cmd(acc)

    def settle(record: AccountRecord, result: Any, **kw: Any) -> Any:
        if record.in_flight is not None and record.in_flight.command_id == cmd.command_id:
            raise ZeroDivisionError("a bug after the provider's answer")
        return flow.settle_confirm(record, result, **kw)

    async with bus(settings) as b:
        async with running_worker(settings):
            await registered(b, acc, uid("ok"))
            monkeypatch.setattr("worker.auth.execute.settle_confirm", settle)
            await b.send(cmd)
            reply = await b.reply_to(cmd.command_id)
            assert reply["body"]["error"]["code"] == "run_auth_action_failed"
        assert await confirm_calls(simulator, cmd.command_id) == 1
        await b.wait_for(lambda: state_records(b, acc)[-1].in_flight is not None)
        intent = state_records(b, acc)[-1].in_flight
        assert intent is not None and intent.command_id == cmd.command_id

        monkeypatch.setattr("worker.auth.execute.settle_confirm", flow.settle_confirm)
        async with running_worker(settings):
            await b.send(cmd)  # the same command again, after the new owner's assignment
            await b.wait_for(lambda: len(b.replies(command_id=cmd.command_id)) == 2)
            again = b.replies(command_id=cmd.command_id)[1]
            assert again["http_status"] == 200
            assert again["body"]["data"]["status"] == "passkey_confirmation_sent"
        assert await confirm_calls(simulator, cmd.command_id) == 1
        assert state_records(b, acc)[-1].in_flight is None


async def confirm_calls(sim_url: str, key: str) -> int:
    async with httpx.AsyncClient() as client:
        stats = (await client.get(f"{sim_url}/_sim/stats")).json()
    return int(stats["confirm_calls"].get(key, 0))
