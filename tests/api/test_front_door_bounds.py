"""What one client without an API key can make the front-end hold, as that client would try it:
raw sockets on loopback against a real served front-end (issue 31, "Bounded resources").

* Pipelining: one write of 14,000 tiny requests (252 kB) whose answers are never read. The
  process reads at most ``max_pipelined`` requests ahead of the one it answers and holds the
  rest of that one read; a peer that does not read its answers is cut off at the write
  deadline, so the connection's memory and slot are both bounded.
* Connection slots: one client address holds at most ``API_MAX_CONNECTIONS_PER_CLIENT`` of the
  process's connections; another address (127.0.0.2: every 127.x address is loopback) is
  served while the first holds its share.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_A, running_api
from tests.api.test_front_door import (
    WAIT_S,
    closed_by_server,
    read_response,
    refusals,
    rss_bytes,
)
from worker.api import server as api_server
from worker.api.protocol import (
    MAX_LINGERING,
    MAX_PIPELINED,
    PIPELINED_BYTES,
    READ_BYTES,
    ConnectionLimits,
    LimitedHttpProtocol,
    limited_protocol,
)
from worker.settings import Settings

pytestmark = pytest.mark.integration

TINY = b"GET / HTTP/1.1\r\n\r\n"
FLOOD = TINY * 14_000  # 252 kB: what one read of the socket brings in
ATTACKERS = 8
WRITE_TIMEOUT_S = 1.0
#: Bound on the process's RSS growth under ``ATTACKERS`` flooding connections. A connection
#: may hold one read (at most 256 KiB), its pipelined requests and 64 KiB of unsent answers;
#: before the bound each held ~30 MB (14,000 parsed requests waiting for their turn).
RSS_BOUND = ATTACKERS * 2 * 1024 * 1024 + 8 * 1024 * 1024
FLOOD_WINDOW_S = 3.0  # RSS is sampled this long after the floods are written


@contextlib.asynccontextmanager
async def raw_connection(
    url: str, *, source: str = "127.0.0.1", rcvbuf: int | None = None
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client socket from ``source`` (any 127.x address), with a small receive buffer when
    ``rcvbuf`` is given (a client that does not read fills the server's buffers sooner)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, int(port))), 5)
    except BaseException:
        sock.close()
        raise
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def healthz(url: str, *, source: str) -> int:
    async with raw_connection(url, source=source) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return (await read_response(reader)).status


def short_write_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The served front-end's limits with a write deadline of ``WRITE_TIMEOUT_S``."""
    settings_limits = api_server.connection_limits

    def limits(settings: Settings) -> ConnectionLimits:
        return dataclasses.replace(settings_limits(settings), write_timeout_s=WRITE_TIMEOUT_S)

    monkeypatch.setattr(api_server, "connection_limits", limits)


# -- pipelining ------------------------------------------------------------------------------


async def test_a_pipelined_flood_whose_answers_are_never_read_holds_bounded_memory(
    api_settings: ApiSettings,
) -> None:
    """Eight connections each write 14,000 requests at once and never read. The process's
    RSS grows by a bounded amount (main: ~30 MB a connection, 235 MiB here), and another
    client is answered meanwhile."""
    async with running_api(api_settings()) as api, contextlib.AsyncExitStack() as stack:
        baseline = peak = rss_bytes()
        for _ in range(ATTACKERS):
            _, writer = await stack.enter_async_context(raw_connection(api.url, rcvbuf=4096))
            writer.write(FLOOD)
        other = asyncio.create_task(healthz(api.url, source="127.0.0.2"))
        sampling_until = time.monotonic() + FLOOD_WINDOW_S
        while time.monotonic() < sampling_until:
            peak = max(peak, rss_bytes())
            await asyncio.sleep(0.02)
        assert await asyncio.wait_for(other, WAIT_S) == 200
        grown = peak - baseline
        assert grown < RSS_BOUND, f"RSS grew {grown >> 20} MiB under {ATTACKERS} floods"
        # The process serves on.
        assert await healthz(api.url, source="127.0.0.1") == 200


