"""The provider client on aiohttp: the same ``Requester`` seam as the httpx clients, at a
fifth of their CPU per request.

Measured against the simulator on loopback (20 ms latency, 64 concurrent requests, 3,000
requests, client CPU from ``os.times``): httpx — even as 16 small pools, see
``ShardedClient`` — 1,230 and 1,247 µs of CPU per request; aiohttp 220 and 223 µs. The worker
makes one provider call per confirm, so this is most of a command's cost (bench/README.md).

The adapter and ``map_upstream_failure`` keep speaking httpx's types: this module answers
with an ``httpx.Response`` and translates aiohttp's exceptions into the httpx exception that
means the same thing, in one place (``_translate``), the way httpx's own
``map_httpcore_exceptions`` does for httpcore. Retries, deadlines, the breaker and the error
table stay exactly as they are for both clients.

Answers are bounded here, as ``ShardedClient`` bounds them (``worker.provider.answer``): at most
``body_cap`` bytes are read, aiohttp decompresses nothing, and gzip/deflate are inflated up to
the same cap; a body past either bound arrives empty, so only its status is used.

Exception tree translated (aiohttp → httpx):

    asyncio/built-in TimeoutError, aiohttp.ServerTimeoutError
        connect phase (ConnectionTimeoutError)  → httpx.ConnectTimeout
        otherwise                               → httpx.ReadTimeout
    aiohttp.ClientConnectorError (refused, DNS)  → httpx.ConnectError
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError                   → httpx.RemoteProtocolError
    aiohttp.ClientOSError                        → httpx.ReadError
    aiohttp.InvalidURL                           → httpx.UnsupportedProtocol (our call is wrong)
    any other aiohttp.ClientError                → httpx.TransportError (not transient)
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from types import TracebackType

import aiohttp
import httpx

from worker.provider.answer import (
    ACCEPT_ENCODING,
    BODY_HEADERS,
    DEFAULT_BODY_CAP,
    decoded_body,
    read_capped,
)

__all__ = ["AiohttpClient", "RawAnswer"]

#: Status, decoded body (at most the cap; empty when unusable) and headers of one answer, as
#: ``AiohttpClient.request_raw`` read them. The headers are as sent: ``Content-Encoding`` and
#: ``Content-Length`` describe the wire, not the body beside them.
RawAnswer = tuple[int, bytes, Mapping[str, str]]


class AiohttpClient:
    """One ``aiohttp.ClientSession`` with a bounded connection pool, built at start-up and
    shared by every adapter (adapters never close it).

    The session is opened on the first request, inside the running event loop, so building
    the client needs no loop.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        max_connections: int,
        headers: dict[str, str] | None = None,
        body_cap: int = DEFAULT_BODY_CAP,
        connect_timeout_s: float | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if body_cap < 1:
            raise ValueError("body_cap must be positive")
        connect_s = timeout_s if connect_timeout_s is None else connect_timeout_s
        self.timeout = httpx.Timeout(timeout_s, connect=connect_s)
        self.headers = httpx.Headers(headers or {})
        self.headers["Accept-Encoding"] = ACCEPT_ENCODING
        self.follow_redirects = False
        self.body_cap = body_cap
        self._max_connections = max_connections
        self._tls = tls
        # No total: the adapter's deadline bounds a call; these bound each phase, as
        # httpx.Timeout(timeout_s) does (connect, and each read of the socket).
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_s, sock_connect=connect_s, sock_read=timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the provider client is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections,
                    limit_per_host=0,
                    ssl=True if self._tls is None else self._tls,
                ),
                timeout=self._timeout,
                headers=dict(self.headers),
                auto_decompress=False,  # decoded_body inflates, up to the cap
            )
        return self._session

    async def request(
        self, method: str, url: str, *, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """Send one request; the body (bounded, decoded) is read before returning."""
        status, content, answer_headers = await self.request_raw(method, url, headers=headers)
        # No ``request=``: nothing downstream reads it, and building an httpx.Request
        # (URL parsing) tripled the cost of this wrapper (68 against 20 us each). Headers go
        # as bytes, as aiohttp decoded them: httpx would refuse a non-ASCII str.
        fields = [
            (name.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape"))
            for name, value in answer_headers.items()
            if name.lower() not in BODY_HEADERS
        ]
        return httpx.Response(status, headers=fields, content=content)

    async def request_raw(
        self, method: str, url: str, *, headers: dict[str, str] | None = None
    ) -> RawAnswer:
        """``request`` without the ``httpx.Response``: the adapter parses a 2xx body itself
        and builds a response only for an answer it cannot use (the error mapping's input)."""
        session = self._open()
        try:
            async with session.request(
                method, url, headers=headers, allow_redirects=False
            ) as answer:
                raw, truncated = await read_capped(answer.content.iter_any(), self.body_cap)
                if truncated:
                    answer.close()  # drop the connection rather than drain what is not read
                coding = answer.headers.get("Content-Encoding")
                body = decoded_body(raw, truncated=truncated, coding=coding, cap=self.body_cap)
                return answer.status, body, answer.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _translate(exc) from exc

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> AiohttpClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _translate(exc: aiohttp.ClientError | TimeoutError) -> httpx.TransportError:
    """The httpx exception that means what ``exc`` means (see the module docstring).

    Built without an ``httpx.Request``: httpx would reject the very URLs (e.g. a malformed
    one) whose failure is being translated.
    """
    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(text)
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):  # ServerTimeoutError is both
        return httpx.ReadTimeout(text)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(text)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(text)
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(text)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(text)
    return httpx.TransportError(text)
