"""What many client addresses without an API key make the front-end hold (docs/architecture.md,
"Resource bounds": a connection's unparsed input): 400 connections from ten loopback
addresses, each writing a large pipelined burst at once and never reading an answer. The
process's RSS is sampled while it reads them; the growth is bounded by the connections, not by
the bursts (on the code before the 16 KiB read bound each connection held up to one 256 KiB
read).

The clients write with non-blocking ``send`` once: what the kernel does not take is dropped,
never buffered in this process, so the RSS measured is the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import running_api
from tests.api.test_front_door import rss_bytes

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ADDRESSES = [f"127.0.0.{i}" for i in range(1, 11)]
CONNECTIONS = 400
BURST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 40_000  # ~1 MiB of tiny requests
RSS_BOUND = 48 * 1024 * 1024
WINDOW_S = 8.0  # RSS is sampled this long after the bursts are written


async def _open(port: int, source: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # answers pile up server-side
    sock.bind((source, 0))
    sock.setblocking(False)
    try:
        await asyncio.wait_for(
            asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port)), 5
        )
    except BaseException:
        sock.close()
        raise
    return sock


async def test_400_unread_pipelining_connections_from_10_addresses_hold_bounded_memory(
    api_settings: ApiSettings,
) -> None:
    async with running_api(api_settings()) as api:
        port = int(api.url.rsplit(":", 1)[1])
        socks: list[socket.socket] = []
        try:
            baseline = peak = rss_bytes()
            for i in range(CONNECTIONS):
                socks.append(await _open(port, ADDRESSES[i % len(ADDRESSES)]))
            for sock in socks:
                with contextlib.suppress(BlockingIOError):
                    sock.send(BURST)
            until = time.monotonic() + WINDOW_S
            while time.monotonic() < until:
                peak = max(peak, rss_bytes())
                await asyncio.sleep(0.05)
        finally:
            for sock in socks:
                sock.close()
        grown = peak - baseline
        print(f"RSS grew {grown / 2**20:.1f} MiB under {CONNECTIONS} unread bursts")
        assert grown <= RSS_BOUND, f"RSS grew {grown >> 20} MiB under {CONNECTIONS} bursts"
