"""The webhook sender against a real receiver on loopback, and the vetting resolver with an
injected DNS lookup (rebinding, mixed answers) so those cases need no network."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from email.utils import format_datetime
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from worker.dispatcher import sender as sender_module
from worker.dispatcher.sender import (
    DeliveryResult,
    ErrorKind,
    Sender,
    open_session,
)
from worker.runtime.http1 import Http1Client
from worker.webhooks.lookup import Lookup, system_lookup
from worker.webhooks.signing import generate_secret, headers
from worker.webhooks.targets import BlockedTarget, TargetPolicy, resolve_target

LAX = TargetPolicy(allow_http=True, allow_private=True)
DEFAULT = TargetPolicy()
HTTP_ONLY = TargetPolicy(allow_http=True)
BODY = b'{"type":"auth.status","data":{"id":"a1"}}'
CAP = 4096


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A tiny aiohttp server on 127.0.0.1 that records every request it gets."""

    port: int
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    streamed: list[int] = field(default_factory=list)

    def url(self, path: str, *, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}{path}"


def _app(receiver: Receiver) -> web.Application:
    async def record(request: web.Request) -> None:
        seen = {k.lower(): v for k, v in request.headers.items()}
        receiver.seen.append(Seen(request.path, seen, await request.read()))

    async def ok(request: web.Request) -> web.StreamResponse:
        await record(request)
        return web.Response(status=204)

    async def redirect(request: web.Request) -> web.StreamResponse:
        await record(request)
        return web.Response(status=302, headers={"Location": "/ok"})

    async def big(request: web.Request) -> web.StreamResponse:
        await record(request)
        return web.Response(status=200, body=b"x" * (1024 * 1024))

    async def exact(request: web.Request) -> web.StreamResponse:
        await record(request)
        return web.Response(status=200, body=b"y" * CAP)

    async def endless(request: web.Request) -> web.StreamResponse:
        await record(request)
        answer = web.StreamResponse(status=200)
        await answer.prepare(request)
        sent = 0
        try:
            while not receiver.release.is_set() and sent < 256 * 1024 * 1024:
                await answer.write(b"z" * 65536)
                sent += 65536
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass
        receiver.streamed.append(sent)
        return answer

    async def hang(request: web.Request) -> web.StreamResponse:
        await record(request)
        await receiver.release.wait()
        return web.Response(status=200)

    async def status(request: web.Request) -> web.StreamResponse:
        await record(request)
        code = int(request.match_info["code"])
        extra = {"Retry-After": request.query["ra"]} if "ra" in request.query else {}
        return web.Response(status=code, headers=extra, text="nope")

    app = web.Application()
    app.router.add_post("/ok", ok)
    app.router.add_post("/redirect", redirect)
    app.router.add_post("/big", big)
    app.router.add_post("/exact", exact)
    app.router.add_post("/endless", endless)
    app.router.add_post("/hang", hang)
    app.router.add_post("/status/{code}", status)
    return app


