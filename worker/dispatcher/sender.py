"""One webhook attempt over the process's HTTP/1.1 client (``worker.runtime.http1``), to
vetted addresses only (one lookup, no rebinding), never raising, with the receiver bounded
(docs/architecture.md, "Webhook fan-out", SSRF; "Bounded remote answers")."""

from __future__ import annotations

import functools
import ssl
import time
import weakref
from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from worker.contract.delivery_log import AttemptRecord, excerpt
from worker.contract.messages import rfc3339
from worker.dispatcher.delivery import DEFAULT_SCHEDULE_S, DeliveryResult
from worker.runtime.admission import NoRoom
from worker.runtime.http1 import (
    DialFailed,
    Http1Client,
    HttpError,
    HttpTimeout,
    NameNotResolved,
    PeerClosed,
    PoolTimeout,
    ProtocolError,
    SocketFactory,
    Target,
    TlsFailed,
    target,
)
from worker.runtime.logs import get_logger
from worker.runtime.retry_after import parse_retry_after
from worker.webhooks.lookup import Lookup, system_lookup
from worker.webhooks.targets import (
    BlockedTarget,
    TargetPolicy,
    resolve_target,
    validate_url,
)

__all__ = [
    "DEFAULT_BODY_CAP",
    "DEFAULT_RETRY_AFTER_MAX_S",
    "DEFAULT_TIMEOUT_S",
    "DeliveryResult",
    "ErrorKind",
    "Sender",
    "attempt_record",
    "open_session",
]

log = get_logger(__name__)

DEFAULT_TIMEOUT_S: Final = 15.0
DEFAULT_BODY_CAP: Final = 4096
DEFAULT_RETRY_AFTER_MAX_S: Final = max(DEFAULT_SCHEDULE_S)
_RETRY_AFTER_STATUSES: Final = frozenset({429, 503})
_WHOLE_ATTEMPT_S: Final = 24 * 3600.0
TARGETS_KEPT: Final = 1024
"""Endpoint URLs a ``Sender`` keeps vetted and parsed (each at most ``MAX_URL_LENGTH``)."""
DEFAULT_HEADERS: Final = {"User-Agent": "passkey-auth-worker-webhooks", "Accept": "*/*"}
"""Sent with every attempt besides the caller's. No ``Accept-Encoding``: the body is kept as
sent, so the receiver is not invited to compress it."""


class ErrorKind(StrEnum):
    """Why no HTTP status came back (``DeliveryResult.error``); compares equal to its value."""

    BLOCKED = "blocked"  # the policy refused the URL or an address (``detail``: the reason)
    DNS = "dns"  # the name did not resolve
    CONNECT = "connect"  # refused, unreachable, reset while connecting
    TLS = "tls"  # handshake or certificate verification failed
    TIMEOUT = "timeout"  # the attempt's total time ran out
    PROTOCOL = "protocol"  # the peer disconnected or answered something not HTTP
    INTERNAL = "internal"  # the attempt raised something unforeseen (``detail``: its type)
    # No connection or lookup thread of ours for it (the pool's wait ran out, or the rule gave
    # its workspace no thread): nothing reached the receiver, so it is not the receiver's
    # failure; the dispatcher defers the attempt (``retry_after_s``: when to look again).
    CAPACITY = "capacity"


# Clients built by ``open_session``, with their policy: ``Sender`` refuses any other,
# since a plain client would dial whatever DNS says.
_VETTED: weakref.WeakKeyDictionary[Http1Client, TargetPolicy] = weakref.WeakKeyDictionary()


def open_session(
    policy: TargetPolicy,
    *,
    lookup: Lookup = system_lookup,
    max_connections: int = 100,
    max_connections_per_host: int = 10,
    ssl_context: ssl.SSLContext | None = None,
    socket_factory: SocketFactory | None = None,
) -> Http1Client:
    """The dispatcher's one pooled client (its owner closes it), dialling vetted addresses
    only: a new connection looks the name up once and dials only what the policy accepted, TLS
    verifying the URL's name (no rebinding between the check and the dial). ``ssl_context``
    replaces the trust store (verification stays on); ``socket_factory(address, port)`` makes
    the sockets (tests). No proxy is ever used, no cookie kept, no body decoded."""
    client = Http1Client(
        max_connections=max_connections,
        max_per_host=max_connections_per_host,
        # no limit per phase: the attempt's time-out (``Sender``) bounds them all together
        connect_s=_WHOLE_ATTEMPT_S,
        headers_s=_WHOLE_ATTEMPT_S,
        body_s=_WHOLE_ATTEMPT_S,
        body_cap=DEFAULT_BODY_CAP,
        headers=DEFAULT_HEADERS,
        ssl_context=ssl_context,
        resolve=functools.partial(resolve_target, policy=policy, lookup=lookup),
        socket_factory=socket_factory,
    )
    _VETTED[client] = policy
    return client


