"""Why an HTTP/1.1 exchange gave no answer, one class per cause, so each caller maps causes without
reading messages; none is an ``OSError``, so a caller tells them from its own."""

from __future__ import annotations

from typing import Literal

__all__ = [
    "DialFailed",
    "HttpError",
    "HttpTimeout",
    "InvalidRequest",
    "NameNotResolved",
    "PeerClosed",
    "PoolTimeout",
    "ProtocolError",
    "TlsFailed",
]


class HttpError(Exception):
    """No usable answer. ``reason`` is short, stable and secret-free (no URL, no header)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidRequest(HttpError):
    """Our call cannot be sent: not an http(s) URL, a header with CR/LF/NUL or a framing
    header the client owns, a method it does not speak. Nothing was sent."""


class NameNotResolved(HttpError):
    """The host name gave no address (the resolver raised an ``OSError``)."""


class DialFailed(HttpError):
    """No connection: refused, unreachable, reset while connecting. ``reason`` is the
    ``OSError``'s type name (``ConnectionRefusedError``)."""


class TlsFailed(DialFailed):
    """The TLS handshake or the certificate's verification against the URL's name failed."""


class HttpTimeout(HttpError):
    """A phase outlasted its time-out, or the call its deadline: ``connect`` (waiting for a
    pooled connection, the lookup, TCP and TLS), ``headers`` (after the request was written)
    or ``body``."""

    def __init__(self, phase: Literal["connect", "headers", "body"]) -> None:
        super().__init__(f"{phase}_timed_out")
        self.phase = phase


class PoolTimeout(HttpTimeout):
    """The connect time-out ran out waiting for the client's own pool: nothing was dialled, so
    it says nothing of the peer (the webhook sender tells it from a receiver's failure)."""

    def __init__(self) -> None:
        super().__init__("connect")
        self.reason = "pool_wait_timed_out"
        self.args = (self.reason,)


class PeerClosed(HttpError):
    """The connection closed or broke before the answer was complete. ``before_answer``: not
    one byte of an answer had arrived (the only case a reused connection may be retried)."""

    def __init__(self, reason: str, *, before_answer: bool) -> None:
        super().__init__(reason)
        self.before_answer = before_answer


class ProtocolError(HttpError):
    """The peer answered something that is not an acceptable HTTP/1.1 answer. ``in_body``:
    the status line and headers were fine and the body's framing was not (a bad chunk)."""

    def __init__(self, reason: str, *, in_body: bool = False) -> None:
        super().__init__(reason)
        self.in_body = in_body