async def _serve(ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[Receiver]:
    receiver = Receiver(port=0)
    runner = web.AppRunner(_app(receiver), shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    receiver.port = runner.addresses[0][1]
    try:
        yield receiver
    finally:
        receiver.release.set()
        await runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async for r in _serve():
        yield r


def fixed(*rounds: Sequence[str]) -> tuple[list[str], Lookup]:
    """A DNS lookup answering each call with the next round (the last one repeats)."""
    calls: list[str] = []

    async def lookup(host: str, port: int) -> Sequence[str]:
        calls.append(host)
        return rounds[min(len(calls), len(rounds)) - 1]

    return calls, lookup


async def post(
    url: str,
    policy: TargetPolicy = LAX,
    *,
    lookup: Lookup | None = None,
    timeout_s: float = 5.0,
    ssl_context: ssl.SSLContext | None = None,
) -> DeliveryResult:
    async with open_session(
        policy, lookup=lookup or system_lookup, ssl_context=ssl_context
    ) as session:
        sender = Sender(session, timeout_s=timeout_s, body_cap=CAP)
        secret = generate_secret()
        return await sender.post(url, BODY, headers([secret], "msg_1", int(time.time()), BODY))


# --- delivery to a real receiver -------------------------------------------------------------


async def test_delivers_signed_body_to_the_receiver(receiver: Receiver) -> None:
    result = await post(receiver.url("/ok"))
    assert result.status == 204 and result.ok and result.error is None
    assert result.elapsed_s > 0
    (seen,) = receiver.seen
    assert seen.body == BODY
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["webhook-id"] == "msg_1"
    assert seen.headers["webhook-signature"].startswith("v1,")
    assert "cookie" not in seen.headers


async def test_default_policy_blocks_loopback_without_connecting(receiver: Receiver) -> None:
    for policy in (DEFAULT, HTTP_ONLY):
        result = await post(receiver.url("/ok"), policy)
        assert result.error == ErrorKind.BLOCKED and result.status is None
    assert (await post(receiver.url("/ok"), DEFAULT)).detail == "url_scheme_not_allowed"
    assert (await post(receiver.url("/ok"), HTTP_ONLY)).detail == "target_loopback"
    assert receiver.seen == []


async def test_localhost_is_blocked_by_default(receiver: Receiver) -> None:
    result = await post(receiver.url("/ok", host="localhost"), HTTP_ONLY)
    assert (result.error, result.detail) == (ErrorKind.BLOCKED, "target_loopback")
    assert receiver.seen == []


async def test_a_name_resolving_to_loopback_is_blocked_by_default(receiver: Receiver) -> None:
    calls, lookup = fixed(["127.0.0.1"])
    result = await post(receiver.url("/ok", host="hooks.test"), HTTP_ONLY, lookup=lookup)
    assert (result.error, result.detail) == (ErrorKind.BLOCKED, "target_loopback")
    assert calls == ["hooks.test"]
    assert receiver.seen == []


async def test_a_name_with_one_private_address_among_public_is_blocked(receiver: Receiver) -> None:
    _, lookup = fixed(["8.8.8.8", "10.1.2.3"])
    result = await post(receiver.url("/ok", host="hooks.test"), HTTP_ONLY, lookup=lookup)
    assert (result.error, result.detail) == (ErrorKind.BLOCKED, "target_private")


async def test_the_resolved_address_is_the_one_dialled(receiver: Receiver) -> None:
    calls, lookup = fixed(["127.0.0.1"])
    result = await post(receiver.url("/ok", host="hooks.test"), LAX, lookup=lookup)
    assert result.status == 204
    assert calls == ["hooks.test"]
    assert receiver.seen[0].headers["host"] == f"hooks.test:{receiver.port}"


async def test_a_literal_address_is_dialled_without_a_lookup(receiver: Receiver) -> None:
    calls, lookup = fixed(["10.9.9.9"])
    result = await post(receiver.url("/ok"), LAX, lookup=lookup)
    assert (result.status, calls) == (204, [])
    assert "accept-encoding" not in receiver.seen[0].headers  # the body is kept as sent


async def test_redirects_are_not_followed(receiver: Receiver) -> None:
    result = await post(receiver.url("/redirect"))
    assert result.status == 302 and not result.ok
    assert [s.path for s in receiver.seen] == ["/redirect"]


async def test_oversized_body_is_capped(receiver: Receiver) -> None:
    result = await post(receiver.url("/big"))
    assert result.status == 200
    assert result.body == b"x" * CAP and result.truncated


async def test_a_body_of_exactly_the_cap_is_not_truncated(receiver: Receiver) -> None:
    result = await post(receiver.url("/exact"))
    assert result.body == b"y" * CAP and not result.truncated


async def test_an_endless_body_is_abandoned_not_drained(receiver: Receiver) -> None:
    result = await post(receiver.url("/endless"), timeout_s=10.0)
    assert result.status == 200 and result.truncated and len(result.body) == CAP
    assert result.elapsed_s < 5.0
    for _ in range(100):  # the handler ends once our side has closed the connection
        if receiver.streamed:
            break
        await asyncio.sleep(0.05)
    assert receiver.streamed and receiver.streamed[0] < 64 * 1024 * 1024


async def test_timeout_is_an_error_kind(receiver: Receiver) -> None:
    result = await post(receiver.url("/hang"), timeout_s=0.3)
    assert (result.status, result.error) == (None, ErrorKind.TIMEOUT)
    assert 0.25 < result.elapsed_s < 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_connection_refused_is_an_error_kind() -> None:
    result = await post(f"http://127.0.0.1:{_free_port()}/ok")
    assert (result.status, result.error) == (None, ErrorKind.CONNECT)
    assert result.detail == "ConnectionRefusedError"


async def test_dns_failure_is_an_error_kind() -> None:
    async def lookup(host: str, port: int) -> Sequence[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    result = await post("https://nowhere.test/ok", DEFAULT, lookup=lookup)
    assert (result.status, result.error) == (None, ErrorKind.DNS)


@pytest.mark.parametrize(
    ("path", "status", "retry_after"),
    [
        ("/status/429?ra=7", 429, 7.0),
        ("/status/503?ra=120", 503, 120.0),
        ("/status/429", 429, None),
        ("/status/503?ra=soon", 503, None),
        ("/status/500?ra=7", 500, None),  # only 429 and 503 carry a meaningful Retry-After
        ("/status/410", 410, None),
    ],
)
async def test_status_and_retry_after(
    receiver: Receiver, path: str, status: int, retry_after: float | None
) -> None:
    result = await post(receiver.url(path))
    assert (result.status, result.retry_after_s, result.error) == (status, retry_after, None)
    assert result.body == b"nope"


async def test_retry_after_as_an_http_date(receiver: Receiver) -> None:
    when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=90)
    date = format_datetime(when, usegmt=True).replace(" ", "%20").replace(",", "%2C")
    result = await post(receiver.url(f"/status/503?ra={date}"))
    assert result.retry_after_s is not None and 80 <= result.retry_after_s <= 90


async def test_sender_refuses_a_session_it_cannot_trust() -> None:
    async with Http1Client() as plain:
        with pytest.raises(ValueError, match="open_session"):
            Sender(plain)


async def test_one_session_serves_many_deliveries(receiver: Receiver) -> None:
    async with open_session(LAX) as session:
        sender = Sender(session, body_cap=CAP)
        results = await asyncio.gather(
            *(sender.post(receiver.url("/ok"), BODY, {}) for _ in range(20))
        )
    assert {r.status for r in results} == {204}
    assert len(receiver.seen) == 20


async def test_the_vetted_urls_a_sender_keeps_are_bounded(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sender_module, "TARGETS_KEPT", 3)
    async with open_session(HTTP_ONLY) as session:
        sender = Sender(session, body_cap=CAP)
        for n in range(5):
            assert (await sender.post(receiver.url(f"/ok?n={n}"), BODY, {})).error == "blocked"
        assert sender._targets == {}  # refused URLs are not kept
    async with open_session(LAX) as session:
        sender = Sender(session, body_cap=CAP)
        for n in range(5):
            assert (await sender.post(receiver.url(f"/ok?n={n}"), BODY, {})).status == 204
        assert sorted(sender._targets) == [receiver.url(f"/ok?n={n}") for n in (2, 3, 4)]


# --- the resolver pins what it checked -------------------------------------------------------


async def test_rebinding_dials_only_the_checked_address() -> None:
    """First answer public, later ones private: the sender dials exactly what it vetted, and
    refuses once the name turns private; it never dials the private address."""
    calls, lookup = fixed(["93.184.216.34"], ["127.0.0.1"])
    dialled: list[tuple[str, int]] = []

    def no_network(address: str, port: int) -> socket.socket:
        dialled.append((address, port))
        raise OSError(errno.ENETUNREACH, "tests dial nothing")

    async with open_session(DEFAULT, lookup=lookup, socket_factory=no_network) as session:
        sender = Sender(session)
        first = await sender.post("https://rebind.test/hook", BODY, {})
        assert (first.error, dialled, calls) == (
            ErrorKind.CONNECT,
            [("93.184.216.34", 443)],
            ["rebind.test"],
        )
        second = await sender.post("https://rebind.test/hook", BODY, {})
    assert (second.error, second.detail) == (ErrorKind.BLOCKED, "target_loopback")
    assert calls == ["rebind.test", "rebind.test"]
    assert dialled == [("93.184.216.34", 443)]


async def test_resolver_makes_one_lookup_and_returns_its_vetted_answer() -> None:
    calls, lookup = fixed(["8.8.8.8", "2001:4860:4860::8888"], ["10.0.0.1"])
    results = await resolve_target("hooks.test", 443, DEFAULT, lookup)
    assert [(str(ip), ip.version) for ip in results] == [
        ("8.8.8.8", 4),
        ("2001:4860:4860::8888", 6),
    ]
    assert calls == ["hooks.test"]
    with pytest.raises(BlockedTarget):
        await resolve_target("hooks.test", 443, DEFAULT, lookup)
    literal = await resolve_target("8.8.4.4", 443, DEFAULT, lookup)
    assert [str(ip) for ip in literal] == ["8.8.4.4"]
    assert calls == ["hooks.test", "hooks.test"], "a literal address is judged with no lookup"


async def test_resolver_with_the_system_lookup_blocks_localhost() -> None:
    with pytest.raises(BlockedTarget) as caught:
        await resolve_target("localhost", 80, DEFAULT)
    assert caught.value.reason == "target_loopback"
    lax = await resolve_target("localhost", 80, LAX)
    assert lax and all(ip.is_loopback for ip in lax)


# --- TLS verifies the name, while the vetted address is dialled --------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for the name ``localhost`` only (no IP address in it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture
async def tls_receiver(tls_files: tuple[Path, Path]) -> AsyncIterator[Receiver]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*tls_files)
    async for r in _serve(context):
        yield r


@pytest.fixture
def trusting(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tls_files[0]))


