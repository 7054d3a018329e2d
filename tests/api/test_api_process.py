"""The front-end as a process and under faults: ``python -m worker api`` stops cleanly on
SIGTERM (finishing in-flight requests), a taken port fails loudly, and an unexpected
exception still answers the seed's error body."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from devstack.broker import free_port
from tests.api.conftest import ApiSettings
from tests.api.support import KEY_A, headers, running_api
from tests.cluster import kafka_env
from worker.api.app import serve_api
from worker.api.keys import KeyEntry, KeyStore
from worker.engine.kafka import ensure_topics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


async def test_python_m_worker_api_serves_and_stops_on_sigterm(api_settings: ApiSettings) -> None:
    """SIGTERM while a confirm waits for its reply: the request still gets its answer (500
    after the 2 s reply timeout, nothing is cut off), then the process exits 0."""
    settings = api_settings(api_reply_timeout_s=2.0)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    port, metrics_port = free_port(), free_port()
    env = (
        os.environ
        | kafka_env(settings)
        | {
            "ENVIRONMENT": "development",
            "API_PORT": str(port),
            "API_METRICS_PORT": str(metrics_port),
            "API_KEYS_FILE": str(settings.api_keys_file),
            "API_REPLY_TIMEOUT_S": "2.0",
            "COMMANDS_PARTITIONS": "3",
            "OTHER_PARTITIONS": "3",
            "LOG_FORMAT": "console",
        }
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker",
        "api",
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if (await http.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the API process never became ready"
                await asyncio.sleep(0.1)
            # No worker runs here: the query gets no answer within API_REPLY_TIMEOUT_S.
            unanswered = await http.get("/v1/accounts/acc_1/auth", headers=headers())
            assert unanswered.status_code == 500
            assert unanswered.json()["error"]["code"] == "get_auth_state_failed"
            # /metrics is on the side door, not the public port.
            assert (await http.get("/metrics")).status_code == 404
            scrape = await http.get(f"http://127.0.0.1:{metrics_port}/metrics")
            assert scrape.status_code == 200 and "passkey_api_refusals_total" in scrape.text
            assert "\npasskey_api_query_timeouts_total 1.0\n" in scrape.text, "the GET above"

            in_flight = asyncio.create_task(
                http.post("/v1/accounts/acc_1/auth/passkey-confirm", headers=headers())
            )
            # The signal once the confirm waits in the process (a fixed pause could signal
            # before a loaded machine's process had read it).
            pending = "\npasskey_api_pending_replies 1.0\n"
            while pending not in (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text:
                assert not in_flight.done(), "the confirm was answered before it was seen waiting"
                await asyncio.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            resp = await in_flight
            assert resp.status_code == 500
            assert resp.json()["error"]["code"] == "run_auth_action_failed"
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
        assert proc.returncode == 0, output.decode()
        text = output.decode()
        assert "api_stopped" in text
        assert KEY_A not in text
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_taken_port_fails_loudly(api_settings: ApiSettings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = api_settings(api_port=port)
        with pytest.raises(RuntimeError, match="could not listen"):
            await asyncio.wait_for(
                serve_api(settings, install_signals=False, stop=asyncio.Event()), timeout=30
            )


class _ExplodingKeys(KeyStore):
    def resolve(self, raw_key: str) -> str | None:
        raise RuntimeError("key store bug")

    def resolve_entry(self, raw_key: str) -> KeyEntry | None:
        raise RuntimeError("key store bug")


async def test_unexpected_exception_answers_the_seed_500(api_settings: ApiSettings) -> None:
    async with (
        running_api(api_settings(), keys=_ExplodingKeys()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for method, path, code, numeric in (
            ("POST", "/v1/accounts/acc_1/auth/passkey-confirm", "run_auth_action_failed", 20010),
            ("GET", "/v1/accounts/acc_1/auth", "get_auth_state_failed", 20006),
        ):
            resp = await http.request(method, path, headers=headers())
            assert resp.status_code == 500
            body = resp.json()
            assert set(body) == {"request_id", "error"}
            assert (body["error"]["code"], body["error"]["numeric_code"]) == (code, numeric)
            assert resp.headers["x-request-id"] == body["request_id"]
            assert "key store bug" not in resp.text
        assert (await http.get("/healthz")).status_code == 200  # the process lives on
