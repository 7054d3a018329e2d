"""The provider client: the process's HTTP/1.1 client answering the provider's own types, so nothing
past it knows the HTTP client (docs/architecture.md, "Bounded remote answers")."""

from __future__ import annotations

import ssl
from types import TracebackType

from worker.auth.provider.answer import (
    ACCEPT_ENCODING,
    DEFAULT_BODY_CAP,
    ProviderAnswer,
    decoded_body,
)
from worker.auth.provider.failures import (
    ConnectFailed,
    ConnectionLost,
    InvalidTarget,
    TimedOut,
    TransportFailure,
)
from worker.runtime.http1 import (
    DialFailed,
    Http1Client,
    HttpError,
    HttpTimeout,
    InvalidRequest,
    NameNotResolved,
    PeerClosed,
    ProtocolError,
)

__all__ = ["ProviderHttpClient"]


class ProviderHttpClient:
    """One pooled ``Http1Client`` shared by every adapter (adapters never close it); it connects
    on the first request, so building it needs no loop. A 3xx is an answer, never followed."""

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
        self.headers = {"Accept": "*/*", **(headers or {}), "Accept-Encoding": ACCEPT_ENCODING}
        self.body_cap = body_cap
        # No total: the adapter's deadline bounds a call; these bound each phase (connect,
        # the answer's head, its body).
        self._client = Http1Client(
            max_connections=max_connections,
            connect_s=self.connect_timeout_s,
            headers_s=timeout_s,
            body_s=timeout_s,
            body_cap=body_cap,
            headers=self.headers,
            ssl_context=tls,
        )

    @property
    def is_closed(self) -> bool:
        return self._client.is_closed

    async def request(
        self, method: str, url: str, *, headers: dict[str, str] | None = None
    ) -> ProviderAnswer:
        """Send one request; the body (bounded, decoded) is read before returning. Raises
        ``TransportFailure`` when no answer could be read."""
        if self._client.is_closed:
            raise RuntimeError("the provider client is closed")
        try:
            answer = await self._client.request(method, url, headers=headers)
        except HttpError as exc:
            raise _translate(exc) from exc
        coding = answer.headers.get("Content-Encoding")
        body = decoded_body(
            answer.body, truncated=answer.truncated, coding=coding, cap=self.body_cap
        )
        return ProviderAnswer(answer.status, body, answer.headers)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> ProviderHttpClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _translate(exc: HttpError) -> TransportFailure:
    """Our failure that means what ``exc`` means; the one place the client's errors are read
    (a malformed status line or headers is the one failure that is not transient)."""
    text = exc.reason
    if isinstance(exc, HttpTimeout):
        return TimedOut(text, phase="connect" if exc.phase == "connect" else "read")
    if isinstance(exc, DialFailed | NameNotResolved):
        return ConnectFailed(text)
    if isinstance(exc, PeerClosed) or (isinstance(exc, ProtocolError) and exc.in_body):
        return ConnectionLost(text)
    if isinstance(exc, InvalidRequest):
        return InvalidTarget(text)
    return TransportFailure(text)