async def test_tls_to_the_certified_name_at_the_vetted_address(
    tls_receiver: Receiver, trusting: ssl.SSLContext
) -> None:
    calls, lookup = fixed(["127.0.0.1"])
    result = await post(
        tls_receiver.url("/ok", scheme="https", host="localhost"),
        TargetPolicy(allow_private=True),
        lookup=lookup,
        ssl_context=trusting,
    )
    assert result.status == 204
    assert calls == ["localhost"]


@pytest.mark.parametrize("host", ["127.0.0.1", "other.test"])
async def test_tls_checks_the_url_name_not_the_address(
    tls_receiver: Receiver, trusting: ssl.SSLContext, host: str
) -> None:
    _, lookup = fixed(["127.0.0.1"])
    result = await post(
        tls_receiver.url("/ok", scheme="https", host=host),
        TargetPolicy(allow_private=True),
        lookup=lookup,
        ssl_context=trusting,
    )
    assert (result.status, result.error) == (None, ErrorKind.TLS)
    assert tls_receiver.seen == []


async def test_tls_uses_the_system_trust_store_by_default(tls_receiver: Receiver) -> None:
    _, lookup = fixed(["127.0.0.1"])
    result = await post(
        tls_receiver.url("/ok", scheme="https", host="localhost"),
        TargetPolicy(allow_private=True),
        lookup=lookup,
    )
    assert result.error == ErrorKind.TLS


