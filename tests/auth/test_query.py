"""The ``get_auth_state`` query at the worker: one reply from the store, nothing written, the
workspace rules of ``GET /auth``, counted as a query, and hostile queries dead-lettered."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.auth.test_worker import error_of, registered, uid
from tests.harness import bus, confirm_cmd, running_worker
from worker.auth.flow import answer_query
from worker.contract.messages import AccountRecord, GetAuthState


def query(account_id: str, workspace_id: str = "ws_a") -> GetAuthState:
    cid = str(uuid.uuid4())
    return GetAuthState(
        command_id=cid, request_id=f"req-{cid}", workspace_id=workspace_id, account_id=account_id
    )


def record(**kw: Any) -> AccountRecord:
    values: dict[str, Any] = {
        "account_id": "acc_1",
        "workspace_id": "ws_a",
        "status": "passkey_confirmation",
        "auth_status": "passkey_confirmation",
        "version": 3,
        "updated_at": 1.0,
    }
    return AccountRecord(**(values | kw))


def test_the_answer_is_the_record_as_it_is_and_nothing_else() -> None:
    q = query("acc_1")
    decision = answer_query(record(), q)
    assert decision.record is None and decision.call is None
    assert decision.status_event is None and decision.error_event is None
    assert decision.reply is not None
    assert (decision.reply.http_status, decision.reply.version) == (200, 3)
    assert decision.reply.body.model_dump(exclude_none=True) == {
        "request_id": q.request_id,
        "data": {
            "account_id": "acc_1",
            "status": "passkey_confirmation",
            "auth_status": "passkey_confirmation",
        },
    }
    missing = [
        answer_query(None, q),
        answer_query(record(deregistered=True), q),
        answer_query(record(workspace_id="ws_b"), q),
    ]
    bodies = {json.dumps(d.reply.body.model_dump(exclude_none=True)) for d in missing if d.reply}
    assert len(bodies) == 1 and all(d.reply and d.reply.http_status == 404 for d in missing)
    assert all(d.error_event is None and d.record is None for d in missing)


@pytest.mark.integration
async def test_the_owner_answers_a_query_and_writes_nothing_but_the_reply(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator})
    async with bus(settings) as b, running_worker(settings) as running:
        acc = uid("acc")
        await registered(b, acc, uid("ok"))
        confirm = confirm_cmd(acc)
        await b.send(confirm)
        assert (await b.reply_to(confirm.command_id))["http_status"] == 200
        q = query(acc)
        await b.send(q)  # behind the confirm in the partition
        reply = await b.reply_to(q.command_id)
        assert reply["http_status"] == 200
        assert reply["body"]["data"]["status"] in {"passkey_confirmation_sent", "authorized"}
        assert reply["version"] >= 2
        foreign, unknown = query(acc, "ws_other"), query(uid("acc"))
        for cmd in (foreign, unknown):
            await b.send(cmd)
        answers = [await b.reply_to(c.command_id) for c in (foreign, unknown)]
        assert [error_of(a) for a in answers] == [(404, "not_found", 10001)] * 2
        assert answers[0]["body"]["error"] == answers[1]["body"]["error"]
        await b.pump(300)
        for cmd in (q, foreign, unknown):  # only the reply: no event, no error, no state
            assert b.errors(command_id=cmd.command_id) == []
            assert b.status_events(command_id=cmd.command_id) == []
        state = b.of(settings.topics.state, account_id=acc)
        assert all(q.command_id not in json.dumps(s) for s in state)

        def count(outcome: str, kind: str = "get_auth_state") -> float:
            return (
                running.registry.get_sample_value(
                    "passkey_auth_commands_total", {"type": kind, "outcome": outcome}
                )
                or 0.0
            )

        assert (count("ok"), count("error")) == (1.0, 2.0)
        # The store's size is read on scrape (not set per command): the one account.
        assert running.registry.get_sample_value("passkey_auth_state_store_accounts") == 1.0
        assert count("ok", "passkey_confirm") == 1.0  # the confirm alone
        assert running.registry.get_sample_value(
            "passkey_auth_errors_total",
            {"code": "not_found", "numeric_code": "10001", "http_status": "404"},
        ) in (None, 0.0)


@pytest.mark.integration
async def test_a_hostile_query_is_dead_lettered_and_the_next_one_answered(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator})
    async with bus(settings) as b, running_worker(settings):
        acc = uid("acc")
        await registered(b, acc, uid("ok"))
        huge = {
            "type": "get_auth_state",
            "command_id": "c-huge",
            "request_id": "r-huge",
            "workspace_id": "ws_a",
            "account_id": "a" * 5000,
        }
        await b.send_raw(b"a" * 5000, json.dumps(huge).encode())
        await b.send_raw(acc.encode(), b'{"type": "get_auth_state", "account_id": [1, 2]}')
        wrong_key = query(acc).model_dump_json().encode()
        await b.send_raw(b"someone-else", wrong_key)
        await b.wait_for(lambda: len(b.raw.get(settings.topics.dlq, [])) >= 3)
        q = query(acc)
        await b.send(q)
        assert (await b.reply_to(q.command_id))["http_status"] == 200
