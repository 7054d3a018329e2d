"""One webhook attempt over aiohttp, to vetted addresses only (one lookup, no rebinding),
never raising, with the receiver bounded (docs/architecture.md, "Webhook fan-out", SSRF;
"Bounded remote answers")."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.connector import SocketFactoryType
from yarl import URL

from worker.runtime.logs import get_logger
from worker.runtime.retry_after import parse_retry_after
from worker.webhooks.delivery import DEFAULT_SCHEDULE_S
from worker.webhooks.lookup import Lookup, system_lookup
from worker.webhooks.targets import BlockedTarget, TargetPolicy, resolve_target, validate_url

__all__ = [
    "DEFAULT_BODY_CAP",
    "DEFAULT_RETRY_AFTER_MAX_S",
    "DEFAULT_TIMEOUT_S",
    "DeliveryResult",
    "ErrorKind",
    "Sender",
    "VettingResolver",
    "open_session",
]

log = get_logger(__name__)

DEFAULT_TIMEOUT_S: Final = 15.0
DEFAULT_BODY_CAP: Final = 4096
DEFAULT_RETRY_AFTER_MAX_S: Final = max(DEFAULT_SCHEDULE_S)
_RETRY_AFTER_STATUSES: Final = frozenset({429, 503})


class ErrorKind(StrEnum):
    """Why no HTTP status came back (``DeliveryResult.error``); compares equal to its value."""

    BLOCKED = "blocked"  # the policy refused the URL or an address (``detail``: the reason)
    DNS = "dns"  # the name did not resolve
    CONNECT = "connect"  # refused, unreachable, reset while connecting
    TLS = "tls"  # handshake or certificate verification failed
    TIMEOUT = "timeout"  # the attempt's total time ran out
    PROTOCOL = "protocol"  # the peer disconnected or answered something not HTTP
    INTERNAL = "internal"  # the attempt raised something unforeseen (``detail``: its type)


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """The outcome of one attempt: a status, or an ``error`` kind, never both.

    ``body`` is at most the sender's cap (``truncated`` says whether more was sent);
    ``retry_after_s`` is the answer's ``Retry-After`` for 429 and 503, in seconds from now,
    at most the sender's ``retry_after_max_s``;
    ``detail`` is a short, secret-free explanation (a block reason or an exception type).
    """

    status: int | None
    elapsed_s: float
    error: ErrorKind | None = None
    detail: str | None = None
    retry_after_s: float | None = None
    body: bytes = b""
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """A 2xx answer: the only kind of success in the Standard Webhooks sense."""
        return self.status is not None and 200 <= self.status < 300


class VettingResolver(AbstractResolver):
    """An aiohttp resolver that returns only addresses the policy accepts.

    ``lookup`` is injectable so tests can answer differently on each call (rebinding)
    without a DNS server.
    """

    def __init__(self, policy: TargetPolicy, lookup: Lookup = system_lookup) -> None:
        self._policy = policy
        self._lookup = lookup

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = await resolve_target(host, port, self._policy, self._lookup)
        results: list[ResolveResult] = []
        for ip in addresses:
            ip_family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
            if family not in (socket.AF_UNSPEC, ip_family):
                continue
            results.append(
                ResolveResult(
                    hostname=host,
                    host=str(ip),
                    port=port,
                    family=ip_family,
                    proto=0,
                    flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
                )
            )
        if not results:
            raise OSError(f"no address of the requested family for {host!r}")
        return results

    async def close(self) -> None:
        """Nothing to release: the lookup owns no resources."""


# Sessions built by ``open_session``, with their policy: ``Sender`` refuses any other,
# since a plain session would dial whatever DNS says.
_VETTED: weakref.WeakKeyDictionary[aiohttp.ClientSession, TargetPolicy] = (
    weakref.WeakKeyDictionary()
)


def open_session(
    policy: TargetPolicy,
    *,
    lookup: Lookup = system_lookup,
    max_connections: int = 100,
    max_connections_per_host: int = 10,
    ssl_context: ssl.SSLContext | None = None,
    socket_factory: SocketFactoryType | None = None,
) -> aiohttp.ClientSession:
    """The dispatcher's one pooled session (its owner closes it), dialling vetted addresses only.

    Call inside the running event loop. ``ssl_context`` replaces the default trust store
    (certificate and hostname verification stay on); ``socket_factory`` is aiohttp's hook
    for creating the sockets (tests use it to see what is dialled without dialling).
    """
    connector = aiohttp.TCPConnector(
        resolver=VettingResolver(policy, lookup),
        limit=max_connections,
        limit_per_host=max_connections_per_host,
        ssl=ssl_context if ssl_context is not None else True,
        socket_factory=socket_factory,
    )
    session = aiohttp.ClientSession(
        connector=connector,
        trust_env=False,  # no HTTP(S)_PROXY: a proxy would reach the target unvetted
        cookie_jar=aiohttp.DummyCookieJar(),  # integrators must not share state through us
        auto_decompress=False,  # the capped body is kept as sent; no decompression bombs
        headers={"User-Agent": "passkey-auth-worker-webhooks"},
    )
    _VETTED[session] = policy
    return session


class Sender:
    """POSTs one signed webhook and reports what happened (``DeliveryResult``)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        body_cap: int = DEFAULT_BODY_CAP,
        retry_after_max_s: float = DEFAULT_RETRY_AFTER_MAX_S,
    ) -> None:
        policy = _VETTED.get(session)
        if policy is None:
            raise ValueError("the session must come from open_session (it vets addresses)")
        if timeout_s <= 0 or body_cap < 0 or not 0 <= retry_after_max_s < float("inf"):
            raise ValueError(
                "timeout_s must be positive, body_cap and retry_after_max_s finite, not negative"
            )
        self._session = session
        self._policy = policy
        self._timeout_s = timeout_s
        self._body_cap = body_cap
        self._retry_after_max_s = retry_after_max_s

    @property
    def policy(self) -> TargetPolicy:
        return self._policy

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float | None = None,
    ) -> DeliveryResult:
        """One attempt, bounded by ``timeout_s`` (the sender's default when None) in total."""
        started = time.monotonic()
        limit = self._timeout_s if timeout_s is None else timeout_s
        try:
            target = validate_url(url, self._policy)
            async with asyncio.timeout(limit):
                return await self._attempt(target, body, headers, started, limit)
        except BlockedTarget as exc:
            return _failure(started, ErrorKind.BLOCKED, exc.reason)
        except (aiohttp.ClientError, OSError) as exc:  # TimeoutError is an OSError
            blocked = _blocked_cause(exc)
            if blocked is not None:
                return _failure(started, ErrorKind.BLOCKED, blocked.reason)
            return _failure(started, _error_kind(exc), type(exc).__name__)
        except Exception as exc:
            # One receiver's answer must not reach the dispatcher's loop, whatever it broke:
            # the attempt failed, and is retried on the schedule like any other failure.
            log.warning("webhook_attempt_raised", error=type(exc).__name__)
            return _failure(started, ErrorKind.INTERNAL, type(exc).__name__)

    async def _attempt(
        self,
        target: URL,
        body: bytes,
        headers: Mapping[str, str],
        started: float,
        limit: float,
    ) -> DeliveryResult:
        async with self._session.post(
            target,  # the URL validate_url parsed, not parsed again
            data=body,
            headers=dict(headers),
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=limit),
            read_bufsize=max(self._body_cap, 1024),
        ) as answer:
            if not 100 <= answer.status <= 599:  # three digits, yet no HTTP status (RFC 9110)
                answer.close()
                return _failure(started, ErrorKind.PROTOCOL, "status_out_of_range")
            content, truncated = await _read_capped(answer, self._body_cap)
            if truncated:
                answer.close()  # drop the connection rather than drain what we will not read
            retry_after = None
            if answer.status in _RETRY_AFTER_STATUSES:
                retry_after = parse_retry_after(
                    answer.headers.get("Retry-After"), max_s=self._retry_after_max_s
                )
            return DeliveryResult(
                status=answer.status,
                elapsed_s=time.monotonic() - started,
                retry_after_s=retry_after,
                body=content,
                truncated=truncated,
            )


