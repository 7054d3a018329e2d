"""The provider client: one aiohttp session answering the provider's own types (a bounded
``ProviderAnswer``, or a ``TransportFailure``), so nothing past it knows the HTTP library
(docs/architecture.md, "Bounded remote answers")."""

from __future__ import annotations

import ssl
from types import TracebackType

import aiohttp

from worker.auth.provider.answer import (
    ACCEPT_ENCODING,
    DEFAULT_BODY_CAP,
    ProviderAnswer,
    decoded_body,
    read_capped,
)
from worker.auth.provider.failures import (
    ConnectFailed,
    ConnectionLost,
    InvalidTarget,
    TimedOut,
    TransportFailure,
)

__all__ = ["AiohttpClient"]


class AiohttpClient:
    """One ``aiohttp.ClientSession`` with a bounded connection pool, built at start-up and
    shared by every adapter (adapters never close it). Redirects are never followed.

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
        self.timeout_s = timeout_s
        self.connect_timeout_s = timeout_s if connect_timeout_s is None else connect_timeout_s
        self.max_connections = max_connections
        self.headers = {**(headers or {}), "Accept-Encoding": ACCEPT_ENCODING}
        self.body_cap = body_cap
        self._tls = tls
        # No total: the adapter's deadline bounds a call; these bound each phase (connect,
        # and each read of the socket).
        connect_s = self.connect_timeout_s
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_s, sock_connect=connect_s, sock_read=timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def follow_redirects(self) -> bool:
        """Always false: a 3xx is an answer the adapter cannot use, not a place to go."""
        return False

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the provider client is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections,
                    limit_per_host=0,
                    ssl=True if self._tls is None else self._tls,
                ),
                timeout=self._timeout,
                headers=self.headers,
                auto_decompress=False,  # decoded_body inflates, up to the cap
            )
        return self._session

    async def request(
        self, method: str, url: str, *, headers: dict[str, str] | None = None
    ) -> ProviderAnswer:
        """Send one request; the body (bounded, decoded) is read before returning. Raises
        ``TransportFailure`` when no answer could be read."""
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
                return ProviderAnswer(answer.status, body, answer.headers)
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


def _translate(exc: aiohttp.ClientError | TimeoutError) -> TransportFailure:
    """Our failure that means what ``exc`` means; the one place aiohttp's exceptions are read.

    aiohttp.ConnectionTimeoutError (connect phase)    → TimedOut(phase="connect")  transient
    any other TimeoutError (ServerTimeoutError: read) → TimedOut(phase="read")     transient
    aiohttp.ClientConnectorError (refused, DNS, TLS)  → ConnectFailed              transient
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError, aiohttp.ClientOSError → ConnectionLost             transient
    aiohttp.InvalidURL                                → InvalidTarget (our call is wrong)
    any other aiohttp.ClientError (e.g. a malformed
      status line)                                    → TransportFailure (not transient)
    """
    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return TimedOut(text, phase="connect")
    if isinstance(exc, TimeoutError):  # ServerTimeoutError is one too
        return TimedOut(text, phase="read")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ConnectFailed(text)
    if isinstance(
        exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientOSError
    ):
        return ConnectionLost(text)
    if isinstance(exc, aiohttp.InvalidURL):
        return InvalidTarget(text)
    return TransportFailure(text)
