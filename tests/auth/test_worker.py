"""The worker on a real broker: every row of the confirm decision table (docs/architecture.md)
through Kafka, poison input, order under concurrency, and a restart that restores state from
auth.state."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.harness import Bus, bus, confirm_cmd, register_cmd, running_worker
from worker.contract.messages import InFlight, ObserveAuthState, decode_record, encode_record
from worker.engine.home_partition import home_partition

pytestmark = pytest.mark.integration


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def sim_calls(sim_url: str, key: str) -> int:
    async with httpx.AsyncClient() as client:
        stats = (await client.get(f"{sim_url}/_sim/stats")).json()
    return int(stats["confirm_calls"].get(key, 0))


async def sim_effects(sim_url: str, key: str) -> int:
    async with httpx.AsyncClient() as client:
        stats = (await client.get(f"{sim_url}/_sim/stats")).json()
    return int(stats["confirm_effects"].get(key, 0))


async def registered(b: Bus, account: str, ref: str, **kw: Any) -> None:
    cmd = register_cmd(account, ref, **kw)
    await b.send(cmd)
    await b.wait_for(lambda: bool(b.status_events(account_id=account, command_id=cmd.command_id)))


def error_of(reply: dict[str, Any]) -> tuple[int, str, int]:
    err = reply["body"]["error"]
    return reply["http_status"], err["code"], err["numeric_code"]


# --------------------------------------------------------------------------------------------


async def test_happy_path_confirm_then_follow_up_to_authorized(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator})
    async with bus(settings) as b, running_worker(settings):
        acc = uid("acc")
        await registered(b, acc, uid("ok"))
        cmd = confirm_cmd(acc)
        await b.send(cmd)
        reply = await b.reply_to(cmd.command_id)
        assert reply["http_status"] == 200
        assert reply["request_id"] == cmd.request_id
        assert reply["body"] == {
            "request_id": cmd.request_id,
            "data": {
                "account_id": acc,
                "status": "passkey_confirmation_sent",
                "auth_status": "passkey_confirmation_sent",
            },
        }
        await b.wait_for(lambda: bool(b.status_events(account_id=acc, status="authorized")))
        events = b.status_events(account_id=acc)
        assert [e["status"] for e in events] == [
            "passkey_confirmation",
            "passkey_confirmation_sent",
            "authorized",
        ]
        assert [e["version"] for e in events] == [1, 2, 3]
        assert events[1]["command_id"] == cmd.command_id
        assert events[1]["request_id"] == cmd.request_id
        assert len({e["event_id"] for e in events}) == 3
        assert await sim_calls(simulator, cmd.command_id) == 1

        # already sent / authorized: no second provider call
        again = confirm_cmd(acc)
        await b.send(again)
        r = await b.reply_to(again.command_id)
        assert error_of(r) == (409, "account_already_authorized", 20016)
        assert await sim_calls(simulator, again.command_id) == 0


@pytest.mark.parametrize(
    ("ref_prefix", "expected"),
    [
        ("sim-unavailable-", (502, "provider_unavailable", 30002)),
        ("sim-mismatch-", (409, "provider_account_mismatch", 20017)),
        ("sim-invalid-", (400, "provider_invalid_request", 30001)),
        ("sim-unsupported-", (501, "unsupported_by_provider", 30003)),
    ],
)
async def test_provider_faults_are_catalogued(
    make_settings: Any, simulator: str, ref_prefix: str, expected: tuple[int, str, int]
) -> None:
    settings = make_settings(
        provider_urls={"simulator": simulator},
        provider_max_attempts=2,
        provider_backoff_base_s=0.01,
    )
    async with bus(settings) as b, running_worker(settings):
        acc = uid("acc")
        await registered(b, acc, uid(ref_prefix.rstrip("-")))
        cmd = confirm_cmd(acc)
        await b.send(cmd)
        reply = await b.reply_to(cmd.command_id)
        assert error_of(reply) == expected
        assert reply["body"]["request_id"] == cmd.request_id
        await b.wait_for(lambda: bool(b.errors(command_id=cmd.command_id)))
        event = b.errors(command_id=cmd.command_id)[0]
        assert event["http_status"] == expected[0]
        assert event["error"] == reply["body"]["error"]
        assert event["workspace_id"] == "ws_a"
        # the account stays at the challenge: nothing moved
        assert [e["status"] for e in b.status_events(account_id=acc)] == ["passkey_confirmation"]


async def test_failing_flow_ends_failed(make_settings: Any, simulator: str) -> None:
    settings = make_settings(provider_urls={"simulator": simulator})
    async with bus(settings) as b, running_worker(settings):
        acc = uid("acc")
        await registered(b, acc, uid("sim-fail"))
        cmd = confirm_cmd(acc)
        await b.send(cmd)
        assert (await b.reply_to(cmd.command_id))["http_status"] == 200
        await b.wait_for(lambda: bool(b.status_events(account_id=acc, status="failed")))


async def test_state_rows_without_provider_call(make_settings: Any, simulator: str) -> None:
    settings = make_settings(provider_urls={"simulator": simulator})
    async with bus(settings) as b, running_worker(settings):
        cases: list[tuple[str, dict[str, Any], tuple[int, str, int]]] = [
            ("pending", {}, (409, "provider_not_ready", 30009)),
            ("awaiting_qr_scan", {}, (409, "provider_not_ready", 30009)),
            ("failed", {}, (409, "provider_not_ready", 30009)),
            ("authorized", {}, (409, "account_already_authorized", 20016)),
            ("passkey_confirmation", {"provider": None}, (409, "account_binding_not_found", 30006)),
            (
                "passkey_confirmation",
                {"provider": "nowhere"},
                (502, "provider_adapter_not_found", 30004),
            ),
        ]
        sent = []
        for status, kw, expected in cases:
            acc = uid("acc")
            await registered(b, acc, uid("ok"), status=status, **kw)
            cmd = confirm_cmd(acc)
            await b.send(cmd)
            sent.append((cmd, expected))
        for cmd, expected in sent:
            assert error_of(await b.reply_to(cmd.command_id)) == expected
            assert await sim_calls(simulator, cmd.command_id) == 0


async def test_unknown_and_foreign_accounts_are_404(make_settings: Any, simulator: str) -> None:
    settings = make_settings(provider_urls={"simulator": simulator})
    async with bus(settings) as b, running_worker(settings):
        acc = uid("acc")
        await registered(b, acc, uid("ok"), workspace_id="ws_owner")
        unknown = confirm_cmd(uid("nobody"))
        forged = confirm_cmd(acc, workspace_id="ws_attacker")  # straight to Kafka
        await b.send(unknown)
        await b.send(forged)
        for cmd in (unknown, forged):
            assert error_of(await b.reply_to(cmd.command_id)) == (404, "not_found", 10001)
        assert await sim_calls(simulator, forged.command_id) == 0
        # the owner's account did not move and its events never name the attacker
        assert [e["status"] for e in b.status_events(account_id=acc)] == ["passkey_confirmation"]
        forged_errors = b.errors(command_id=forged.command_id)
        await b.wait_for(lambda: bool(b.errors(command_id=forged.command_id)))
        forged_errors = b.errors(command_id=forged.command_id)
        assert forged_errors[0]["workspace_id"] == "ws_attacker"


async def test_a_foreign_confirm_leaves_the_owners_confirm_in_flight_alone(
    make_settings: Any, simulator: str
) -> None:
    """An owner's confirm left in flight by a crash is settled by the owner's next command,
    never by another workspace's: that one is answered as for an unknown id and the owner
    hears nothing of it."""
    settings = make_settings(provider_urls={"simulator": simulator})
    acc, stale = uid("acc"), uid("stale")
    async with bus(settings) as b:
        async with running_worker(settings):
            await registered(b, acc, uid("ok"), workspace_id="ws_owner")
        await b.wait_for(lambda: bool(b.of(settings.topics.state, account_id=acc)))
        raw = [v for k, v, _ in b.raw[settings.topics.state] if k == acc.encode() and v]
        now = time.time()
        intent = InFlight(
            command_id=stale, request_id=f"req-{stale}", started_at=now, deadline=now + 30
        )
        await b.producer.send_and_wait(
            settings.topics.state,
            encode_record(replace(decode_record(raw[-1]), in_flight=intent)),
            key=acc.encode(),
            partition=home_partition(acc.encode(), settings.commands_partitions),
        )
        async with running_worker(settings):
            forged = confirm_cmd(acc, workspace_id="ws_attacker")
            unknown = confirm_cmd(uid("nobody"), workspace_id="ws_attacker")
            await b.send(forged)
            await b.send(unknown)
            replies = [await b.reply_to(c.command_id) for c in (forged, unknown)]
            assert [error_of(r) for r in replies] == [(404, "not_found", 10001)] * 2
            assert replies[0]["body"]["error"] == replies[1]["body"]["error"]
            for _ in range(10):
                await b.pump()
            assert b.status_events(command_id=stale) == b.errors(command_id=stale) == []
            assert await sim_calls(simulator, stale) == 0
            # the owner's own next command does settle it (so the checks above can see it)
            own = confirm_cmd(acc, workspace_id="ws_owner")
            await b.send(own)
            await b.reply_to(own.command_id)
            await b.wait_for(
                lambda: bool(b.status_events(command_id=stale) or b.errors(command_id=stale))
            )


async def test_duplicate_command_id_replays_same_reply_and_calls_once(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator})
    async with bus(settings) as b, running_worker(settings):
        acc = uid("acc")
        await registered(b, acc, uid("ok"))
        cmd = confirm_cmd(acc)
        await b.send(cmd)
        await b.send(cmd)
        await b.wait_for(lambda: len(b.replies(command_id=cmd.command_id)) == 2)
        first, second = b.replies(command_id=cmd.command_id)
        assert first == second
        assert await sim_calls(simulator, cmd.command_id) == 1
        sent_events = b.status_events(account_id=acc, status="passkey_confirmation_sent")
        assert len({e["event_id"] for e in sent_events}) == 1


async def test_observed_signal_moves_flow(make_settings: Any, simulator: str) -> None:
    settings = make_settings(provider_urls={"simulator": simulator}, worker_follow_up_poll_s=60.0)
    async with bus(settings) as b, running_worker(settings):
        acc = uid("acc")
        await registered(b, acc, uid("ok"), status="pending_auth")
        obs = ObserveAuthState(
            command_id=uid("obs"),
            account_id=acc,
            status="passkey_confirmation",
            auth_status="passkey_confirmation",
            source="webhook",
        )
        await b.send(obs)
        await b.wait_for(lambda: bool(b.status_events(command_id=obs.command_id)))
        ev = b.status_events(command_id=obs.command_id)[0]
        assert (ev["previous_status"], ev["status"], ev["version"]) == (
            "pending_auth",
            "passkey_confirmation",
            2,
        )


async def test_poison_records_go_to_dlq_and_processing_continues(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=1)
    async with bus(settings) as b, running_worker(settings):
        acc = uid("acc")
        await b.send_raw(b"x", b"\xff\xfe not json")
        await b.send_raw(
            acc.encode(), b'{"type": "launch_rockets", "account_id": "%s"}' % acc.encode()
        )
        await b.send_raw(
            acc.encode(), b'{"type": "passkey_confirm", "account_id": "%s"}' % acc.encode()
        )
        mismatch = confirm_cmd(acc)
        await b.send(mismatch, key="someone-else")
        await b.send_raw(acc.encode(), b"[1, 2, 3]")
        await b.send_raw(acc.encode(), b"{" + b" " * 70_000 + b"}")
        # a good record after the poison is still processed
        await registered(b, acc, uid("ok"))
        good = confirm_cmd(acc)
        await b.send(good)
        assert (await b.reply_to(good.command_id))["http_status"] == 200
        await b.wait_for(lambda: len(b.raw.get(settings.topics.dlq, [])) == 6)
        reasons = [dict(h)["dlq.reason"].decode() for _, _, h in b.raw[settings.topics.dlq]]
        # different keys are different lanes, so only per-key order is defined
        assert sorted(reasons) == sorted(
            ["not_json", "unknown_type", "invalid", "key_mismatch", "not_object", "too_large"]
        )
        # the original bytes are kept
        assert b"\xff\xfe not json" in [v for _, v, _ in b.raw[settings.topics.dlq]]
        # error events where the account id could be read
        await b.wait_for(lambda: len(b.errors(account_id=acc)) >= 3)
        codes = {(e["error"]["code"], e["http_status"]) for e in b.errors(account_id=acc)}
        assert codes == {("invalid_request", 400)}


async def test_per_account_order_while_other_accounts_overtake(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=1)
    async with bus(settings) as b, running_worker(settings):
        slow = [uid("slow") for _ in range(3)]
        fast = [uid("fast") for _ in range(20)]
        for acc in slow:
            await registered(b, acc, uid("sim-slow"))
        for acc in fast:
            await registered(b, acc, uid("ok"))
        order: dict[str, list[str]] = {}
        acks = []
        # All in one go, in this order on the partition (the producer keeps it): sent one at a
        # time, a loaded machine's acknowledgements outlasted the slow calls (2 s for the 69),
        # and the last fast commands were written after the slow ones were answered.
        for acc in slow + fast:
            cmds = [confirm_cmd(acc) for _ in range(3)]
            order[acc] = [c.command_id for c in cmds]
            for c in cmds:
                value, key = c.model_dump_json().encode(), acc.encode()
                acks.append(await b.producer.send(settings.topics.commands, value, key=key))
        await asyncio.gather(*acks)
        all_ids = [cid for ids in order.values() for cid in ids]
        await b.wait_for(
            lambda: (
                len({r["command_id"] for r in b.replies() if r["command_id"] in all_ids})
                == len(all_ids)
            ),
            timeout=60,
        )
        arrival = [r["command_id"] for r in b.replies() if r["command_id"] in all_ids]
        for acc, ids in order.items():
            got = [cid for cid in arrival if cid in ids]
            assert got == ids, f"{acc} outputs out of command order"
            # first confirm calls the provider, the next two see the flow already sent
            assert b.replies(command_id=ids[0])[0]["http_status"] == 200
        # fast accounts queued behind the slow ones in the same partition overtook them
        last_fast = max(arrival.index(order[a][-1]) for a in fast)
        first_slow_done = min(arrival.index(order[a][0]) for a in slow)
        assert last_fast < first_slow_done


async def test_restart_restores_state_and_applies_nothing_twice(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator})
    async with bus(settings) as b:
        accounts = [uid("acc") for _ in range(6)]
        first_cmds = {a: confirm_cmd(a) for a in accounts}
        async with running_worker(settings):
            for acc in accounts:
                await registered(b, acc, uid("ok"))
            for cmd in first_cmds.values():
                await b.send(cmd)
            for cmd in first_cmds.values():
                await b.reply_to(cmd.command_id)
        # worker is gone; commands sent meanwhile wait in Kafka
        second = {a: confirm_cmd(a) for a in accounts}
        for acc, cmd in second.items():
            await b.send(cmd)
            await b.send(first_cmds[acc])  # a duplicate of an already-applied command
        async with running_worker(settings):
            for cmd in second.values():
                reply = await b.reply_to(cmd.command_id)
                # restored state: the account is already past the challenge
                assert reply["http_status"] in (200, 409)
                if reply["http_status"] == 200:
                    assert reply["body"]["data"]["status"] == "passkey_confirmation_sent"
                else:
                    assert reply["body"]["error"]["code"] == "account_already_authorized"
            await b.wait_for(
                lambda: all(
                    len(b.replies(command_id=c.command_id)) == 2 for c in first_cmds.values()
                )
            )
        for acc, cmd in first_cmds.items():
            a, bb = b.replies(command_id=cmd.command_id)
            assert a == bb  # the duplicate got the original reply
            assert await sim_effects(simulator, cmd.command_id) == 1
            assert await sim_calls(simulator, cmd.command_id) == 1
            assert await sim_calls(simulator, second[acc].command_id) == 0
            # replays re-send identical events (same event_id); distinct events rise by one
            distinct = {e["event_id"]: e for e in b.status_events(account_id=acc)}
            versions = [e["version"] for e in distinct.values()]
            assert versions == list(range(1, len(versions) + 1))


async def test_workers_share_partitions_and_rebalance(make_settings: Any, simulator: str) -> None:
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=4)
    async with bus(settings) as b, running_worker(settings) as w1:
        accounts = [uid("acc") for _ in range(12)]
        for acc in accounts:
            await registered(b, acc, uid("ok"))
        async with running_worker(settings) as w2:
            await asyncio.sleep(0.5)
            cmds = [confirm_cmd(a) for a in accounts]
            for c in cmds:
                await b.send(c)
            for c in cmds:
                assert (await b.reply_to(c.command_id, timeout=40))["http_status"] == 200
            assert w1.worker.active.isdisjoint(w2.worker.active)
        for c in cmds:
            assert await sim_calls(simulator, c.command_id) == 1


async def test_an_assignment_during_shutdown_is_not_restored(make_settings: Any) -> None:
    """A rebalance that completes while the worker stops must not restore partitions it will
    never process (``consumer.stop()`` waits for it, delaying the LeaveGroup)."""
    settings = make_settings(partitions=2)
    async with running_worker(settings) as running:
        worker = running.worker
        owned = set(worker.consumer.assignment())
        restores: list[int] = []
        factory = worker._restore_consumer

        def counting_factory() -> Any:
            restores.append(1)
            return factory()

        worker._restore_consumer = counting_factory
        worker.active.clear()
        worker.stop()
        await worker.on_partitions_assigned(owned)
        assert restores == []
        assert worker.active == set()
        assert worker.consumer.paused() >= owned
