"""GET /auth is a query answered by the worker that owns the account: read-your-writes after
a 200 confirm (the query lands behind the confirm in the account's partition), a query is not
held behind a slow provider call of its account, another workspace's account is 404, and
hostile ids never reach the worker."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_B, headers, register, responder, running_api, running_worker
from tests.api.test_api_e2e import poll_status
from worker.auth.store import StateStore
from worker.engine.home_partition import home_partition

CONFIRM = "/v1/accounts/{}/auth/passkey-confirm"
AUTH = "/v1/accounts/{}/auth"
BEFORE = "passkey_confirmation"
SENT = "passkey_confirmation_sent"


@pytest.mark.integration
async def test_a_poll_right_after_a_confirm_never_shows_the_status_before_it(
    api_settings: ApiSettings, simulator: str
) -> None:
    settings = api_settings(
        provider_urls={"simulator": simulator},
        api_reply_timeout_s=10.0,
        api_rate_limit_per_s=0,  # hundreds of polls at once from one workspace: a load test
    )
    accounts = [f"acc_{uuid.uuid4().hex[:8]}" for _ in range(40)]
    # A connection idle past 2 s is not reused: the front-end closes idle ones at 5 s (uvicorn's
    # keep-alive), and a request sent on one as it closes fails unanswered (httpx.ReadError).
    # A round of 20 leaves some idle for seconds on a loaded machine.
    keep = httpx.Limits(keepalive_expiry=2.0)
    async with (
        running_worker(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15, limits=keep) as http,
    ):
        for account in accounts:
            await register(settings, account, f"ok-{account}")
        for account in accounts:
            await poll_status(http, account, {BEFORE})

        async def confirm_then_poll(account: str) -> list[str]:
            confirm = await http.post(CONFIRM.format(account), headers=headers())
            assert confirm.status_code == 200, confirm.text
            assert confirm.json()["data"]["status"] == SENT
            seen = []
            for _ in range(3):  # at once, and twice more while the load goes on
                poll = await http.get(AUTH.format(account), headers=headers())
                assert poll.status_code == 200, poll.text
                seen.append(poll.json()["data"]["status"])
            return seen

        for round_ in (accounts[:20], accounts[20:]):
            results = await asyncio.gather(*(confirm_then_poll(a) for a in round_))
            stale = [r for r in results if BEFORE in r]
            assert stale == [], f"{len(stale)} of {len(round_)} polls saw the older status"


@pytest.mark.integration
async def test_a_query_is_not_held_behind_a_slow_provider_call_of_its_account(
    api_settings: ApiSettings, simulator: str
) -> None:
    """While the account's confirm waits for a slow provider, a GET answers at once with the
    status before the confirm (its reply is not out yet); after the 200, the confirm's."""
    settings = api_settings(provider_urls={"simulator": simulator}, api_reply_timeout_s=10.0)
    account = f"acc_{uuid.uuid4().hex[:8]}"
    async with (
        running_worker(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        await register(settings, account, f"sim-slow-{account}")
        await poll_status(http, account, {BEFORE})
        partition = home_partition(account.encode(), settings.commands_partitions)
        store = worker.worker.store
        assert isinstance(store, StateStore)

        def calling() -> bool:
            record = store.get(partition, account)
            return record is not None and record.in_flight is not None

        confirm = asyncio.create_task(http.post(CONFIRM.format(account), headers=headers()))
        for _ in range(400):  # the write-ahead intent is in the store: the call is under way
            if calling() or confirm.done():
                break
            await asyncio.sleep(0.01)
        assert calling(), "the confirm never reached its provider call"
        during = await http.get(AUTH.format(account), headers=headers())
        assert not confirm.done(), "the GET waited for the provider call"
        assert during.status_code == 200 and during.json()["data"]["status"] == BEFORE
        answered = await confirm
        assert answered.status_code == 200, answered.text
        after = await http.get(AUTH.format(account), headers=headers())
        assert after.json()["data"]["status"] in {SENT, "authorized"}


@pytest.mark.integration
async def test_another_workspaces_account_is_404_like_an_unknown_one(
    api_settings: ApiSettings,
) -> None:
    settings = api_settings()
    account = f"acc_{uuid.uuid4().hex[:8]}"
    async with (
        running_worker(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        await register(settings, account, f"ok-{account}")  # ws_a's
        await poll_status(http, account, {BEFORE})
        theirs = await http.get(AUTH.format(account), headers=headers(KEY_B))
        unknown = await http.get(AUTH.format("acc_nobody_at_all"), headers=headers(KEY_B))
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json()["error"] == unknown.json()["error"]
        assert account not in theirs.text


async def test_a_hostile_account_id_is_refused_before_any_query_is_sent(
    api_settings: ApiSettings,
) -> None:
    """Huge, malformed and encoded ids answer 400 at the front door; no query reaches
    auth.commands for them, and a valid one afterwards still gets its answer."""
    settings = api_settings()
    hostile = ["a" * 129, "a" * 60_000, "-leading-dash", "has%20space", "x%00y", "%F0%9F%92%A3"]
    async with (
        responder(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        for account in hostile:
            resp = await http.get(AUTH.format(account), headers=headers())
            assert resp.status_code in (400, 431), (account[:20], resp.status_code)
            if resp.status_code == 400:
                assert resp.json()["error"]["code"] == "invalid_request"
        valid = await http.get(AUTH.format("acc_fine"), headers=headers())
        assert valid.status_code == 404  # the stand-in worker holds no account
        assert [q.account_id for q in worker.queries] == ["acc_fine"]
