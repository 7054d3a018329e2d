"""The front door protects itself: raw sockets on 127.0.0.1 against a real served front-end.

What a hostile client does, each with tiny limits set for the test: a 64 MiB header, a head
with too many fields, a head or a body sent a byte at a time, more connections than allowed,
more requests than the workspace's rate; and ``/metrics`` is not on the public port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_A, KEY_B, responder, running_api
from worker.api.server import ApiRuntime

pytestmark = pytest.mark.integration

WAIT_S = 10.0  # the longest any answer below may take to arrive; far above every limit
CONFIRM = "/v1/accounts/acc_1/auth/passkey-confirm"


@dataclass
class Raw:
    """One HTTP/1.1 response as read off the socket."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def read_response(reader: asyncio.StreamReader) -> Raw:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), WAIT_S)
    return Raw(int(status_line.split(" ")[1]), headers, body)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server ends the connection (EOF or reset) within ``WAIT_S``; what it
    still sends before that is read and dropped."""
    try:
        async with asyncio.timeout(WAIT_S):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def rest_until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sends until it ends the connection (EOF or reset), within ``WAIT_S``."""
    rest = b""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(WAIT_S):
            while chunk := await reader.read(65536):
                rest += chunk
    return rest


@contextlib.asynccontextmanager
async def connection(url: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def refusals(api: ApiRuntime, reason: str) -> float:
    value = api.registry.get_sample_value("passkey_api_refusals_total", {"reason": reason})
    assert value is not None
    return value


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def drip(writer: asyncio.StreamWriter, count: int, every_s: float) -> int:
    """Send one byte every ``every_s``, ``count`` times at most; how many went out."""
    sent = 0
    with contextlib.suppress(ConnectionError):
        for _ in range(count):
            writer.write(b"a")
            await writer.drain()
            sent += 1
            await asyncio.sleep(every_s)
    return sent


# -- the request head ------------------------------------------------------------------------


async def test_a_64_mib_header_is_refused_at_the_limit_without_reading_it(
    api_settings: ApiSettings,
) -> None:
    """431 as soon as the head passes API_MAX_HEADER_BYTES; the process does not hold the
    64 MiB (main kept accumulating it: +100 MiB RSS)."""
    total, chunk = 64 * 1024 * 1024, b"a" * 65536
    async with running_api(api_settings(api_max_header_bytes=16_384)) as api:
        async with connection(api.url) as (reader, writer):
            baseline = peak = rss_bytes()
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")

            async def flood() -> int:
                sent = 0
                with contextlib.suppress(ConnectionError):
                    while sent < total:
                        writer.write(chunk)
                        await writer.drain()
                        sent += len(chunk)
                        nonlocal peak
                        peak = max(peak, rss_bytes())
                return sent

            flooding = asyncio.create_task(flood())
            try:
                answer = await read_response(reader)
            finally:
                flooding.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flooding
            assert answer.status == 431, answer
            assert answer.headers["connection"] == "close"
            assert await closed_by_server(reader)
        assert peak - baseline < 16 * 1024 * 1024, f"RSS grew {(peak - baseline) >> 20} MiB"
        assert refusals(api, "header_too_large") == 1
        # The process serves on.
        async with httpx.AsyncClient(base_url=api.url) as http:
            assert (await http.get("/healthz")).status_code == 200


async def test_too_many_header_fields_are_refused(
    api_settings: ApiSettings, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_api(api_settings(api_max_headers=20)) as api:
        # 1,000 fields of 10 bytes fit in the head's 16 KiB: refused by count, not size.
        for fields, status in ((20, 200), (21, 431), (1_000, 431)):
            extra = "".join(f"X-F{i}: v\r\n" for i in range(fields - 1))
            async with connection(api.url) as (reader, writer):
                writer.write(f"GET /healthz HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
                answer = await read_response(reader)
                assert answer.status == status, (fields, answer)
                if status == 431:
                    # The refusal is the connection's one answer (no 400 for the stopped parse).
                    assert await rest_until_closed(reader) == b""
        assert refusals(api, "too_many_headers") == 2
    # Nor did the stopped parse fail the connection (a write after the refusal's write_eof).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_head_within_the_limit_and_a_body_larger_than_it_pass(
    api_settings: ApiSettings,
) -> None:
    """The head budget counts the head only: a 12 KiB header passes a 16 KiB limit, and a
    70 KiB body sent in one write with its head is read by the app (which answers 400 for
    a body over 64 KiB), after which the connection serves the next request."""
    async with running_api(api_settings(api_max_header_bytes=16_384)) as api:
        async with connection(api.url) as (reader, writer):
            writer.write(
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 12_288 + b"\r\n\r\n"
            )
            assert (await read_response(reader)).status == 200
            body = b'{"pad": "' + b"a" * 70_000 + b'"}'
            writer.write(
                f"POST {CONFIRM} HTTP/1.1\r\nHost: x\r\nX-Api-Key: {KEY_A}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            answer = await read_response(reader)
            assert answer.status == 400, answer
            assert answer.json()["error"]["code"] == "invalid_request"
            assert "65536 bytes" in answer.json()["error"]["message"]
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader)).status == 200
        assert refusals(api, "header_too_large") == 0


async def test_a_head_sent_a_byte_at_a_time_is_cut_off(api_settings: ApiSettings) -> None:
    """408 and closed after API_HEAD_TIMEOUT_S, however steadily the bytes come; a connection
    that sends nothing at all is closed the same way."""
    async with running_api(api_settings(api_head_timeout_s=0.5)) as api:
        async with connection(api.url) as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.1\r\nX-Drip: ")
            dripping = asyncio.create_task(drip(writer, count=200, every_s=0.05))
            answer = await read_response(reader)
            assert answer.status == 408, answer
            assert await closed_by_server(reader)
            sent = await dripping
            assert sent < 200, "the server let the head drip on to the end"
        async with connection(api.url) as (reader, _):
            answer = await read_response(reader)
            assert answer.status == 408
            assert await closed_by_server(reader)
        assert refusals(api, "head_timeout") == 2


# -- the request body ------------------------------------------------------------------------


async def test_a_body_sent_a_byte_at_a_time_answers_408_in_the_envelope(
    api_settings: ApiSettings,
) -> None:
    async with running_api(api_settings(api_body_timeout_s=0.5)) as api:
        async with connection(api.url) as (reader, writer):
            writer.write(
                f"POST {CONFIRM} HTTP/1.1\r\nHost: x\r\nX-Api-Key: {KEY_A}\r\n"
                "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n".encode()
            )
            dripping = asyncio.create_task(drip(writer, count=200, every_s=0.05))
            answer = await read_response(reader)
            assert answer.status == 408, answer
            body = answer.json()
            assert set(body) == {"request_id", "error"}
            assert (body["error"]["code"], body["error"]["numeric_code"]) == (
                "request_timeout",
                90001,
            )
            assert answer.headers["x-request-id"] == body["request_id"]
            assert answer.headers["connection"] == "close"
            assert await closed_by_server(reader)
            assert await dripping < 200, "the server let the body drip on to the end"
        assert refusals(api, "body_timeout") == 1


async def test_a_body_the_app_does_not_read_cannot_hold_the_connection(
    api_settings: ApiSettings,
) -> None:
    """The app answers a GET without reading its body; the body's deadline still closes the
    connection its drip would keep open."""
    async with running_api(api_settings(api_body_timeout_s=0.5)) as api:
        async with connection(api.url) as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n")
            dripping = asyncio.create_task(drip(writer, count=200, every_s=0.05))
            assert (await read_response(reader)).status == 200
            assert await closed_by_server(reader)
            assert await dripping < 200, "the server let the body drip on to the end"
        assert refusals(api, "body_timeout") == 1


# -- connections -----------------------------------------------------------------------------


async def test_connections_over_the_limit_are_refused_with_503(api_settings: ApiSettings) -> None:
    settings = api_settings(api_max_connections=3, api_head_timeout_s=60.0)
    async with running_api(settings) as api, contextlib.AsyncExitStack() as stack:
        held = []
        for _ in range(3):
            reader, writer = await stack.enter_async_context(connection(api.url))
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader)).status == 200  # admitted: counted
            writer.write(b"GET /healthz HTTP/1.1\r\n")  # and held open, mid-head
            held.append(writer)
        async with connection(api.url) as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await read_response(reader)
            assert answer.status == 503, answer
            assert answer.headers["retry-after"] == "1"
            assert await closed_by_server(reader)
        assert refusals(api, "connection_limit") == 1
        # A slot freed is a slot served.
        held[0].close()
        deadline = time.monotonic() + WAIT_S
        while True:
            async with connection(api.url) as (reader, writer):
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                if (await read_response(reader)).status == 200:
                    break
            assert time.monotonic() < deadline, "the closed connection's slot never came back"
            await asyncio.sleep(0.05)