async def _read_capped(answer: aiohttp.ClientResponse, cap: int) -> tuple[bytes, bool]:
    """At most ``cap`` bytes of the body, and whether more followed."""
    chunks: list[bytes] = []
    size = 0
    while size < cap:
        chunk = await answer.content.read(cap - size)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)
        size += len(chunk)
    more = not answer.content.at_eof() and bool(await answer.content.read(1))
    return b"".join(chunks), more


def _failure(started: float, kind: ErrorKind, detail: str) -> DeliveryResult:
    return DeliveryResult(
        status=None, elapsed_s=time.monotonic() - started, error=kind, detail=detail
    )


def _blocked_cause(exc: BaseException) -> BlockedTarget | None:
    """The ``BlockedTarget`` raised by the resolver, however aiohttp wrapped it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, BlockedTarget):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _error_kind(exc: BaseException) -> ErrorKind:
    """Which ``ErrorKind`` a network exception is (order matters: subclasses first)."""
    if isinstance(exc, TimeoutError):  # includes aiohttp's ServerTimeoutError and friends
        return ErrorKind.TIMEOUT
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return ErrorKind.DNS
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        return ErrorKind.TLS
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ErrorKind.CONNECT
    if isinstance(
        exc,
        aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError,
    ):
        return ErrorKind.PROTOCOL
    return ErrorKind.CONNECT
