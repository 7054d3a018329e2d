"""Read-your-writes: after a POST answered with a status, a GET on the same front-end never
shows an older version of that account, under concurrent load; and the view's rules alone."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import httpx
import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import headers, register, running_api, running_worker
from tests.api.test_api_e2e import poll_status
from worker.api.view import AccountView, AuthStateView
from worker.messages import AccountRecord, encode_record

CONFIRM = "/v1/accounts/{}/auth/passkey-confirm"
AUTH = "/v1/accounts/{}/auth"
BEFORE = "passkey_confirmation"


@pytest.mark.integration
async def test_a_poll_right_after_a_confirm_never_shows_the_status_before_it(
    api_settings: ApiSettings, simulator: str
) -> None:
    settings = api_settings(
        provider_urls={"simulator": simulator},
        api_reply_timeout_s=10.0,
        api_rate_limit_per_s=0,  # hundreds of polls at once from one workspace: a load test
    )
    accounts = [f"acc_{uuid.uuid4().hex[:8]}" for _ in range(60)]
    async with (
        running_worker(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        for account in accounts:
            await register(settings, account, f"ok-{account}")
        for account in accounts:
            await poll_status(http, account, {BEFORE})
        # The view's tail held back, as a replica under load falls behind: from here on it
        # reads nothing, so every fresh status must come from this replica's own replies.
        api.view.consumer.pause(*api.view.partitions)

        async def confirm_then_poll(account: str) -> list[str]:
            confirm = await http.post(CONFIRM.format(account), headers=headers())
            assert confirm.status_code == 200, confirm.text
            assert confirm.json()["data"]["status"] == "passkey_confirmation_sent"
            seen = []
            for _ in range(3):  # at once, and twice more while the load goes on
                poll = await http.get(AUTH.format(account), headers=headers())
                assert poll.status_code == 200, poll.text
                seen.append(poll.json()["data"]["status"])
            return seen

        for round_ in (accounts[:30], accounts[30:]):
            results = await asyncio.gather(*(confirm_then_poll(a) for a in round_))
            stale = [r for r in results if BEFORE in r]
            assert stale == [], f"{len(stale)} of {len(round_)} polls saw the older status"
        api.view.consumer.resume(*api.view.partitions)
        for account in accounts:  # the view catches up and takes over
            await poll_status(http, account, {"passkey_confirmation_sent", "authorized"})


def _msg(record: AccountRecord) -> SimpleNamespace:
    return SimpleNamespace(value=encode_record(record), key=record.account_id.encode())


def _record(version: int, status: str, *, deregistered: bool = False) -> AccountRecord:
    return AccountRecord(
        account_id="acc_1",
        workspace_id="ws_a",
        status=status,
        auth_status=status,
        version=version,
        updated_at=1_800_000_000.0,
        deregistered=deregistered,
    )


def test_the_view_never_goes_below_a_remembered_write_and_forgets_it_once_caught_up() -> None:
    view = AuthStateView(consumer=None, topic="t")
    view.handle([_msg(_record(1, BEFORE))])
    sent = AccountView("ws_a", "passkey_confirmation_sent", "passkey_confirmation_sent", version=2)
    view.remember("acc_1", sent)
    assert view.lookup("acc_1", "ws_a") == sent
    assert view.lookup("acc_1", "ws_b") is None, "another workspace still sees nothing"
    view.handle([_msg(_record(1, BEFORE))])  # a replayed older record changes nothing
    assert view.lookup("acc_1", "ws_a") == sent
    view.handle([_msg(_record(3, "authorized"))])
    held = view.lookup("acc_1", "ws_a")
    assert held is not None and (held.status, held.version) == ("authorized", 3)
    view.remember("acc_1", sent)  # older than the view: ignored
    assert view.lookup("acc_1", "ws_a") == held
    view.handle([_msg(_record(4, "authorized", deregistered=True))])
    assert view.lookup("acc_1", "ws_a") is None


def test_the_view_skips_a_record_it_cannot_read_and_keeps_the_rest() -> None:
    view = AuthStateView(consumer=None, topic="t")
    other_schema = encode_record(_record(2, "authorized")).replace(
        b'"schema_version":1', b'"schema_version":2'
    )
    bad = [
        SimpleNamespace(value=b"not json", key=b"acc_1", partition=0, offset=0),
        SimpleNamespace(value=other_schema, key=b"acc_1", partition=0, offset=1),
    ]
    view.handle([_msg(_record(1, BEFORE)), *bad])
    assert view.undecodable == 2
    held = view.lookup("acc_1", "ws_a")
    assert held is not None and (held.status, held.version) == (BEFORE, 1)
