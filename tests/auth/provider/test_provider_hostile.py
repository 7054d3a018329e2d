"""A hostile provider, on raw loopback sockets, against the adapter as the worker builds it:
nested JSON 100k levels deep, bodies past the cap,
gzip bombs, invalid UTF-8, garbage headers, a malformed status line, a dripped body. Every
call ends in an auth state or a catalogued ``ProviderError``; nothing else ever leaves the
adapter, so neither the confirm nor the follow-up poll can be crashed by an answer."""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.auth.provider.hostile import (
    DEEP,
    DEEP_IN_CAP,
    STATE,
    HostileProvider,
    Script,
    gzipped,
    http,
    written,
    zeros_gzipped,
)
from worker.auth.provider import (
    HttpProviderAdapter,
    ProviderAnswer,
    ProviderAuthState,
    ProviderError,
)
from worker.auth.provider.answer import DEFAULT_BODY_CAP, decoded_body, load_json
from worker.auth.provider.http import build_http_client, parse_auth_state
from worker.settings import Settings

UNAVAILABLE = ("provider_unavailable", 30002, 502)
OPERATION_FAILED = ("provider_unavailable", 30010, 502)


def triple(exc: ProviderError) -> tuple[str, int, int]:
    return (exc.error.code, exc.error.numeric_code, exc.error.http_status)


@pytest.fixture
async def provider() -> AsyncIterator[HostileProvider]:
    async with HostileProvider() as hostile:
        yield hostile


@pytest.fixture
async def adapter(provider: HostileProvider) -> AsyncIterator[Callable[..., HttpProviderAdapter]]:
    """An adapter on the shared client built from settings, as the worker builds both."""
    clients: list[Any] = []

    def make(**overrides: Any) -> HttpProviderAdapter:
        values: dict[str, Any] = {
            "provider_timeout_s": 2.0,
            "provider_max_attempts": 2,
            "provider_backoff_base_s": 0.001,
            "provider_backoff_max_s": 0.002,
            "provider_max_connections": 4,
        }
        values.update(overrides)
        settings = Settings(**values)
        client = build_http_client(settings)
        clients.append(client)
        return HttpProviderAdapter.from_settings("hostile", provider.url, client, settings)

    yield make
    for client in clients:
        await client.aclose()


async def outcome(
    adapter: HttpProviderAdapter, operation: str, *, deadline_s: float = 10.0
) -> ProviderAuthState | ProviderError:
    """The call's result or its ProviderError; any other exception fails the test."""
    deadline = time.monotonic() + deadline_s
    try:
        if operation == "confirm":
            return await adapter.confirm_passkey("acct-1", idempotency_key="k", deadline=deadline)
        return await adapter.get_auth_state("acct-1", deadline=deadline)
    except ProviderError as exc:
        return exc


def flood(head: bytes, chunk: bytes, total: int) -> Script:
    """``head`` announcing ``total`` bytes, then ``chunk`` after ``chunk`` until they are sent
    or the client hangs up (nothing that large is ever held in memory)."""

    async def script(writer: asyncio.StreamWriter) -> None:
        writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % total)
        sent = 0
        while sent < total:
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)

    return script


def lazily(raw: Callable[[], bytes]) -> Script:
    async def script(writer: asyncio.StreamWriter) -> None:
        await written(raw())(writer)

    return script


MB = 1024 * 1024

UNREADABLE_2XX: dict[str, bytes | Script] = {
    "nested-100k": http(b"200 OK", DEEP),
    "nested-within-cap": http(b"200 OK", DEEP_IN_CAP),
    "nested-under-a-usable-object": http(
        b"200 OK", STATE[:-1] + b',"x":' + b"{" * 40 + b"}" * 40 + b"}"
    ),
    "50-mb-body": flood(b"HTTP/1.1 200 OK\r\n", b" " * 65536, 50 * MB),
    "state-then-1-mb-of-spaces": http(b"200 OK", STATE + b" " * MB),
    "gzip-bomb-16-mb": lazily(
        lambda: http(b"200 OK", zeros_gzipped(16), b"Content-Encoding: gzip")
    ),
    "gzip-bomb-64-mb": http(b"200 OK", zeros_gzipped(64), b"Content-Encoding: gzip"),
    "gzip-nested": http(b"200 OK", gzipped(DEEP * 20), b"Content-Encoding: gzip"),
    "gzip-corrupt": http(b"200 OK", b"\x1f\x8b\x08\x00garbage", b"Content-Encoding: gzip"),
    "gzip-cut-short": http(b"200 OK", gzipped(STATE)[:-12], b"Content-Encoding: gzip"),
    "brotli-unasked": http(b"200 OK", b"\x8b\x02\x80hello\x03", b"Content-Encoding: br"),
    "gzip-twice": http(b"200 OK", gzipped(gzipped(STATE)), b"Content-Encoding: gzip, gzip"),
    "invalid-utf8": http(b"200 OK", b'{"status":"\xff\xfe","auth_status":"\xc3\x28"}'),
    "utf8-bom-garbage": http(b"200 OK", b"\xef\xbb\xbf\xff" + STATE),
    "not-json": http(b"200 OK", b"<html>" * 1000),
    "empty": http(b"200 OK"),
}


