"""Each GET /auth answered 500 ``get_auth_state_failed`` is counted by its cause in
``passkey_api_query_failures_total{reason}`` (docs/api.md), so a load run can tell a dev
broker too slow to answer in time from a query that never left or an answer that was wrong."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from aiokafka.errors import RequestTimedOutError

from tests.api.conftest import ApiSettings
from tests.api.support import headers, responder, running_api
from tests.api.test_api_http import assert_error
from worker.api.metrics import QUERY_FAILURES
from worker.contract.messages import GetAuthState

AUTH = "/v1/accounts/{}/auth"


def failures(api: Any) -> dict[str, float]:
    return {
        reason: api.registry.get_sample_value(
            "passkey_api_query_failures_total", {"reason": reason}
        )
        for reason in QUERY_FAILURES
    }


def only(reason: str) -> dict[str, float]:
    return {r: 1.0 if r == reason else 0.0 for r in QUERY_FAILURES}


async def test_no_answer_by_the_deadline_is_counted_as_deadline(
    api_settings: ApiSettings,
) -> None:
    """No worker reads the query: it is sent, and nothing answers it."""
    async with (
        running_api(api_settings(api_reply_timeout_s=1.0)) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        resp = await http.get(AUTH.format("acc_1"), headers=headers())
        assert_error(resp, 500, "get_auth_state_failed", 20006)
        assert failures(api) == only("deadline")
        assert api.registry.get_sample_value("passkey_api_query_timeouts_total") == 1.0


async def test_a_query_never_acknowledged_in_time_is_counted_as_not_queued(
    api_settings: ApiSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every hand-over to the producer fails for an outage reason until the deadline."""
    monkeypatch.setattr("worker.engine.broker_health.RESEND_BACKOFF_S", (0.01, 0.05))
    async with (
        running_api(api_settings(api_reply_timeout_s=1.0)) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):

        async def lost(topic: str, value: bytes | None, **_: Any) -> asyncio.Future[Any]:
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(RequestTimedOutError())
            return failed

        monkeypatch.setattr(api.producer, "send", lost)
        resp = await http.get(AUTH.format("acc_1"), headers=headers())
        assert_error(resp, 500, "get_auth_state_failed", 20006)
        assert failures(api) == only("not_queued")
        assert api.registry.get_sample_value("passkey_api_query_timeouts_total") == 0.0


async def test_an_answer_without_a_version_is_counted_as_bad_reply(
    api_settings: ApiSettings,
) -> None:
    """A 200 that does not say which version it reflects cannot be used as an answer."""

    def unversioned(query: GetAuthState) -> tuple[int, dict[str, Any]]:
        state = {"status": "passkey_confirmation", "auth_status": "passkey_confirmation"}
        return 200, {"request_id": query.request_id, "data": {"account_id": "acc_1", **state}}

    settings = api_settings(api_reply_timeout_s=10.0)
    async with (
        responder(settings, query=unversioned) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        resp = await http.get(AUTH.format("acc_1"), headers=headers())
        assert_error(resp, 500, "get_auth_state_failed", 20006)
        assert len(worker.queries) == 1
        assert failures(api) == only("bad_reply")
        assert api.registry.get_sample_value("passkey_api_query_timeouts_total") == 0.0
