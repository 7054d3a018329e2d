"""The confirm route's one deadline over produce and reply wait: a command whose
acknowledgement never comes in time is answered as not queued (not as a reply time-out), and
nothing is left waiting."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from aiokafka.errors import RequestTimedOutError

from tests.api.conftest import ApiSettings
from tests.api.support import headers, running_api
from tests.api.test_api_http import CONFIRM, assert_error


async def test_a_command_never_acknowledged_in_time_is_500_not_queued(
    api_settings: ApiSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every hand-over fails for an outage reason (the record never reached the broker), so
    the front-end re-sends until the request's deadline and then says so."""
    monkeypatch.setattr("worker.engine.broker_health.RESEND_BACKOFF_S", (0.01, 0.05))
    settings = api_settings(api_reply_timeout_s=1.0)
    async with (
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        handed: list[bytes | None] = []

        async def lost(topic: str, value: bytes | None, **_: Any) -> asyncio.Future[Any]:
            handed.append(value)
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(RequestTimedOutError())
            return failed

        monkeypatch.setattr(api.producer, "send", lost)
        started = time.monotonic()
        resp = await http.post(CONFIRM.format("acc_lost"), headers=headers())
        elapsed = time.monotonic() - started
        body = assert_error(resp, 500, "run_auth_action_failed", 20010)
        assert "could not be queued in time" in body["error"]["message"]
        assert "GET /v1/accounts/acc_lost/auth" in body["error"]["message"]
        assert 0.9 <= elapsed < 3.0
        assert len(handed) > 1  # re-sent after each outage error, until the deadline
        assert api.replies.pending == 0
        assert api.registry.get_sample_value("passkey_api_reply_timeouts_total") == 0.0