@pytest.mark.parametrize("operation", ["confirm", "poll"])
@pytest.mark.parametrize("name", sorted(UNREADABLE_2XX))
async def test_an_unusable_answer_is_a_catalogued_operation_failure(
    adapter: Callable[..., HttpProviderAdapter],
    provider: HostileProvider,
    name: str,
    operation: str,
) -> None:
    answer = UNREADABLE_2XX[name]
    provider.script = written(answer) if isinstance(answer, bytes) else answer
    result = await outcome(adapter(), operation)
    assert isinstance(result, ProviderError)
    assert triple(result) == OPERATION_FAILED and not result.transient
    assert len(provider.requests) == 1, "the same answer would fail again: not retried"


@pytest.mark.parametrize("operation", ["confirm", "poll"])
async def test_nested_json_past_the_parsers_recursion_limit_with_a_large_cap(
    adapter: Callable[..., HttpProviderAdapter], provider: HostileProvider, operation: str
) -> None:
    """With a cap large enough to let 100k levels through, the depth bound still holds."""
    provider.script = written(http(b"200 OK", DEEP))
    result = await outcome(adapter(provider_body_cap_bytes=MB), operation)
    assert isinstance(result, ProviderError) and triple(result) == OPERATION_FAILED


USABLE = {
    "plain": http(b"200 OK", STATE),
    "gzip": http(b"200 OK", gzipped(STATE), b"Content-Encoding: gzip"),
    "x-gzip": http(b"200 OK", gzipped(STATE), b"Content-Encoding: X-GZIP"),
    "deflate-zlib": http(b"200 OK", zlib.compress(STATE), b"Content-Encoding: deflate"),
    "deflate-raw": http(
        b"200 OK",
        (lambda c: c.compress(STATE) + c.flush())(zlib.compressobj(wbits=-15)),
        b"Content-Encoding: deflate",
    ),
    "identity": http(b"200 OK", STATE, b"Content-Encoding: identity"),
    "non-utf8-header-value": http(b"200 OK", STATE, b"X-Odd: \xc3\x28\xff\x80"),
    "state-at-the-cap": http(b"200 OK", STATE + b" " * (DEFAULT_BODY_CAP - len(STATE))),
}


@pytest.mark.parametrize("name", sorted(USABLE))
async def test_a_usable_answer_still_gives_the_state(
    adapter: Callable[..., HttpProviderAdapter], provider: HostileProvider, name: str
) -> None:
    provider.script = written(USABLE[name])
    result = await outcome(adapter(), "poll")
    assert result == ProviderAuthState("passkey_confirmation_sent", "passkey_confirmation_sent")


TRANSIENT: dict[str, bytes | Script] = {
    "503-huge-retry-after": http(b"503 Busy", b"", b"Retry-After: " + b"9" * 400),
    "429-1e12-retry-after": http(b"429 Slow", b"", b"Retry-After: 1000000000000"),
    "503-far-future-date": http(b"503 Busy", b"", b"Retry-After: Fri, 31 Dec 9999 23:59:59 GMT"),
    "503-gzip-bomb-body": lazily(
        lambda: http(b"503 Busy", zeros_gzipped(16), b"Content-Encoding: gzip")
    ),
    "503-nested-body": http(b"503 Busy", DEEP_IN_CAP),
    "502-50-mb-body": flood(b"HTTP/1.1 502 Bad Gateway\r\n", b"<p>" * 20000, 50 * MB),
}


@pytest.mark.parametrize("name", sorted(TRANSIENT))
async def test_an_unavailable_answer_with_a_hostile_body_or_header_is_still_transient(
    adapter: Callable[..., HttpProviderAdapter], provider: HostileProvider, name: str
) -> None:
    answer = TRANSIENT[name]
    provider.script = written(answer) if isinstance(answer, bytes) else answer
    result = await outcome(adapter(), "confirm")
    assert isinstance(result, ProviderError)
    assert triple(result) == UNAVAILABLE and result.transient
    assert result.retry_after is None or 0 <= result.retry_after <= 86_400.0