class Sender:
    """POSTs one signed webhook and reports what happened (``DeliveryResult``)."""

    def __init__(
        self,
        session: Http1Client,
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
        # URL → its vetted, parsed target: ``validate_url`` is pure (no DNS), and the same
        # few endpoint URLs come back delivery after delivery. Refused URLs are not kept.
        self._targets: dict[str, Target] = {}
        self._timeout_s = timeout_s
        self._body_cap = body_cap
        self._retry_after_max_s = retry_after_max_s

    def _vetted(self, url: str) -> Target:
        """``url`` checked by ``validate_url`` (``BlockedTarget`` when refused) and parsed for
        the client from what it parsed, not parsed again; the last ``TARGETS_KEPT`` kept."""
        vetted = validate_url(url, self._policy)
        to = target(
            vetted.scheme,
            vetted.raw_host or "",
            vetted.port or 0,
            vetted.raw_path_qs,
            vetted.raw_authority,
        )
        if len(self._targets) >= TARGETS_KEPT:
            del self._targets[next(iter(self._targets))]  # the oldest first
        self._targets[url] = to
        return to

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> DeliveryResult:
        """One attempt, bounded by the sender's ``timeout_s`` in total."""
        started = time.monotonic()
        try:
            to = self._targets.get(url)
            if to is None:
                to = self._vetted(url)
            answer = await self._session.request(
                "POST",
                to,
                headers=headers,
                body=body,
                body_cap=self._body_cap,
                timeout_s=self._timeout_s,
            )
        except BlockedTarget as exc:
            return _failure(started, ErrorKind.BLOCKED, exc.reason)
        except PoolTimeout as exc:
            return _failure(started, ErrorKind.CAPACITY, exc.reason)
        except NoRoom as exc:
            return _failure(started, ErrorKind.CAPACITY, exc.pool, float(exc.retry_after_s))
        except HttpError as exc:
            return _failure(started, *_error_kind(exc))
        except OSError as exc:
            return _failure(started, ErrorKind.CONNECT, type(exc).__name__)
        except Exception as exc:
            # One receiver's answer must not reach the dispatcher's loop, whatever it broke:
            # the attempt failed, and is retried on the schedule like any other failure.
            log.warning("webhook_attempt_raised", error=type(exc).__name__)
            return _failure(started, ErrorKind.INTERNAL, type(exc).__name__)
        retry_after = None
        if answer.status in _RETRY_AFTER_STATUSES:
            retry_after = parse_retry_after(
                answer.headers.get("Retry-After"), max_s=self._retry_after_max_s
            )
        return DeliveryResult(
            status=answer.status,
            elapsed_s=time.monotonic() - started,
            retry_after_s=retry_after,
            body=answer.body,
            truncated=answer.truncated,
        )


def _failure(
    started: float, kind: ErrorKind, detail: str, retry_after_s: float | None = None
) -> DeliveryResult:
    return DeliveryResult(
        status=None,
        elapsed_s=time.monotonic() - started,
        error=kind,
        detail=detail,
        retry_after_s=retry_after_s,
    )


def _error_kind(exc: HttpError) -> tuple[ErrorKind, str]:
    """Which ``ErrorKind`` a failure of the client is, and its detail."""
    if isinstance(exc, NameNotResolved):
        return ErrorKind.DNS, exc.reason
    if isinstance(exc, TlsFailed):  # before DialFailed: it is one
        return ErrorKind.TLS, exc.reason
    if isinstance(exc, DialFailed):
        return ErrorKind.CONNECT, exc.reason
    if isinstance(exc, HttpTimeout):
        return ErrorKind.TIMEOUT, exc.reason
    if isinstance(exc, ProtocolError | PeerClosed):
        return ErrorKind.PROTOCOL, exc.reason
    return ErrorKind.INTERNAL, exc.reason  # InvalidRequest: a header of ours is refused


def attempt_record(
    started_at: float, answer: DeliveryResult | None, error_kind: str | None = None
) -> AttemptRecord:
    """The record of one attempt from what the sender answered (``None``: the attempt
    raised before an answer, ``error_kind`` says how)."""
    if answer is None:
        return AttemptRecord(at=rfc3339(started_at), error_kind=error_kind)
    text, cut = excerpt(answer.body, truncated=answer.truncated)
    return AttemptRecord(
        at=rfc3339(started_at),
        status=answer.status,
        latency_ms=max(0, round(answer.elapsed_s * 1000)),
        response_excerpt=text or None,
        response_truncated=cut,
        error_kind=None if answer.error is None else str(answer.error)[:64],
    )
