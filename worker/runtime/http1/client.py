"""The product's outbound HTTP/1.1 client: a bounded keep-alive pool per origin, answers parsed by
httptools (docs/architecture.md, "Outbound HTTP"). It never follows a redirect nor retries, save
once: an idempotent request written on a reused idle connection the peer had closed (end of
stream before any answer byte) is sent again on a new connection."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

from multidict import CIMultiDict, CIMultiDictProxy

from worker.runtime.http1.connection import Connection
from worker.runtime.http1.errors import (
    DialFailed,
    HttpTimeout,
    NameNotResolved,
    PeerClosed,
    PoolTimeout,
    TlsFailed,
)
from worker.runtime.http1.wire import (
    Origin,
    Target,
    check_method,
    encode_headers,
    parse_url,
    request_head,
)

__all__ = ["Answer", "Http1Client", "Resolve", "SocketFactory"]

#: host, port → the addresses to dial, in order (one lookup; the webhook sender's vets them).
Resolve = Callable[[str, int], Awaitable[Sequence[object]]]
#: address, port → an unconnected socket for it (tests see what is dialled without dialling).
SocketFactory = Callable[[str, int], socket.socket]

IDLE_S: Final = 15.0
"""An idle pooled connection older than this is closed rather than reused."""
_IDEMPOTENT: Final = frozenset({"GET", "PUT", "DELETE", "OPTIONS"})


class Answer:
    """One answer: ``status`` (100-599, never informational), ``body`` (at most the cap;
    ``truncated`` says more followed) and ``headers`` as sent, looked up case-insensitively
    (names and values decoded as UTF-8, undecodable bytes kept as surrogates)."""

    __slots__ = ("_fields", "_headers", "body", "status", "truncated")

    def __init__(
        self, status: int, fields: list[tuple[bytes, bytes]], body: bytes, truncated: bool
    ) -> None:
        self.status = status
        self.body = body
        self.truncated = truncated
        self._fields = fields
        self._headers: CIMultiDictProxy[str] | None = None

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        if self._headers is None:  # built on first use: the webhook sender rarely reads them
            self._headers = CIMultiDictProxy(
                CIMultiDict(
                    (n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
                    for n, v in self._fields
                )
            )
        return self._headers


class _Pool:
    """One origin's connections: ``idle`` (most recently used last) and ``count`` (idle, in
    use and being dialled)."""

    __slots__ = ("count", "idle")

    def __init__(self) -> None:
        self.idle: deque[Connection] = deque()
        self.count = 0


class Http1Client:
    """Requests over pooled keep-alive connections: at most ``max_connections`` open in all and
    ``max_per_host`` per origin; callers beyond wait within their connect time-out
    (``PoolTimeout`` past it: the wait was for the pool, not the peer). Each phase has its
    time-out (``connect_s``, ``headers_s``, ``body_s``), a call's ``timeout_s`` bounds them
    together, and TLS verifies the URL's host name whatever address is dialled."""

    def __init__(
        self,
        *,
        max_connections: int = 100,
        max_per_host: int = 0,
        connect_s: float = 15.0,
        headers_s: float = 15.0,
        body_s: float = 15.0,
        body_cap: int = 64 * 1024,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        resolve: Resolve | None = None,
        socket_factory: SocketFactory | None = None,
        idle_s: float = IDLE_S,
    ) -> None:
        if max_connections < 1 or max_per_host < 0 or body_cap < 0:
            raise ValueError("max_connections must be positive; max_per_host, body_cap >= 0")
        self.max_connections = max_connections
        self.max_per_host = max_per_host or max_connections
        self.connect_s, self.headers_s, self.body_s = connect_s, headers_s, body_s
        self.body_cap = body_cap
        self._defaults = encode_headers((headers or {}).items())
        self._ssl = ssl_context
        self._resolve = resolve
        self._socket_factory = socket_factory
        self._idle_s = idle_s
        self._pools: dict[Origin, _Pool] = {}
        self._waiters: deque[tuple[Origin, asyncio.Future[None]]] = deque()
        self._total = 0  # connections open or being dialled, every origin
        self._idle_total = 0
        self._closed = False

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def open_connections(self) -> int:
        """Connections open or being dialled (the pool's bound is ``max_connections``)."""
        return self._total

    async def request(
        self,
        method: str,
        url: str | Target,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        body_cap: int | None = None,
        timeout_s: float | None = None,
    ) -> Answer:
        """Send one request and read its answer, the body up to ``body_cap`` (the client's
        when None): past it the connection is dropped and the answer is ``truncated``."""
        if self._closed:
            raise RuntimeError("the HTTP client is closed")
        check_method(method)
        to = parse_url(url) if isinstance(url, str) else url
        request = request_head(method, to, self._defaults, headers, body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_s if timeout_s is not None else 86_400.0)
        cap = self.body_cap if body_cap is None else body_cap
        origin = to.origin
        for attempt in (0, 1):
            conn, reused = self._idle(origin, loop.time())
            if conn is None:
                conn, reused = await self._connect(origin, deadline)
            try:
                status, fields, content, truncated = await conn.exchange(
                    request,
                    cap=cap,
                    headers_s=self.headers_s,
                    body_s=self.body_s,
                    deadline=deadline,
                )
            except PeerClosed as exc:
                if reused and exc.before_answer and attempt == 0 and method in _IDEMPOTENT:
                    continue  # the peer had closed the idle connection: not a real attempt
                raise
            finally:
                self._release(origin, conn)
            return Answer(status, fields, content, truncated)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the pool -----------------------------------------------------------------------------
    def _idle(self, origin: Origin, now: float) -> tuple[Connection | None, bool]:
        """A live idle connection to ``origin`` (the most recently used), or None; stale
        ones (closed by the peer, or idle for ``idle_s``) are closed on the way."""
        pool = self._pools.get(origin)
        if pool is None:
            return None, False
        while pool.idle:
            conn = pool.idle.pop()
            self._idle_total -= 1
            if conn.open and now - conn.idle_since < self._idle_s:
                return conn, True
            self._discard(origin, pool, conn)
        return None, False

    async def _connect(self, origin: Origin, deadline: float) -> tuple[Connection, bool]:
        """A new connection to ``origin`` (or an idle one freed while waiting: then true) within
        the connect time-out; a time-out waiting for room is a ``PoolTimeout``."""
        loop = asyncio.get_running_loop()
        budget = max(0.0, min(self.connect_s, deadline - loop.time()))
        dialling = False
        try:
            async with asyncio.timeout(budget):
                conn = await self._room(origin)
                if conn is not None:
                    return conn, True
                dialling = True
                try:
                    return await self._dial(origin), False
                except BaseException:
                    self._forget(origin)
                    raise
        except TimeoutError:
            raise (HttpTimeout("connect") if dialling else PoolTimeout()) from None

    async def _room(self, origin: Origin) -> Connection | None:
        """Wait until a connection to ``origin`` can be opened (its slot is then reserved:
        None) or an idle one is free (returned)."""
        woken = False
        while True:
            if self._closed:
                raise RuntimeError("the HTTP client is closed")
            now = asyncio.get_running_loop().time()
            conn, _ = self._idle(origin, now)
            if conn is not None:
                return conn
            if self._idle_total:
                self._sweep(now)
            pool = self._pools.get(origin)
            if pool is None:
                pool = self._pools[origin] = _Pool()
            if pool.count < self.max_per_host and (
                self._total < self.max_connections or self._evict_idle()
            ):
                pool.count += 1
                self._total += 1
                return None
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (origin, waiter)
            if woken:
                self._waiters.appendleft(entry)  # woken, then overtaken: keep its turn
            else:
                self._waiters.append(entry)
            try:
                await waiter
            except BaseException:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # it was woken for room it will not use: pass it on
                raise
            woken = True

    def _sweep(self, now: float) -> None:
        """Close every connection idle for ``idle_s`` or closed by its peer (run only when a
        connection is about to be opened, never per call)."""
        for origin, pool in list(self._pools.items()):
            while pool.idle and (
                now - pool.idle[0].idle_since >= self._idle_s or not pool.idle[0].open
            ):
                self._idle_total -= 1
                self._discard(origin, pool, pool.idle.popleft())
            for conn in [c for c in pool.idle if not c.open]:
                pool.idle.remove(conn)
                self._idle_total -= 1
                self._discard(origin, pool, conn)

    def _evict_idle(self) -> bool:
        """Close the longest-idle connection of any origin to make room; false if none."""
        if self._idle_total == 0:
            return False
        for origin, pool in self._pools.items():
            if pool.idle:
                conn = pool.idle.popleft()
                self._idle_total -= 1
                self._discard(origin, pool, conn)
                return True
        return False  # pragma: no cover (the count says one is there)

    def _release(self, origin: Origin, conn: Connection) -> None:
        """Back to the pool when the answer was read to its end and both sides keep it
        alive; closed otherwise. Wakes a caller waiting for what was freed."""
        pool = self._pools[origin]
        if conn.reusable and conn.open and not self._closed:
            conn.idle_since = asyncio.get_running_loop().time()
            pool.idle.append(conn)
            self._idle_total += 1
        else:
            self._discard(origin, pool, conn)
        if self._waiters:
            self._wake()

    def _discard(self, origin: Origin, pool: _Pool, conn: Connection) -> None:
        conn.abort()
        self._free_slot(origin, pool)

    def _forget(self, origin: Origin) -> None:
        """Give back the slot a failed dial had reserved."""
        self._free_slot(origin, self._pools[origin])
        if self._waiters:
            self._wake()

    def _free_slot(self, origin: Origin, pool: _Pool) -> None:
        """One connection of ``origin`` fewer; an origin with none (idle ones count) goes."""
        pool.count -= 1
        self._total -= 1
        if pool.count == 0:
            del self._pools[origin]

    def _wake(self) -> None:
        """Wake the first waiting caller that can now go on (an idle connection to its
        origin, or room for a new one)."""
        full = self._total >= self.max_connections and self._idle_total == 0
        for entry in self._waiters:
            origin, waiter = entry
            pool = self._pools.get(origin)
            count = pool.count if pool is not None else 0
            if (pool is not None and pool.idle) or (count < self.max_per_host and not full):
                self._waiters.remove(entry)
                if not waiter.done():
                    waiter.set_result(None)
                return

    # -- dialling -----------------------------------------------------------------------------
    async def _dial(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        context = self._context() if origin.https else None
        last: OSError | None = None
        for address, sockaddr in await self._addresses(origin):
            if self._socket_factory is not None:
                sock = self._socket_factory(address, origin.port)
            else:
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, sockaddr)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            except BaseException:
                sock.close()
                raise
            try:
                _, conn = await loop.create_connection(
                    lambda: Connection(loop),
                    sock=sock,
                    ssl=context,
                    server_hostname=origin.host if context is not None else None,
                )
            except ssl.SSLError as exc:  # verification failures are SSLErrors too
                sock.close()
                raise TlsFailed(type(exc).__name__) from exc
            except OSError as exc:
                sock.close()
                raise DialFailed(type(exc).__name__) from exc
            except BaseException:
                sock.close()
                raise
            return conn
        raise DialFailed(type(last).__name__ if last else "no_address") from last

    async def _addresses(self, origin: Origin) -> list[tuple[str, tuple[object, ...]]]:
        """The addresses to dial, in order, each with its socket address."""
        host, port = origin.host, origin.port
        try:
            if self._resolve is not None:
                found = [str(a) for a in await self._resolve(host, port)]
            else:
                try:
                    ipaddress.ip_address(host)
                    found = [host]
                except ValueError:
                    infos = await asyncio.get_running_loop().getaddrinfo(
                        host, port, type=socket.SOCK_STREAM
                    )
                    return [(str(info[4][0]), info[4]) for info in infos]
        except OSError as exc:  # a lookup that failed; a refusal by ``resolve`` passes as is
            raise NameNotResolved(type(exc).__name__) from exc
        if not found:
            raise NameNotResolved("no_address")
        return [(a, (a, port)) for a in found]

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()  # once: loading the trust store is slow
        return self._ssl

    # -- closing ------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close every idle connection and refuse new requests; the connections in use
        close when their answer is read."""
        self._closed = True
        for pool in self._pools.values():
            while pool.idle:
                pool.idle.pop().close()
                pool.count -= 1
                self._total -= 1
        self._idle_total = 0
        self._pools = {k: p for k, p in self._pools.items() if p.count}
        while self._waiters:
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # it sees the client closed
        await asyncio.sleep(0)  # let the transports' close callbacks run

    async def close(self) -> None:
        """``aclose``, under the name other clients' sessions use."""
        await self.aclose()

    async def __aenter__(self) -> Http1Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