@contextlib.asynccontextmanager
async def held_server(release: asyncio.Event) -> AsyncIterator[uvicorn.Server]:
    """uvicorn on the limited protocol over an app whose every answer waits for ``release``,
    so a pipelining client's connection fills its pipeline and pauses."""

    async def held(_: Request) -> PlainTextResponse:
        await release.wait()
        return PlainTextResponse("ok")

    limits = ConnectionLimits(
        max_head_bytes=16_384,
        max_headers=100,
        head_timeout_s=60.0,
        body_timeout_s=60.0,
        max_connections=16,
        max_connections_per_client=8,
    )
    config = uvicorn.Config(
        Starlette(routes=[Route("/", held)]),
        host="127.0.0.1",
        port=0,
        http=limited_protocol(limits, lambda _: None),
        log_config=None,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + WAIT_S
        while not server.started:
            assert time.monotonic() < deadline and not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        yield server
    finally:
        release.set()
        server.should_exit = True
        await asyncio.wait_for(task, WAIT_S)


def held_input(server: uvicorn.Server) -> list[int]:
    """The unparsed input each open connection holds."""
    return [
        len(c._input) - c._input_at
        for c in server.server_state.connections
        if isinstance(c, LimitedHttpProtocol)
    ]


async def test_a_paused_connection_holds_at_most_one_small_read_unparsed() -> None:
    """Four connections each write 1 MiB of pipelined requests while the first answer waits:
    each reads ``MAX_PIPELINED`` requests ahead, pauses, and holds at most ``READ_BYTES`` of
    input unparsed (main: up to a 256 KiB read each)."""
    release = asyncio.Event()
    async with held_server(release) as server, contextlib.AsyncExitStack() as stack:
        port = server.servers[0].sockets[0].getsockname()[1]
        for _ in range(4):
            _, writer = await stack.enter_async_context(raw_connection(f"http://127.0.0.1:{port}"))
            writer.write(TINY * 60_000)
        deadline = time.monotonic() + WAIT_S
        while sum(1 for held in held_input(server) if held > 0) < 4:
            assert time.monotonic() < deadline, f"no connection paused: {held_input(server)}"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # a read that would come in after the pause
        assert max(held_input(server)) <= READ_BYTES, held_input(server)


async def test_pipelined_requests_with_large_heads_are_read_ahead_within_a_byte_budget() -> None:
    """Pipelined requests of 4 KiB heads while the first answer waits: the connection parses
    at most ``PIPELINED_BYTES`` ahead of the request being answered, not ``MAX_PIPELINED``
    heads of up to 16 KiB each (before: all 16 parsed, ~64 KiB held per connection)."""
    big = b"GET / HTTP/1.1\r\nx-pad: " + b"a" * 4000 + b"\r\n\r\n"
    release = asyncio.Event()
    async with held_server(release) as server, contextlib.AsyncExitStack() as stack:
        port = server.servers[0].sockets[0].getsockname()[1]
        _, writer = await stack.enter_async_context(raw_connection(f"http://127.0.0.1:{port}"))
        writer.write(big * 40)
        deadline = time.monotonic() + WAIT_S
        while not any(held > 0 for held in held_input(server)):
            assert time.monotonic() < deadline, f"the connection never paused: {held_input(server)}"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # a read that would come in after the pause
        [conn] = [c for c in server.server_state.connections if isinstance(c, LimitedHttpProtocol)]
        assert len(conn.pipeline) <= PIPELINED_BYTES // len(big) + 2, len(conn.pipeline)
        assert len(conn.pipeline) < MAX_PIPELINED // 2  # the byte budget, not the count, held it
        assert len(conn._input) - conn._input_at <= READ_BYTES
        release.set()


async def test_refused_connections_drain_at_most_max_lingering_at_once() -> None:
    """An address past its share opening connection after connection: each is answered 503,
    but at most ``MAX_LINGERING`` of them are drained for ``LINGER_S`` at once; the rest are
    closed at once, so refusals hold no sockets beyond a count (before: one per refusal for a
    second, whatever the connect rate)."""
    release = asyncio.Event()
    async with held_server(release) as server, contextlib.AsyncExitStack() as stack:
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        for _ in range(8):  # the address's share, each waiting for its answer
            _, writer = await stack.enter_async_context(raw_connection(url))
            writer.write(TINY)
        policy = cast(Any, server.config.http).http_class.policy
        fds = len(os.listdir("/proc/self/fd"))
        refused = [await stack.enter_async_context(raw_connection(url)) for _ in range(200)]
        answers = [await asyncio.wait_for(reader.read(200), WAIT_S) for reader, _ in refused]
        assert all(a.startswith(b"HTTP/1.1 503") for a in answers), answers[:3]
        assert policy.lingering <= MAX_LINGERING
        # 200 client sockets, and on the server's side at most the lingering ones
        assert len(os.listdir("/proc/self/fd")) - fds <= 200 + MAX_LINGERING + 8
        release.set()


async def test_answers_left_unread_are_cut_off_at_the_write_deadline(
    api_settings: ApiSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipelined requests for the 200 kB document, never read: once the socket's buffers are
    full and the unsent answers pass the transport's high-water mark, the peer has the write
    deadline to read them; then the connection is aborted and counted (main: held for ever,
    with no timer running)."""
    short_write_deadline(monkeypatch)
    async with running_api(api_settings()) as api, contextlib.AsyncExitStack() as stack:
        readers = []
        for _ in range(3):
            reader, writer = await stack.enter_async_context(raw_connection(api.url, rcvbuf=4096))
            writer.write(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 1000)
            readers.append(reader)
        deadline = time.monotonic() + WAIT_S
        while refusals_or_zero(api, "write_timeout") < len(readers):
            assert time.monotonic() < deadline, "unread answers held past the write deadline"
            await asyncio.sleep(0.05)
        for reader in readers:
            assert await closed_by_server(reader)
        assert await healthz(api.url, source="127.0.0.1") == 200


def refusals_or_zero(api: api_server.ApiRuntime, reason: str) -> float:
    value = api.registry.get_sample_value("passkey_api_refusals_total", {"reason": reason})
    return 0.0 if value is None else value


async def test_pipelining_within_the_bound_answers_every_request_in_order(
    api_settings: ApiSettings,
) -> None:
    """A client that pipelines and reads gets every answer, in order, though the server reads
    only ``MAX_PIPELINED`` requests ahead: 200 requests (health checks, unknown paths and
    POSTs with a body, which answer 401 without a key and 400 with one) in one write."""
    kinds = [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 200),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (
            b"POST /v1/accounts/acc_1/auth/passkey-confirm HTTP/1.1\r\nHost: x\r\n"
            b'Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{"a":\r\n}',
            401,
        ),
        (
            b"POST /v1/accounts/acc_1/auth/passkey-confirm HTTP/1.1\r\nHost: x\r\n"
            + f"X-Api-Key: {KEY_A}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 14\r\n\r\n\r\n\r\n[1, 2]\r\n\r\n",
            400,
        ),
    ]
    sequence = [kinds[i % len(kinds)] for i in range(200)]
    assert len(sequence) > 10 * MAX_PIPELINED
    async with running_api(api_settings(api_rate_limit_per_s=0)) as api:
        async with raw_connection(api.url) as (reader, writer):
            writer.write(b"".join(request for request, _ in sequence))
            statuses = [(await read_response(reader)).status for _ in sequence]
            assert statuses == [status for _, status in sequence]
            # And the connection serves on.
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader)).status == 200
        assert refusals_or_zero(api, "write_timeout") == 0


# -- connection slots per client -------------------------------------------------------------


async def hold(
    stack: contextlib.AsyncExitStack, url: str, source: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection from ``source``, answered once and then held open mid-head."""
    reader, writer = await stack.enter_async_context(raw_connection(url, source=source))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await read_response(reader)).status == 200
    writer.write(b"GET /healthz HTTP/1.1\r\n")
    return reader, writer


async def test_one_client_address_cannot_hold_every_connection_slot(
    api_settings: ApiSettings,
) -> None:
    """127.0.0.1 holds its 3 connections; its 4th is refused with 503 and closed (counted as
    ``client_connection_limit``), while 127.0.0.2 is served; a slot 127.0.0.1 frees is its
    again."""
    settings = api_settings(
        api_max_connections=8, api_max_connections_per_client=3, api_head_timeout_s=60.0
    )
    async with running_api(settings) as api, contextlib.AsyncExitStack() as stack:
        held = [await hold(stack, api.url, "127.0.0.1") for _ in range(3)]
        async with raw_connection(api.url, source="127.0.0.1") as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await read_response(reader)
            assert answer.status == 503, answer
            assert answer.headers["retry-after"] == "1"
            assert answer.headers["connection"] == "close"
            assert await closed_by_server(reader)
        assert refusals(api, "client_connection_limit") == 1
        assert refusals(api, "connection_limit") == 0
        # Another client is served, up to its own share.
        for _ in range(3):
            await hold(stack, api.url, "127.0.0.2")
        assert await healthz(api.url, source="127.0.0.3") == 200
        # A slot freed is a slot served.
        held[0][1].close()
        deadline = time.monotonic() + WAIT_S
        while await healthz_or_refused(api.url, "127.0.0.1") != 200:
            assert time.monotonic() < deadline, "the closed connection's slot never came back"
            await asyncio.sleep(0.05)


async def test_addresses_at_their_share_leave_the_last_slots_to_new_addresses(
    api_settings: ApiSettings,
) -> None:
    """8 connections, 3 per address, a quarter kept for addresses holding none: 127.0.0.1 and
    .2 hold 3 each, .3 holds 1 and its 2nd is refused (``client_connection_limit``) though a
    slot is free, so .4 is still served (main: .3 took the last slots and .4 was refused)."""
    settings = api_settings(
        api_max_connections=8, api_max_connections_per_client=3, api_head_timeout_s=60.0
    )
    async with running_api(settings) as api, contextlib.AsyncExitStack() as stack:
        for source in ("127.0.0.1", "127.0.0.2"):
            for _ in range(3):
                await hold(stack, api.url, source)
        await hold(stack, api.url, "127.0.0.3")
        async with raw_connection(api.url, source="127.0.0.3") as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await read_response(reader)
            assert answer.status == 503, answer
            assert answer.headers["retry-after"] == "1"
        assert refusals(api, "client_connection_limit") == 1
        await hold(stack, api.url, "127.0.0.4")
        assert refusals_or_zero(api, "connection_limit") == 0


async def healthz_or_refused(url: str, source: str) -> int:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        return await healthz(url, source=source)
    return 0


async def test_the_per_client_bound_can_be_turned_off(api_settings: ApiSettings) -> None:
    """``0`` turns the bound off (all clients behind one proxy share its address)."""
    settings = api_settings(
        api_max_connections=8, api_max_connections_per_client=0, api_head_timeout_s=60.0
    )
    async with running_api(settings) as api, contextlib.AsyncExitStack() as stack:
        for _ in range(6):
            await hold(stack, api.url, "127.0.0.1")
        assert await healthz(api.url, source="127.0.0.1") == 200
        assert refusals_or_zero(api, "client_connection_limit") == 0


def test_the_default_bound_is_a_fraction_of_the_process_limit() -> None:
    defaults = Settings.model_fields
    per_client = defaults["api_max_connections_per_client"].default
    assert 0 < per_client * 5 <= defaults["api_max_connections"].default
