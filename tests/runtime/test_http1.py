"""The outbound HTTP/1.1 client against raw loopback servers that break the protocol on
purpose: keep-alive connections closed under it, conflicting framing, oversized heads,
dripped bodies, statuses out of range, informational answers, a pool under pressure, and
requests a caller could smuggle something through."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from worker.runtime.http1 import (
    HEAD_CAP,
    Http1Client,
    HttpTimeout,
    InvalidRequest,
    PeerClosed,
    PoolTimeout,
    ProtocolError,
    wire,
)

Reply = Callable[[int, bytes, asyncio.StreamWriter], Awaitable[bool]]
"""(request number on its connection, request head, writer) → keep the connection open?"""


@dataclass
class Server:
    url: str
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0


@contextlib.asynccontextmanager
async def serving(reply: Reply) -> AsyncIterator[Server]:
    """A server reading requests (head and sized body) one after another on each connection
    and answering each with ``reply``; it counts connections and requests."""
    server = Server(url="")
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        server.connections += 1
        server.open_now += 1
        server.most_open = max(server.most_open, server.open_now)
        try:
            number = 0
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                server.requests.append(head)
                if not await reply(number, head, writer):
                    break
                number += 1
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            server.open_now -= 1
            writer.close()
            tasks.discard(task)

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/x"
    try:
        yield server
    finally:
        listener.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def always(raw: bytes, *, keep: bool = True, hold_s: float = 0.0) -> Reply:
    async def reply(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        if hold_s:
            await asyncio.sleep(hold_s)
        writer.write(raw)
        await writer.drain()
        return keep

    return reply


async def call(url: str, method: str = "GET", **options: float) -> tuple[int, bytes]:
    async with Http1Client(**options) as client:  # type: ignore[arg-type]
        answer = await client.request(method, url)
        return answer.status, answer.body


# -- keep-alive ----------------------------------------------------------------------------------


async def test_a_keep_alive_connection_is_reused() -> None:
    async with serving(always(OK)) as server, Http1Client() as client:
        for _ in range(5):
            assert (await client.request("POST", server.url, body=b"{}")).status == 200
        assert (server.connections, len(server.requests)) == (1, 5)
        assert client.open_connections == 1


async def test_an_idle_connection_the_server_closed_is_not_used() -> None:
    """The server answers, then closes the idle connection: the next call of any method
    sees it closed and dials anew, with nothing failed and nothing sent twice."""

    async def answer_then_close(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK)
        await writer.drain()
        return False  # close right after the answer, as a server's idle timer does

    async with serving(answer_then_close) as server, Http1Client() as client:
        for method in ("GET", "POST", "GET", "POST"):
            assert (await client.request(method, server.url)).status == 200
            await asyncio.sleep(0.05)  # the close arrives while the connection is idle
        assert (server.connections, len(server.requests)) == (4, 4)


def close_the_second_request_unanswered() -> Reply:
    """Answers the first request on a connection keep-alive; closes on the second without
    a byte, as when an idle connection is closed the moment a request is written on it."""

    async def reply(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 0:
            writer.write(OK)
            await writer.drain()
            return True
        return False

    return reply


async def test_a_get_on_a_reused_connection_closed_unanswered_is_sent_again_once() -> None:
    async with serving(close_the_second_request_unanswered()) as server, Http1Client() as client:
        assert (await client.request("GET", server.url)).status == 200
        assert (await client.request("GET", server.url)).status == 200
        # the second GET: written on the reused connection (closed unanswered), then once
        # on a new one
        assert (server.connections, len(server.requests)) == (2, 3)


async def test_a_post_on_a_reused_connection_closed_unanswered_is_not_sent_again() -> None:
    async with serving(close_the_second_request_unanswered()) as server, Http1Client() as client:
        assert (await client.request("POST", server.url, body=b"1")).status == 200
        with pytest.raises(PeerClosed) as caught:
            await client.request("POST", server.url, body=b"2")
        assert caught.value.before_answer
        assert (server.connections, len(server.requests)) == (1, 2)


async def test_a_get_on_a_new_connection_closed_unanswered_is_not_retried() -> None:
    async with serving(always(b"", keep=False)) as server, Http1Client() as client:
        with pytest.raises(PeerClosed):
            await client.request("GET", server.url)
        assert len(server.requests) == 1


async def test_bytes_after_the_answer_make_the_connection_unusable() -> None:
    async with serving(always(OK + b"HTTP/1.1 200 OK\r\n")) as server, Http1Client() as client:
        assert (await client.request("GET", server.url)).body == b"ok"
        assert (await client.request("GET", server.url)).body == b"ok"
        assert server.connections == 2


async def test_connection_close_is_honoured() -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with serving(always(closing)) as server, Http1Client() as client:
        for _ in range(3):
            assert (await client.request("GET", server.url)).status == 200
        assert server.connections == 3


# -- framing and the head ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            "malformed_head",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "malformed_head"),
        (b"HTTP/1.1 099 Low\r\nContent-Length: 0\r\n\r\n", "status_out_of_range"),
        (b"HTTP/1.1 600 High\r\nContent-Length: 0\r\n\r\n", "status_out_of_range"),
        (b"HTTP/1.1 000 Zero\r\nContent-Length: 0\r\n\r\n", "status_out_of_range"),
        (b"HTTP/1.1 101 Switching\r\nUpgrade: websocket\r\n\r\n", "unexpected_upgrade"),
        (b"RTSP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", "not_http"),
        (b"ICE/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", "not_http"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n", "malformed_head"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 0\r\n\r\n", "malformed_head"),
    ],
    ids=[
        "length-and-chunked",
        "two-lengths",
        "status-99",
        "status-600",
        "status-0",
        "upgrade",
        "rtsp",
        "ice",
        "nul-in-value",
        "bare-cr-in-value",
    ],
)
async def test_a_malformed_answer_is_a_protocol_error(raw: bytes, reason: str) -> None:
    async with serving(always(raw, keep=False)) as server:
        with pytest.raises(ProtocolError) as caught:
            await call(server.url)
        assert caught.value.reason == reason


async def test_a_head_past_the_cap_is_refused_and_one_within_it_read() -> None:
    line = b"X-Pad: " + b"p" * 1000 + b"\r\n"
    within = (
        b"HTTP/1.1 200 OK\r\n" + line * (HEAD_CAP // len(line) - 1) + b"Content-Length: 0\r\n\r\n"
    )
    beyond = b"HTTP/1.1 200 OK\r\n" + line * (HEAD_CAP // len(line) + 1) + b"\r\n"
    async with serving(always(within, keep=False)) as server:
        assert await call(server.url) == (200, b"")
    async with serving(always(beyond, keep=False)) as server:
        with pytest.raises(ProtocolError) as caught:
            await call(server.url)
        assert caught.value.reason == "head_too_large"


async def test_an_endless_header_line_is_refused_at_the_cap() -> None:
    sent: list[int] = []

    async def endless(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        total = 0
        try:
            while total < 64 * 1024 * 1024:
                writer.write(b"a" * 65536)
                await writer.drain()
                total += 65536
        finally:
            sent.append(total)
        return False

    async with serving(endless) as server:
        with pytest.raises(ProtocolError) as caught:
            await call(server.url)
        assert caught.value.reason == "head_too_large"
        for _ in range(100):
            if sent:
                break
            await asyncio.sleep(0.02)
    assert sent and sent[0] < 64 * 1024 * 1024


async def test_informational_answers_are_skipped() -> None:
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nX-Final: yes\r\nContent-Length: 4\r\n\r\ndone"
    )
    async with serving(always(raw)) as server, Http1Client() as client:
        answer = await client.request("POST", server.url, body=b"{}")
        assert (answer.status, answer.body) == (201, b"done")
        assert answer.headers["x-final"] == "yes" and "Link" not in answer.headers
        assert (await client.request("POST", server.url)).status == 201  # still in step
        assert server.connections == 1


async def test_chunked_sized_and_close_delimited_bodies() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"
    async with serving(always(chunked)) as server:
        assert await call(server.url) == (200, b"abc")
    async with serving(always(b"HTTP/1.0 200 OK\r\n\r\nuntil-close", keep=False)) as server:
        assert await call(server.url) == (200, b"until-close")
    async with serving(always(b"HTTP/1.1 204 No Content\r\n\r\n")) as server:
        assert await call(server.url) == (204, b"")


async def test_a_body_cut_short_is_a_lost_connection() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"
    async with serving(always(raw, keep=False)) as server:
        with pytest.raises(PeerClosed) as caught:
            await call(server.url)
        assert not caught.value.before_answer


@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
async def test_the_body_cap_keeps_the_first_bytes_and_drops_the_connection(chunked: bool) -> None:
    body = b"x" * 100
    if chunked:
        raw = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n" + body + b"\r\n0\r\n\r\n"
        )
    else:
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + body
    async with serving(always(raw)) as server, Http1Client(body_cap=64) as client:
        capped = await client.request("GET", server.url)
        assert (capped.body, capped.truncated) == (b"x" * 64, True)
        exact = await client.request("GET", server.url, body_cap=100)
        assert (exact.body, exact.truncated) == (body, False)
        assert server.connections == 2  # the capped answer's connection was dropped


# -- time-outs -----------------------------------------------------------------------------------


async def test_a_dripped_body_ends_at_the_body_time_out() -> None:
    """Slowloris: a byte every 50 ms keeps the connection busy, never the call."""
    dripped: list[int] = []

    async def drip(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(200):
            writer.write(b"z")
            await writer.drain()
            dripped.append(1)
            await asyncio.sleep(0.05)
        return False

    async with serving(drip) as server:
        started = asyncio.get_running_loop().time()
        with pytest.raises(HttpTimeout) as caught:
            await call(server.url, body_s=0.3)
        assert caught.value.phase == "body"
        # Well before the drip's 10 s end, with room for a loaded machine.
        assert asyncio.get_running_loop().time() - started < 5.0
    assert 2 <= len(dripped) < 200


async def test_a_dripped_head_ends_at_the_headers_time_out() -> None:
    async def drip(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        for byte in b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 50:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.02)
        return False

    async with serving(drip) as server:
        with pytest.raises(HttpTimeout) as caught:
            await call(server.url, headers_s=0.3)
        assert caught.value.phase == "headers"


async def test_a_calls_time_out_running_out_in_the_body_is_told_as_the_body_phase() -> None:
    """The call's time-out comes before each phase's own: the exchange keeps the one timer it
    armed for the head (``Connection._arm``), which still names the phase it ran out in."""

    async def drip(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(200):
            writer.write(b"z")
            await writer.drain()
            await asyncio.sleep(0.05)
        return False

    async with serving(drip) as server, Http1Client() as client:
        with pytest.raises(HttpTimeout) as caught:
            await client.request("GET", server.url, timeout_s=0.3)
        assert caught.value.phase == "body"


async def test_a_calls_time_out_bounds_every_phase() -> None:
    async with serving(always(OK, hold_s=5.0)) as server, Http1Client() as client:
        started = asyncio.get_running_loop().time()
        with pytest.raises(HttpTimeout):
            await client.request("GET", server.url, timeout_s=0.2)
        # Before the 5 s answer, with room for a loaded machine.
        assert asyncio.get_running_loop().time() - started < 4.0


# -- the pool ------------------------------------------------------------------------------------


async def test_connections_per_host_are_bounded_and_callers_wait() -> None:
    async with (
        serving(always(OK, hold_s=0.05)) as server,
        Http1Client(max_connections=10, max_per_host=2) as client,
    ):
        answers = await asyncio.gather(*(client.request("GET", server.url) for _ in range(12)))
        assert {a.status for a in answers} == {200}
        assert server.most_open <= 2 and server.connections == 2
        assert client.open_connections == 2


async def test_connections_in_all_are_bounded_across_origins() -> None:
    async with (
        serving(always(OK, hold_s=0.02)) as one,
        serving(always(OK, hold_s=0.02)) as two,
        Http1Client(max_connections=2) as client,
    ):
        calls = [client.request("GET", url) for url in (one.url, two.url) * 6]
        assert {a.status for a in await asyncio.gather(*calls)} == {200}
        assert one.most_open + two.most_open <= 3  # one may be closing as the other opens
        assert client.open_connections <= 2


async def test_idle_connections_past_their_time_are_closed_not_reused() -> None:
    async with (
        serving(always(OK)) as one,
        serving(always(OK)) as two,
        Http1Client(idle_s=0.1) as client,
    ):
        await client.request("GET", one.url)
        await asyncio.sleep(0.15)
        await client.request("GET", two.url)  # a new connection: the sweep closes one's
        await asyncio.sleep(0.05)
        assert (one.open_now, client.open_connections) == (0, 1)
        await asyncio.sleep(0.15)
        await client.request("GET", two.url)  # too old to reuse: dialled anew
        assert two.connections == 2


async def test_a_caller_waits_for_a_connection_no_longer_than_its_connect_time_out() -> None:
    async with (
        serving(always(OK, hold_s=1.0)) as server,
        Http1Client(max_connections=1, connect_s=0.2) as client,
    ):
        busy = asyncio.create_task(client.request("GET", server.url))
        await asyncio.sleep(0.05)
        with pytest.raises(HttpTimeout) as caught:
            await client.request("GET", server.url)
        assert caught.value.phase == "connect"
        assert (await busy).status == 200
        assert client.open_connections == 1


async def test_a_wait_for_the_pool_is_told_from_a_time_out_of_the_peer() -> None:
    """A caller whose time-out runs out while it waits for a place in the pool gets a
    ``PoolTimeout`` (nothing was dialled: the wait was the client's own); one whose lookup
    or dial outlasts it gets a plain connect ``HttpTimeout``. Both are connect time-outs to
    callers that do not tell them apart. Before, both were the same ``HttpTimeout``."""

    async def never(host: str, port: int) -> list[str]:
        await asyncio.sleep(10)
        return []

    async with (
        serving(always(OK, hold_s=1.0)) as server,
        Http1Client(max_connections=4, max_per_host=1) as client,
        Http1Client(connect_s=0.2, resolve=never) as stuck,
    ):
        busy = asyncio.create_task(client.request("GET", server.url))
        await asyncio.sleep(0.05)
        with pytest.raises(PoolTimeout) as waited:
            await client.request("GET", server.url, timeout_s=0.2)
        assert (waited.value.phase, waited.value.reason) == ("connect", "pool_wait_timed_out")
        assert isinstance(waited.value, HttpTimeout)
        with pytest.raises(HttpTimeout) as dialled:
            await stuck.request("GET", "http://name.test/")
        assert not isinstance(dialled.value, PoolTimeout)
        assert dialled.value.reason == "connect_timed_out"
        assert (await busy).status == 200
        assert (client.open_connections, stuck.open_connections) == (1, 0)


async def test_a_cancelled_call_gives_its_connection_back() -> None:
    async with (
        serving(always(OK, hold_s=0.3)) as server,
        Http1Client(max_connections=1) as client,
    ):
        slow = asyncio.create_task(client.request("GET", server.url))
        await asyncio.sleep(0.05)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert client.open_connections == 0
        assert (await client.request("GET", server.url)).status == 200


# -- what a caller passes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"X-A": "1\r\nX-Injected: 1"},
        {"X-A": "1\nX-Injected: 1"},
        {"X-A": "1\x00"},
        {"X-A\r\nX-B": "1"},
        {"X A": "1"},
        {"Content-Length": "5"},
        {"Transfer-Encoding": "chunked"},
        {"Host": "elsewhere.test"},
    ],
)
async def test_a_header_that_could_smuggle_is_refused_before_sending(
    headers: dict[str, str],
) -> None:
    async with serving(always(OK)) as server, Http1Client() as client:
        with pytest.raises(InvalidRequest):
            await client.request("POST", server.url, headers=headers)
        assert server.requests == []


@pytest.mark.parametrize(
    "url",
    ["ftp://127.0.0.1/x", "http://[::1/x", "http://user:pw@127.0.0.1/x", "http:///x", "x"],
)
async def test_a_url_the_client_does_not_speak_is_refused(url: str) -> None:
    async with Http1Client() as client:
        with pytest.raises(InvalidRequest):
            await client.request("GET", url)


async def test_the_request_on_the_wire() -> None:
    async with (
        serving(always(OK)) as server,
        Http1Client(headers={"User-Agent": "ua/1", "Accept": "*/*"}) as client,
    ):
        await client.request("POST", server.url + "?a=1&b=%20", headers={"accept": "x/y"})
        await client.request("GET", server.url.replace("/x", "/p q/ü"))
    post, get = (head.decode("latin-1").split("\r\n") for head in server.requests)
    port = server.url.split(":")[2].split("/")[0]
    assert post[:2] == ["POST /x?a=1&b=%20 HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    assert "User-Agent: ua/1" in post and "accept: x/y" in post and "Accept: */*" not in post
    assert "Content-Length: 0" in post
    assert get[0] == "GET /p%20q/%C3%BC HTTP/1.1"
    assert not any(line.lower().startswith("content-length") for line in get)


async def test_the_header_names_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "_NAMES", {})
    monkeypatch.setattr(wire, "_NAMES_KEPT", 2)
    headers = {f"X-H{n}": str(n) for n in range(5)}
    async with serving(always(OK)) as server, Http1Client() as client:
        await client.request("GET", server.url, headers=headers)
        await client.request("GET", server.url, headers=headers)
    assert len(wire._NAMES) == 2
    for head in server.requests:
        assert all(f"X-H{n}: {n}\r\n".encode() in head for n in range(5))


def _parsed_by_urlsplit(url: str) -> object:
    """``parse_url`` without its remembered origins: what ``urlsplit`` and ``target`` make."""
    try:
        return wire._parse_url(url)
    except InvalidRequest as exc:
        return ("refused", exc.reason)


@pytest.mark.parametrize(
    "url",
    [
        "http://p.test/v1/accounts/ref_1/confirm",
        "HTTPS://P.test:8443/a?b=1&c=%20",
        "http://p.test:80/a??b",
        "http://p.test/a?",
        "http://p.test/a#frag",
        "http://p.test/a b",
        "http://p.test/\u00e9t\u00e9",
        "http://p.test/a\tb",
        "http://b\u00fccher.test/x",
        "http://[::1]:8080/x",
        "http://[::1/x",
        "http://p.test:99999/x",
        "http://user:pw@p.test/x",
        "ftp://p.test/x",
        "http:///x",
        " http://p.test/x",
        "a/b://p.test/x",
        "http:/x://p.test/y",
    ],
)
def test_a_url_s_remembered_origin_parses_it_as_urlsplit_does(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "_ORIGINS", {})
    for _ in range(2):  # the second finds its origin remembered
        try:
            parsed: object = wire.parse_url(url)
        except InvalidRequest as exc:
            parsed = ("refused", exc.reason)
        assert parsed == _parsed_by_urlsplit(url)


def test_the_origins_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "_ORIGINS", {})
    monkeypatch.setattr(wire, "_ORIGINS_KEPT", 2)
    for _ in range(2):
        for n in range(5):
            assert wire.parse_url(f"http://h{n}.test:81/x/{n}").origin.host == f"h{n}.test"
    assert len(wire._ORIGINS) == 2


async def test_a_closed_client_refuses_requests() -> None:
    client = Http1Client()
    await client.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await client.request("GET", "http://127.0.0.1:9/x")
