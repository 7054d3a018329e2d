"""GET /auth as a long-poll (docs/api.md, "Waiting for the outcome"), through the real stack:
a long-poll started before a confirm answers with its outcome and, asked again with its
version, with the next one; with nothing to wait for it answers after its wait with the same
version; a stop answers it at once; bad parameters are 400 before anything is sent; it counts
once against the rate limit; a caller that goes away frees its reply waiter at once."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import (
    KEY_A,
    headers,
    register,
    responder,
    running_api,
    running_worker,
    wait_until,
)
from tests.api.test_api_e2e import poll_status
from worker.api import long_poll
from worker.auth.execute import Executor
from worker.engine.home_partition import home_partition

CONFIRM = "/v1/accounts/{}/auth/passkey-confirm"
AUTH = "/v1/accounts/{}/auth"
BEFORE = "passkey_confirmation"
SENT = "passkey_confirmation_sent"


def executor_of(worker: Any) -> Executor:
    executor = worker.worker.executor
    assert isinstance(executor, Executor)
    return executor


def ended(worker: Any, reason: str) -> float:
    value = worker.registry.get_sample_value(
        "passkey_auth_parked_waits_ended_total", {"reason": reason}
    )
    return value or 0.0


@pytest.mark.integration
@pytest.mark.slow
async def test_a_long_poll_started_before_a_confirm_answers_its_outcome_then_the_next(
    api_settings: ApiSettings, simulator: str
) -> None:
    settings = api_settings(provider_urls={"simulator": simulator}, api_reply_timeout_s=10.0)
    account = f"acc_{uuid.uuid4().hex[:8]}"
    async with (
        running_worker(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=60) as http,
    ):
        await register(settings, account, f"ok-{account}")
        await poll_status(http, account, {BEFORE})
        plain = await http.get(AUTH.format(account), headers=headers())
        assert plain.status_code == 200, plain.text
        first = plain.json()["data"]
        assert set(first) == {"account_id", "status", "auth_status", "version"}
        waits = executor_of(worker).waits
        url = f"{AUTH.format(account)}?after_version={first['version']}&wait_s=20"
        waiting = asyncio.create_task(http.get(url, headers=headers()))
        await wait_until(lambda: waits.parked == 1, what="the long-poll parked")
        assert not waiting.done()

        confirm = await http.post(CONFIRM.format(account), headers=headers())
        assert confirm.status_code == 200, confirm.text
        answered = await asyncio.wait_for(waiting, 20)
        assert answered.status_code == 200, answered.text
        sent = answered.json()["data"]
        assert sent["status"] == SENT and sent["version"] > first["version"]

        # Asked again with its version: the next change (the simulator authorizes).
        again = await http.get(
            f"{AUTH.format(account)}?after_version={sent['version']}&wait_s=20", headers=headers()
        )
        assert again.status_code == 200, again.text
        done = again.json()["data"]
        assert done["status"] == "authorized" and done["version"] > sent["version"]
        after = await http.get(AUTH.format(account), headers=headers())
        assert after.json()["data"] == done  # what a plain GET after it shows
        assert ended(worker, "changed") == 2
        assert api.replies.pending == 0


@pytest.mark.integration
async def test_nothing_to_wait_for_answers_after_the_wait_with_the_same_version(
    api_settings: ApiSettings,
) -> None:
    settings = api_settings()
    account = f"acc_{uuid.uuid4().hex[:8]}"
    async with (
        running_worker(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=30) as http,
    ):
        await register(settings, account, f"ok-{account}")
        seen = await poll_status(http, account, {BEFORE})
        version = seen["data"]["version"]
        started = time.monotonic()
        resp = await http.get(
            f"{AUTH.format(account)}?after_version={version}&wait_s=1", headers=headers()
        )
        waited = time.monotonic() - started
        assert resp.status_code == 200, resp.text
        assert resp.json()["data"] == seen["data"]  # the same state, the same version
        assert waited >= 0.9, "answered before its wait"
        assert ended(worker, "timeout") == 1
        # Already past the version asked: at once, not parked.
        past = await http.get(
            f"{AUTH.format(account)}?after_version={version - 1}&wait_s=20", headers=headers()
        )
        assert past.json()["data"] == seen["data"]
        assert ended(worker, "timeout") == 1 and executor_of(worker).waits.parked == 0


@pytest.mark.integration
async def test_a_stop_answers_a_parked_long_poll_with_the_current_state(
    api_settings: ApiSettings,
) -> None:
    settings = api_settings()
    account = f"acc_{uuid.uuid4().hex[:8]}"
    async with (
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=60) as http,
    ):
        async with running_worker(settings) as worker:
            await register(settings, account, f"ok-{account}")
            seen = await poll_status(http, account, {BEFORE})
            url = f"{AUTH.format(account)}?after_version={seen['data']['version']}&wait_s=30"
            waiting = asyncio.create_task(http.get(url, headers=headers()))
            await wait_until(
                lambda: executor_of(worker).waits.parked == 1, what="the long-poll parked"
            )
            worker.stop.set()
            await asyncio.wait_for(worker.task, 30)
            assert ended(worker, "stop") == 1
        resp = await asyncio.wait_for(waiting, 10)  # not its 30 s
        assert resp.status_code == 200, resp.text
        assert resp.json()["data"] == seen["data"]


async def test_bad_parameters_are_400_before_a_query_is_sent_and_good_ones_reach_the_worker(
    api_settings: ApiSettings,
) -> None:
    settings = api_settings()
    bad = [
        "after_version=-1",
        "after_version=1.5",
        "after_version=abc",
        "after_version=",
        "after_version=99999999999999999999",
        "after_version=1&after_version=2",
        "wait_s=-1",
        "wait_s=31",
        "wait_s=nan",
        "wait_s=inf",
        "wait_s=",
        "wait_s=1&wait_s=2",
        "wait_s=" + "1" * 70,
        "wait_s=1_0",
        "wait_s= 1",
        "wait_s=0x1",
    ]
    async with (
        responder(settings) as stand_in,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        for query in bad:
            resp = await http.get(f"{AUTH.format('acc_x')}?{query}", headers=headers())
            assert resp.status_code == 400, (query, resp.status_code)
            assert resp.json()["error"]["code"] == "invalid_request"
        assert stand_in.queries == []
        plain = await http.get(AUTH.format("acc_x"), headers=headers())
        polled = await http.get(
            f"{AUTH.format('acc_x')}?after_version=7&wait_s=2.5", headers=headers()
        )
        long_decimals = await http.get(
            f"{AUTH.format('acc_x')}?wait_s=0.6234376743612149", headers=headers()
        )
        exponent = await http.get(f"{AUTH.format('acc_x')}?wait_s=3e1", headers=headers())
        statuses = {r.status_code for r in (plain, polled, long_decimals, exponent)}
        assert statuses == {404}  # the stand-in answers 404
        first, second, third, fourth = stand_in.queries
        assert (first.after_version, first.wait_ms) == (None, None)
        assert (second.after_version, second.wait_ms) == (7, 2500)
        assert (third.wait_ms, fourth.wait_ms) == (623, 30_000)


@pytest.mark.integration
async def test_a_long_poll_counts_once_against_the_rate_limit(
    api_settings: ApiSettings,
) -> None:
    settings = api_settings(api_rate_limit_per_s=0.001, api_rate_limit_burst=2)
    account = f"acc_{uuid.uuid4().hex[:8]}"
    async with (
        running_worker(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=30) as http,
    ):
        await register(settings, account, f"ok-{account}")
        partition = home_partition(account.encode(), settings.commands_partitions)
        store = executor_of(worker).store
        await wait_until(lambda: store.get(partition, account) is not None, what="registered")
        long_poll = await http.get(f"{AUTH.format(account)}?wait_s=1", headers=headers())
        assert long_poll.status_code == 200, long_poll.text
        assert ended(worker, "timeout") == 1  # it waited, and spent one request
        plain = await http.get(AUTH.format(account), headers=headers())
        assert plain.status_code == 200, plain.text
        third = await http.get(AUTH.format(account), headers=headers())
        assert third.status_code == 429


async def test_a_caller_that_goes_away_frees_its_reply_waiter_at_once(
    api_settings: ApiSettings,
) -> None:
    settings = api_settings(api_reply_timeout_s=5.0)
    async with (
        responder(settings, query=lambda _: None) as stand_in,  # never answers a query
        running_api(settings) as api,
    ):
        host, port = api.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"GET {AUTH.format('acc_gone')}?wait_s=30 HTTP/1.1\r\nHost: x\r\n"
            f"X-Api-Key: {KEY_A}\r\n\r\n".encode()
        )
        await writer.drain()
        await wait_until(lambda: api.replies.pending == 1, what="the long-poll waiting")
        # The waiter is registered before the query is sent: wait for the worker's stand-in.
        await wait_until(lambda: len(stand_in.queries) == 1, what="the query at the worker")
        assert stand_in.queries[0].wait_ms == 30_000
        writer.close()
        await writer.wait_closed()
        # Freed long before its 30 s + 5 s deadline.
        await wait_until(lambda: api.replies.pending == 0, timeout=5, what="the waiter freed")
        assert await reader.read() == b""


async def test_a_front_end_waits_at_most_its_long_poll_max(api_settings: ApiSettings) -> None:
    """``API_LONG_POLL_MAX_S``: a longer ``wait_s`` is accepted and waited that long only."""
    settings = api_settings(api_long_poll_max_s=1.5)
    async with (
        responder(settings) as stand_in,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        url = f"{AUTH.format('acc_x')}?after_version=2&wait_s=30"
        resp = await http.get(url, headers=headers())
        assert resp.status_code == 404  # the stand-in's answer
        (query,) = stand_in.queries
        assert (query.after_version, query.wait_ms) == (2, 1500)


def test_long_polls_are_held_open_within_a_workspaces_share_then_answered_at_once() -> None:
    """The front-end's long-polls through the admission rule: a workspace holding its share
    gets its next GET answered at once (``wait_s`` 0, never refused), another workspace still
    waits; a slot given back is taken again (second attacker's read: before, a key-holder
    could hold every connection parked)."""
    polls = long_poll.LongPolls(16)
    wait = long_poll.Wait(after_version=3, wait_s=20.0)
    share = polls.admission.share.per_owner
    held = [polls.admit("ws_a", wait) for _ in range(share)]
    assert all(slot is not None and w.wait_s == 20.0 for w, slot in held)
    at_once, none = polls.admit("ws_a", wait)
    assert none is None and at_once.wait_s == 0.0 and at_once.after_version == 3
    theirs, slot = polls.admit("ws_b", wait)
    assert slot is not None and theirs.wait_s == 20.0
    plain, no_slot = polls.admit("ws_c", long_poll.Wait())
    assert no_slot is None and plain.wait_s == 0.0
    for _, s in held:
        assert s is not None
        s.release()
    assert polls.admit("ws_a", wait)[1] is not None