# --- hostile receivers: raw bytes on loopback ---------------------------------------------------

RETRY_AFTER_MAX = 900.0
Script = Callable[[asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_receiver(script: Script) -> AsyncIterator[str]:
    """A receiver that reads one request and answers whatever bytes ``script`` writes (no HTTP
    server library in between, so it can break the protocol); yields its URL."""
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            await script(writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the sender hung up, or the test is over
        finally:
            writer.close()
            handlers.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


def answer(head: bytes, body: bytes = b"") -> Script:
    async def script(writer: asyncio.StreamWriter) -> None:
        writer.write(head + body)
        await writer.drain()

    return script


async def hostile_post(url: str, *, timeout_s: float = 5.0) -> DeliveryResult:
    async with open_session(LAX) as session:
        sender = Sender(
            session, timeout_s=timeout_s, body_cap=CAP, retry_after_max_s=RETRY_AFTER_MAX
        )
        return await sender.post(url, BODY, {"Content-Type": "application/json"})


def too_many(retry_after: bytes, status: bytes = b"429 Too Many Requests") -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\nRetry-After: " + retry_after + b"\r\n"
        b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("retry_after", "seconds"),
    [
        (b"9" * 400, RETRY_AFTER_MAX),  # OverflowError in float(int()) before
        (b"1000000000000", RETRY_AFTER_MAX),  # a due time in the year 33715 before
        (b"-5", None),
        ("\uff11\uff12".encode(), None),  # full-width digits
        (b"Fri, 31 Dec 9999 23:59:59 GMT", RETRY_AFTER_MAX),
        (b"Fri, 31 Dec 99999 23:59:59 GMT", None),
        (b"Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
        (b"\xff\xfe 12", None),  # not UTF-8
        (b"\x01\x7f12", None),  # control bytes
        (b"  42  ", 42.0),
    ],
)
@pytest.mark.parametrize("status", [b"429 Too Many Requests", b"503 Service Unavailable"])
async def test_a_hostile_retry_after_is_bounded_or_ignored(
    retry_after: bytes, seconds: float | None, status: bytes
) -> None:
    async with raw_receiver(answer(too_many(retry_after, status))) as url:
        result = await hostile_post(url)
    assert (result.status, result.error) == (int(status[:3]), None)
    assert result.retry_after_s == seconds


async def test_a_50_mb_body_is_capped_and_the_connection_dropped() -> None:
    total = 50 * 1024 * 1024
    sent: list[int] = []

    async def flood(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        chunk = b"x" * 65536
        count = 0
        try:
            while count < total:
                writer.write(chunk)
                await writer.drain()
                count += len(chunk)
        finally:
            sent.append(count)

    async with raw_receiver(flood) as url:
        result = await hostile_post(url)
        for _ in range(100):  # the script ends once the sender has dropped the connection
            if sent:
                break
            await asyncio.sleep(0.05)
    assert (result.status, result.error) == (200, None)
    assert result.truncated and result.body == b"x" * CAP
    assert sent and sent[0] < total, "the sender stopped reading; the receiver could not finish"


async def test_a_body_dripped_a_byte_at_a_time_ends_with_the_attempts_time_limit() -> None:
    dripped: list[int] = []

    async def drip(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(100):  # bounded; the sender gives up long before
            writer.write(b"z")
            await writer.drain()
            dripped.append(1)
            await asyncio.sleep(0.1)

    async with raw_receiver(drip) as url:
        result = await hostile_post(url, timeout_s=0.5)
    assert (result.status, result.error) == (None, ErrorKind.TIMEOUT)
    assert 2 <= len(dripped) < 100, "bytes kept coming, yet the attempt ended"


async def test_a_status_line_dripped_a_byte_at_a_time_ends_with_the_time_limit() -> None:
    async def drip(writer: asyncio.StreamWriter) -> None:
        for byte in b"HTTP/1.1 200 OK\r\n" * 10:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)

    async with raw_receiver(drip) as url:
        result = await hostile_post(url, timeout_s=0.5)
    assert (result.status, result.error) == (None, ErrorKind.TIMEOUT)


CLOSE = b"Content-Length: 0\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 abc OK\r\n" + CLOSE,
        b"HTTP/1.1 99999 Huge\r\n" + CLOSE,
        b"HTTP/1.1 042 Low\r\n" + CLOSE,  # three digits, no HTTP status
        b"HTTP/1.1 600 High\r\n" + CLOSE,
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1\r\n" + CLOSE,
        b"\x00\xff\xfe\x80garbage\r\n\r\n",
        b"HTTP/1.1 429 Too\r\nRetry-After 12\r\n" + CLOSE,  # no colon
        b"HTTP/1.1 429 Too\r\nRetry-After: 1\x002\r\n" + CLOSE,  # NUL in a value
        b"HTTP/1.1 200 OK\r\nX-\x80\x81: \xc3\x28\r\n" + CLOSE,  # non-ASCII name
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 100_000 + b"\r\n" + CLOSE,
        b"HTTP/1.1 200 OK\r\n" + b"X-Many: a\r\n" * 50_000 + CLOSE,
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\nConnection: close\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nshort",
        b"",
    ],
)
async def test_a_malformed_answer_is_a_failed_attempt_with_a_reason(raw: bytes) -> None:
    async with raw_receiver(answer(raw)) as url:
        result = await hostile_post(url)
    assert result.status is None and not result.ok
    assert result.error == ErrorKind.PROTOCOL
    assert result.detail


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 429 Too\r\nX-Odd: \xc3\x28\xff\r\n" + CLOSE,  # not UTF-8 in a value
        b"HTTP/1.1 429 Too\r\nRetry-After: \xef\xbc\x91\xef\xbc\x92\r\n" + CLOSE,
        b"HTTP/1.1 429 Too\r\nRetry-After: 12\r\nRetry-After: " + b"9" * 400 + b"\r\n" + CLOSE,
    ],
)
async def test_odd_header_bytes_still_give_the_answers_status(raw: bytes) -> None:
    async with raw_receiver(answer(raw)) as url:
        result = await hostile_post(url)
    assert (result.status, result.error) == (429, None)
    assert result.retry_after_s is None or 0 <= result.retry_after_s <= RETRY_AFTER_MAX


async def test_anything_an_attempt_raises_is_an_internal_failure() -> None:
    """Not only the network's exceptions: whatever breaks inside one attempt (here the socket
    hook itself) is a result with a reason, never an exception out of ``post``."""

    def exploding(address: str, port: int) -> socket.socket:
        raise RecursionError("maximum recursion depth exceeded")

    async with open_session(LAX, socket_factory=exploding) as session:
        result = await Sender(session, timeout_s=2.0).post(
            f"http://127.0.0.1:{_free_port()}/", BODY, {}
        )
    assert (result.status, result.error, result.detail) == (
        None,
        ErrorKind.INTERNAL,
        "RecursionError",
    )