@pytest.mark.parametrize(
    "raw",
    [
        http(b"abc OK", STATE),
        http(b"99999 Huge", STATE),
        http(b"042 Odd", STATE),  # three digits, no HTTP status: h11 refuses, aiohttp not
        http(b"200 OK", STATE, b"X-\xe2\x82\xac: 1"),  # a header name that is no token
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"\x00\xff\xfe\x80garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\nConnection: close\r\n\r\n" + STATE,
        b"",
    ],
    ids=[
        "status-not-a-number",
        "status-five-digits",
        "status-042",
        "non-token-header-name",
        "not-http",
        "binary-garbage",
        "header-line-100-kb",
        "negative-length",
        "bad-chunk",
        "body-shorter-than-its-length",
        "nothing",
    ],
)
async def test_a_malformed_answer_is_provider_unavailable(
    adapter: Callable[..., HttpProviderAdapter], provider: HostileProvider, raw: bytes
) -> None:
    provider.script = written(raw)
    result = await outcome(adapter(), "poll")
    assert isinstance(result, ProviderError) and result.error.code == "provider_unavailable"


async def test_a_dripped_body_ends_at_the_deadline(
    adapter: Callable[..., HttpProviderAdapter], provider: HostileProvider
) -> None:
    async def drip(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(100):  # bounded; the deadline ends the call long before
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.1)

    provider.script = drip
    result = await outcome(adapter(), "poll", deadline_s=0.5)
    assert isinstance(result, ProviderError)
    assert triple(result) == UNAVAILABLE and result.transient


# -- the parsing functions, on arbitrary input -----------------------------------------------------

FIXED = {"state": STATE, "deep": DEEP, "deep-in-cap": DEEP_IN_CAP}
json_trees = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=30,
)
bodies = st.one_of(
    st.binary(max_size=2048),
    json_trees.map(lambda t: json.dumps(t).encode()),
    st.integers(min_value=0, max_value=200_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(min_value=0, max_value=200_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.sampled_from(["state", "deep", "deep-in-cap"]).map(FIXED.__getitem__),
)
codings = st.sampled_from([None, "", "gzip", "deflate", "br", "identity", "gzip, gzip", "\xff"])


@settings(max_examples=300, deadline=None)
@given(
    status=st.integers(min_value=0, max_value=999),
    body=bodies,
    coding=codings,
    compress=st.booleans(),
    retry_after=st.none() | st.text(max_size=40),
)
def test_no_answer_raises_anything_but_a_provider_error(
    status: int, body: bytes, coding: str | None, compress: bool, retry_after: str | None
) -> None:
    wire = gzipped(body) if compress else body
    decoded = decoded_body(wire, truncated=False, coding=coding, cap=DEFAULT_BODY_CAP)
    assert len(decoded) <= DEFAULT_BODY_CAP
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    parsed = settled(lambda: parse_auth_state(ProviderAnswer(status, decoded, headers)))
    assert isinstance(parsed, ProviderAuthState | ProviderError)


def settled(parse: Callable[[], ProviderAuthState]) -> ProviderAuthState | ProviderError:
    try:
        return parse()
    except ProviderError as exc:
        return exc


@settings(max_examples=300, deadline=None)
@given(body=bodies)
def test_load_json_never_raises(body: bytes) -> None:
    load_json(body)


def depth(tree: object) -> int:
    if isinstance(tree, list):
        return 1 + max((depth(item) for item in tree), default=0)
    if isinstance(tree, dict):
        return 1 + max((depth(item) for item in tree.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(tree=json_trees, limit=st.integers(min_value=0, max_value=6))
def test_the_depth_bound_is_exact_on_json(tree: object, limit: int) -> None:
    """Brackets inside strings (escaped quotes included) do not count; nesting does."""
    body = json.dumps(tree).encode()
    parsed = load_json(body, max_depth=limit)
    if depth(tree) > limit:
        assert parsed is None
    else:
        assert parsed == tree


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "body",
    [
        b'"\\' * 500_000 + b"[" * 40,  # every quote an unterminated string's start
        b'"' * 1_000_000 + b"[" * 40,
        b'"\\"' * 300_000 + b"[" * 40,
        b"[" * 500_000,
    ],
    ids=["quote-backslash", "quotes", "escaped-quotes", "open-brackets"],
)
def test_the_depth_check_is_linear_on_hostile_strings(body: bytes) -> None:
    """A megabyte built to make a string scanner backtrack from every quote is checked in one
    pass (a quadratic scan of it takes hours, past the timeout)."""
    assert load_json(body) is None
