"""``python -m bench.http_clients`` in a tiny configuration: every contender completes every
call with a valid answer, over plain TCP, TLS and mTLS, sized and chunked (behaviour, no
timings); and the minimal httptools client (bench/http_mini.py) against a hostile receiver."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from bench.http_clients import CONTENDERS, MODES, parse, run
from bench.http_curl import load_pycurl
from bench.http_mini import HttpFailure, MiniClient


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
def test_every_contender_completes_every_call(chunked: bool) -> None:
    argv = ["--rounds", "1", "--calls", "60", "--calls-50", "120", "--in-flight", "1,5"]
    rows = run(parse(argv + (["--chunked"] if chunked else [])))
    expected = {c for c in CONTENDERS if c != "pycurl" or load_pycurl() is not None}
    assert {r["contender"] for r in rows} == expected
    assert {(r["mode"], r["in_flight"]) for r in rows} == {(m, n) for m in MODES for n in (1, 5)}
    for row in rows:
        calls = 60 if row["in_flight"] == 1 else 120
        assert (row["calls"], row["valid"], row["error"]) == (calls, calls, ""), row
        assert row["cpu_us"] > 0 and row["rate"] > 0


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _answer(handler: Handler, **limits: float) -> tuple[int, bytes]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = MiniClient(body_cap=64, **limits)  # type: ignore[arg-type]
    try:
        return await client.post(f"http://127.0.0.1:{port}/hook", b"{}", {"X-A": "1"})
    finally:
        await client.aclose()
        server.close()


def _replying(raw: bytes, *, hold_s: float = 0.0) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(raw)
        await writer.drain()
        await asyncio.sleep(hold_s)
        writer.close()

    return handler


async def test_mini_reads_chunked_and_close_delimited_bodies() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"
    assert await _answer(_replying(chunked)) == (200, b"abc")
    until_close = b"HTTP/1.1 201 Created\r\nConnection: close\r\n\r\nxyz"
    assert await _answer(_replying(until_close)) == (201, b"xyz")


@pytest.mark.parametrize(
    ("raw", "phase"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100, "cap"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffff\r\n" + b"x" * 80, "cap"),
        (b"NOT HTTP AT ALL\r\n\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", "lost"),
    ],
    ids=["sized-over-cap", "chunked-over-cap", "garbage", "cut-short"],
)
async def test_mini_refuses_what_a_hostile_receiver_sends(raw: bytes, phase: str) -> None:
    with pytest.raises(HttpFailure) as failed:
        await _answer(_replying(raw))
    assert failed.value.phase == phase


async def test_mini_bounds_each_phase() -> None:
    silent = _replying(b"", hold_s=5.0)
    with pytest.raises(HttpFailure) as failed:
        await _answer(silent, headers_timeout_s=0.2)
    assert failed.value.phase == "headers"
    trickle = _replying(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab", hold_s=5.0)
    with pytest.raises(HttpFailure) as failed:
        await _answer(trickle, body_timeout_s=0.2)
    assert failed.value.phase == "body"


async def test_mini_refuses_header_injection() -> None:
    client = MiniClient()
    with pytest.raises(ValueError, match="CR, LF"):
        await client.post("http://127.0.0.1:9/hook", b"", {"X-A": "1\r\nX-Injected: 1"})
    await client.aclose()
