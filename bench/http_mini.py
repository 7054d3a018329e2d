"""A minimal HTTP/1.1 keep-alive client on the loop's transports, with httptools (the parser
uvicorn already brings) reading the answers: contender (d) of ``bench.http_clients``
(bench/README.md, "HTTP clients"). An experiment that lives in bench/ only, not a product client.

What it does, and no more: a pool of keep-alive connections per (scheme, host, port), at most
``max_per_host`` open, callers beyond that waiting on a semaphore; plain TCP or TLS (the
caller's ``ssl.SSLContext``, a client certificate in it for mTLS); a time-out per phase
(connect, the answer's headers after the request is written, its body after the headers);
a body cap (more than ``body_cap`` bytes drops the connection and fails the call); chunked,
sized and read-to-close bodies (httptools decodes the framing). A call that fails closes its
connection; a POST is never retried (not idempotent). Header names and values with CR or LF
are refused (no request smuggling through a caller's header).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Mapping
from typing import Final, cast
from urllib.parse import urlsplit

import httptools

__all__ = ["HttpFailure", "MiniClient"]

_FORBIDDEN: Final = frozenset("\r\n\0")


class HttpFailure(Exception):
    """No answer could be read; ``phase`` says where it failed (``connect``, ``headers``,
    ``body``, ``protocol``, ``cap``, ``lost``)."""

    def __init__(self, phase: str, detail: str = "") -> None:
        super().__init__(f"{phase}: {detail}" if detail else phase)
        self.phase = phase


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self, loop: asyncio.AbstractEventLoop, body_cap: int) -> None:
        self._loop = loop
        self._cap = body_cap
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.open = False
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._body_s = 0.0
        self._status = 0
        self._chunks: list[bytes] = []
        self._size = 0
        self._headers_done = False
        self._framed = False  # Content-Length or chunked: the end is known without a close
        self.reusable = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.open = True

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # nothing asked: a peer that talks unprompted is not HTTP
            self._fail(HttpFailure("protocol", "data while idle"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HttpFailure("protocol", type(exc).__name__))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._waiter is not None and not self._waiter.done():
            if self._headers_done and not self._framed:  # a body delimited by the close
                self._finish()
            else:
                self._fail(HttpFailure("lost", type(exc).__name__ if exc else "closed"))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-length" or (
            lowered == b"transfer-encoding" and value.lower().endswith(b"chunked")
        ):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._status = self._parser.get_status_code()
        self._arm(self._body_s, "body")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._cap:
            self._fail(HttpFailure("cap", f"more than {self._cap} bytes"))
            return
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self.reusable = self._parser.should_keep_alive()
        self._finish()

    # -- the call
    def send(
        self, request: bytes, headers_s: float, body_s: float
    ) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        waiter: asyncio.Future[tuple[int, bytes]] = self._loop.create_future()
        self._waiter = waiter
        self._status, self._chunks, self._size = 0, [], 0
        self._headers_done = self._framed = self.reusable = False
        self._body_s = body_s
        self._arm(headers_s, "headers")
        self.transport.write(request)
        return waiter

    def _arm(self, seconds: float, phase: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(seconds, self._expired, phase)

    def _expired(self, phase: str) -> None:
        self._timer = None
        self._fail(HttpFailure(phase, "timed out"))

    def _finish(self) -> None:
        waiter = self._waiter
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, b"".join(self._chunks)))
        self._waiter = None

    def _fail(self, failure: HttpFailure) -> None:
        self.reusable = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(failure)
        self.close()

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()


class _Pool:
    def __init__(self, size: int) -> None:
        self.gate = asyncio.Semaphore(size)
        self.idle: deque[_Connection] = deque()


class MiniClient:
    """POST over pooled keep-alive connections; ``post`` answers ``(status, body)`` or raises
    ``HttpFailure``."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_per_host: int = 32,
        connect_timeout_s: float = 5.0,
        headers_timeout_s: float = 15.0,
        body_timeout_s: float = 15.0,
        body_cap: int = 4096,
        user_agent: str = "bench-http-mini",
    ) -> None:
        self._ssl = ssl_context
        self._max_per_host = max_per_host
        self._connect_s = connect_timeout_s
        self._headers_s = headers_timeout_s
        self._body_s = body_timeout_s
        self._cap = body_cap
        self._user_agent = user_agent
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._targets: dict[str, tuple[tuple[str, str, int], bytes, bytes]] = {}
        self._closed = False

    def _target(self, url: str) -> tuple[tuple[str, str, int], bytes, bytes]:
        """The pool key, the request target and the Host header of ``url`` (parsed once)."""
        known = self._targets.get(url)
        if known is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise HttpFailure("protocol", "not an http(s) URL")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            host = parts.netloc.rpartition("@")[2]
            known = ((parts.scheme, parts.hostname, port), path.encode(), host.encode())
            if len(self._targets) < 1024:  # a bench client: few targets, bounded anyway
                self._targets[url] = known
        return known

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        if self._closed:
            raise RuntimeError("the client is closed")
        key, path, host = self._target(url)
        lines = [b"POST ", path, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
        for name, value in headers.items():
            if not _FORBIDDEN.isdisjoint(name) or not _FORBIDDEN.isdisjoint(value):
                raise ValueError("a header name or value holds CR, LF or NUL")
            lines += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
        lines += (b"Content-Length: ", b"%d" % len(body), b"\r\n\r\n", body)
        request = b"".join(lines)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(self._max_per_host)
        async with pool.gate:
            conn = None
            while pool.idle:
                candidate = pool.idle.pop()
                if candidate.open:
                    conn = candidate
                    break
            if conn is None:
                conn = await self._connect(key)
            try:
                answer = await conn.send(request, self._headers_s, self._body_s)
            except BaseException:
                conn.close()
                raise
            if conn.reusable and conn.open:
                pool.idle.append(conn)
            else:
                conn.close()
            return answer

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        secure = self._ssl if scheme == "https" else None
        if scheme == "https" and secure is None:
            secure = ssl.create_default_context()
        try:
            async with asyncio.timeout(self._connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, self._cap), host, port, ssl=secure
                )
        except TimeoutError as exc:
            raise HttpFailure("connect", "timed out") from exc
        except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
            raise HttpFailure("connect", type(exc).__name__) from exc
        return conn

    async def aclose(self) -> None:
        self._closed = True
        for pool in self._pools.values():
            while pool.idle:
                pool.idle.pop().close()
        self._pools.clear()
