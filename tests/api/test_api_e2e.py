"""End to end over real HTTP: front-end → auth.commands → the real worker → the provider
simulator (real HTTP) → auth.replies / auth.state → front-end."""

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
    KEY_B,
    headers,
    produce,
    register,
    running_api,
    running_worker,
)
from worker.contract.messages import DeregisterAccount
from worker.settings import Settings

pytestmark = pytest.mark.integration

CONFIRM = "/v1/accounts/{}/auth/passkey-confirm"
AUTH = "/v1/accounts/{}/auth"


def e2e_settings(api_settings: ApiSettings, simulator: str) -> Settings:
    return api_settings(
        provider_urls={"simulator": simulator},
        api_reply_timeout_s=10.0,
        provider_max_attempts=2,
        provider_backoff_base_s=0.01,
    )


async def poll_status(
    http: httpx.AsyncClient, account_id: str, wanted: set[str], *, key: str = KEY_A
) -> dict[str, Any]:
    """Poll GET /auth (as a caller would) until the status is one of ``wanted``."""
    deadline = time.monotonic() + 20
    last: Any = None
    while time.monotonic() < deadline:
        resp = await http.get(AUTH.format(account_id), headers=headers(key))
        last = (resp.status_code, resp.text)
        if resp.status_code == 200 and resp.json()["data"]["status"] in wanted:
            return dict(resp.json())
        await asyncio.sleep(0.05)
    raise AssertionError(f"{account_id} never reached {wanted}; last answer {last}")


def uid() -> str:
    return uuid.uuid4().hex[:8]


async def test_confirm_then_poll_until_authorized(
    api_settings: ApiSettings, simulator: str
) -> None:
    settings = e2e_settings(api_settings, simulator)
    account = f"acc_{uid()}"
    async with (
        running_worker(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        await register(settings, account, f"ok-{uid()}")
        before = await poll_status(http, account, {"passkey_confirmation"})
        assert before["data"] == {
            "account_id": account,
            "status": "passkey_confirmation",
            "auth_status": "passkey_confirmation",
            "version": before["data"]["version"],
        }
        assert isinstance(before["data"]["version"], int)

        resp = await http.post(
            CONFIRM.format(account), headers=headers(**{"X-Request-Id": "e2e-1"})
        )
        assert resp.status_code == 200, resp.text
        assert resp.json() == {
            "request_id": "e2e-1",
            "data": {
                "account_id": account,
                "status": "passkey_confirmation_sent",
                "auth_status": "passkey_confirmation_sent",
            },
        }
        assert resp.headers["x-request-id"] == "e2e-1"

        done = await poll_status(http, account, {"authorized", "failed"})
        assert done["data"]["status"] == "authorized"

        again = await http.post(CONFIRM.format(account), headers=headers())
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "account_already_authorized"
        assert again.json()["error"]["numeric_code"] == 20016
        assert api.replies.pending == 0


async def test_every_confirm_row_through_the_worker(
    api_settings: ApiSettings, simulator: str
) -> None:
    settings = e2e_settings(api_settings, simulator)
    u = uid()
    accounts = {
        # account: (workspace, provider ref, initial status)
        f"acc_unavail_{u}": ("ws_a", f"sim-unavailable-{u}", "passkey_confirmation"),
        f"acc_unsup_{u}": ("ws_a", f"sim-unsupported-{u}", "passkey_confirmation"),
        f"acc_mismatch_{u}": ("ws_a", f"sim-mismatch-{u}", "passkey_confirmation"),
        f"acc_invalid_{u}": ("ws_a", f"sim-invalid-{u}", "passkey_confirmation"),
        f"acc_fail_{u}": ("ws_a", f"sim-fail-{u}", "passkey_confirmation"),
        f"acc_early_{u}": ("ws_a", f"ok-early-{u}", "pending_auth"),
        f"acc_theirs_{u}": ("ws_b", f"ok-theirs-{u}", "passkey_confirmation"),
        f"acc_gone_{u}": ("ws_a", f"ok-gone-{u}", "passkey_confirmation"),
    }
    expected: dict[str, tuple[int, str, int]] = {
        f"acc_unavail_{u}": (502, "provider_unavailable", 30002),
        f"acc_unsup_{u}": (501, "unsupported_by_provider", 30003),
        f"acc_mismatch_{u}": (409, "provider_account_mismatch", 20017),
        f"acc_invalid_{u}": (400, "provider_invalid_request", 30001),
        f"acc_early_{u}": (409, "provider_not_ready", 30009),
        f"acc_theirs_{u}": (404, "not_found", 10001),  # ws_a's key on ws_b's account
        f"acc_gone_{u}": (404, "not_found", 10001),
        f"acc_nobody_{u}": (404, "not_found", 10001),
    }
    async with (
        running_worker(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        for account, (workspace, ref, status) in accounts.items():
            await register(settings, account, ref, workspace_id=workspace, status=status)
        gone = DeregisterAccount(
            command_id=f"dereg-{u}", workspace_id="ws_a", account_id=f"acc_gone_{u}"
        )
        await poll_status(http, f"acc_gone_{u}", {"passkey_confirmation"})
        await produce(
            settings,
            settings.topics.commands,
            [(gone.account_id.encode(), gone.model_dump_json().encode())],
        )
        await poll_status(http, f"acc_theirs_{u}", {"passkey_confirmation"}, key=KEY_B)
        for account, (workspace, _, status) in accounts.items():
            if workspace == "ws_a" and account != f"acc_gone_{u}":
                await poll_status(http, account, {status})

        # the foreign and the deregistered account are invisible to ws_a's key
        deadline = time.monotonic() + 10
        while (await http.get(AUTH.format(f"acc_gone_{u}"), headers=headers())).status_code != 404:
            assert time.monotonic() < deadline, "deregistration never reached the view"
            await asyncio.sleep(0.05)
        foreign = await http.get(AUTH.format(f"acc_theirs_{u}"), headers=headers(KEY_A))
        assert foreign.status_code == 404
        assert foreign.json()["error"]["code"] == "not_found"

        async def confirm(account: str) -> tuple[str, httpx.Response]:
            return account, await http.post(CONFIRM.format(account), headers=headers())

        results = await asyncio.gather(*(confirm(a) for a in [*expected, f"acc_fail_{u}"]))
        for account, resp in results:
            body = resp.json()
            assert resp.headers["x-request-id"] == body["request_id"]
            if account == f"acc_fail_{u}":
                assert resp.status_code == 200, resp.text
                continue
            got = (resp.status_code, body["error"]["code"], body["error"]["numeric_code"])
            assert got == expected[account], (account, body)
            assert set(body) == {"request_id", "error"}

        failed = await poll_status(http, f"acc_fail_{u}", {"authorized", "failed"})
        assert failed["data"]["status"] == "failed"

        # ws_b's own key sees and confirms its account; ws_a's account stays invisible to it
        mine = await http.post(CONFIRM.format(f"acc_theirs_{u}"), headers=headers(KEY_B))
        assert mine.status_code == 200, mine.text
        other = await http.post(CONFIRM.format(f"acc_early_{u}"), headers=headers(KEY_B))
        assert other.status_code == 404
        assert api.replies.pending == 0