# -- the per-workspace rate limit ------------------------------------------------------------


async def test_the_token_bucket_answers_429_per_workspace(api_settings: ApiSettings) -> None:
    """After the burst, the workspace gets 429 rate_limited with Retry-After and the envelope,
    on every route with a key; another workspace, and requests without a valid key, are not
    affected."""
    settings = api_settings(api_rate_limit_per_s=0.1, api_rate_limit_burst=3)
    async with (
        responder(settings),  # a worker without accounts: every query answers 404
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        key_a = {"X-Api-Key": KEY_A}
        for _ in range(3):
            assert (await http.get("/v1/accounts/acc_x/auth", headers=key_a)).status_code == 404
        for path in ("/v1/accounts/acc_x/auth", "/v1/webhook-endpoints"):
            resp = await http.get(path, headers=key_a)
            assert resp.status_code == 429, resp.text
            body = resp.json()
            assert set(body) == {"request_id", "error"}
            assert (body["error"]["code"], body["error"]["numeric_code"]) == ("rate_limited", 90002)
            assert resp.headers["x-request-id"] == body["request_id"]
            assert 1 <= int(resp.headers["retry-after"]) <= 10
        other = await http.get("/v1/accounts/acc_x/auth", headers={"X-Api-Key": KEY_B})
        assert other.status_code == 404
        assert (await http.get("/v1/accounts/acc_x/auth")).status_code == 401
        assert refusals(api, "rate_limited") == 2
        # By reason only: the workspace is never a label.
        scrape = (await http.get(f"{api.metrics_url}/metrics")).text
        assert "ws_a" not in scrape


# -- the side door ---------------------------------------------------------------------------


async def test_metrics_are_served_on_the_side_door_only(api_settings: ApiSettings) -> None:
    async with running_api(api_settings()) as api, httpx.AsyncClient() as http:
        assert api.metrics_url is not None and api.metrics_url != api.url
        public = await http.get(f"{api.url}/metrics")
        assert public.status_code == 404
        assert public.json()["error"]["code"] == "not_found"
        side = await http.get(f"{api.metrics_url}/metrics")
        assert side.status_code == 200
        assert "passkey_api_requests_total" in side.text
        assert 'passkey_api_refusals_total{reason="rate_limited"} 0.0' in side.text
        for base in (api.url, api.metrics_url):
            assert (await http.get(f"{base}/healthz")).status_code == 200
            assert (await http.get(f"{base}/readyz")).status_code == 200
