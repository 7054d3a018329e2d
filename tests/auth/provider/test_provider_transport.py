"""The provider client at its boundary: answers arrive as ``ProviderAnswer`` (status, headers,
bounded body), and every failure of the HTTP client becomes the ``TransportFailure`` that
``map_upstream_failure`` maps.

Real sockets on loopback only: the simulator, a server that hangs up, a closed port.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
from collections.abc import AsyncIterator

import pytest

from devstack.simulator import ProviderSimulator, running_simulator
from worker.auth.provider import (
    ConnectFailed,
    ConnectionLost,
    HttpProviderAdapter,
    InvalidTarget,
    ProviderAnswer,
    ProviderError,
    ProviderHttpClient,
    TimedOut,
    TransportFailure,
    map_upstream_failure,
)


@pytest.fixture(scope="module")
async def sim_url() -> AsyncIterator[str]:
    simulator = ProviderSimulator(authorize_delay_s=30.0, rng=random.Random(3), slow_ms=500.0)
    async with running_simulator(simulator) as url:
        yield url


async def test_answers_are_passed_through_unchanged(sim_url: str) -> None:
    async with ProviderHttpClient(
        timeout_s=5, max_connections=2, headers={"User-Agent": "t/1"}
    ) as c:
        ok = await c.request("GET", f"{sim_url}/v1/accounts/acct-1/auth-state")
        assert isinstance(ok, ProviderAnswer) and ok.ok
        assert ok.status == 200
        assert json.loads(ok.body) == {
            "status": "passkey_confirmation",
            "auth_status": "passkey_confirmation",
        }
        assert ok.headers["content-type"].startswith("application/json")
        assert ok.headers["Content-Type"] == ok.headers["content-type"]
        down = await c.request(
            "POST",
            f"{sim_url}/v1/accounts/sim-unavailable-1/passkey/confirm",
            headers={"Idempotency-Key": "k-1"},
        )
        assert (down.status, down.ok) == (503, False)
        assert json.loads(down.body)["error"]["type"]
        assert map_upstream_failure(down).transient


async def test_a_slow_answer_is_a_read_timeout_and_transient(sim_url: str) -> None:
    # The connect has seconds (a loaded machine may take more than 0.1 s to dial); the read,
    # 0.1 s of the simulator's 500 ms.
    async with ProviderHttpClient(timeout_s=0.1, connect_timeout_s=5.0, max_connections=2) as c:
        with pytest.raises(TimedOut) as caught:
            await c.request("GET", f"{sim_url}/v1/accounts/sim-slow-1/auth-state")
        assert caught.value.phase == "read"
        mapped = map_upstream_failure(caught.value)
        assert (mapped.error.code, mapped.error.numeric_code, mapped.transient) == (
            "provider_unavailable",
            30002,
            True,
        )


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    async with ProviderHttpClient(timeout_s=2, max_connections=2) as c:
        with pytest.raises(ConnectFailed) as caught:
            await c.request("GET", f"http://127.0.0.1:{port}/x")
        assert map_upstream_failure(caught.value).transient


async def test_a_server_that_hangs_up_is_a_transient_protocol_failure() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with ProviderHttpClient(timeout_s=2, max_connections=2) as c:
            with pytest.raises(ConnectionLost) as caught:
                await c.request("GET", f"http://127.0.0.1:{port}/x")
            assert map_upstream_failure(caught.value).transient
    finally:
        server.close()
        await server.wait_closed()


async def test_a_malformed_url_is_not_retried() -> None:
    async with ProviderHttpClient(timeout_s=2, max_connections=2) as c:
        with pytest.raises(InvalidTarget) as invalid:
            await c.request("GET", "http://[::1/x")
        assert not invalid.value.transient
        with pytest.raises(TransportFailure) as unsupported:
            await c.request("GET", "ftp://127.0.0.1/x")  # a scheme the client does not speak
        assert not map_upstream_failure(unsupported.value).transient
        adapter = HttpProviderAdapter("bad", "http://[::1", c, max_attempts=3)
        with pytest.raises(ProviderError) as caught:
            await adapter.get_auth_state("acct-1")
        assert caught.value.error.code == "provider_unavailable"
        assert not caught.value.transient


async def test_a_closed_client_refuses_requests() -> None:
    c = ProviderHttpClient(timeout_s=1, max_connections=1)
    await c.aclose()
    assert c.is_closed
    with pytest.raises(RuntimeError, match="closed"):
        await c.request("GET", "http://127.0.0.1:9/x")
