"""The provider client's own failures (no readable HTTP answer), so the error table depends on
no HTTP library; ``transient`` says whether the same request may succeed a moment later."""

from __future__ import annotations

from typing import ClassVar, Literal

__all__ = [
    "ConnectFailed",
    "ConnectionLost",
    "InvalidTarget",
    "TimedOut",
    "TransportFailure",
]


class TransportFailure(Exception):
    """No usable HTTP answer; the base of the others, and itself any failure not listed."""

    transient: ClassVar[bool] = False


class ConnectFailed(TransportFailure):
    """No connection: refused, unreachable, the name did not resolve, the TLS handshake failed."""

    transient = True


class TimedOut(TransportFailure):
    """A phase outlasted its timeout (``PROVIDER_TIMEOUT_S``, ``PROVIDER_<NAME>_*``)."""

    transient = True

    def __init__(self, message: str, *, phase: Literal["connect", "read"]) -> None:
        super().__init__(message)
        self.phase = phase


class ConnectionLost(TransportFailure):
    """The connection broke mid-exchange: the peer hung up, reset it, or cut the body short."""

    transient = True


class InvalidTarget(TransportFailure):
    """The URL cannot be requested (malformed, or a scheme the client does not speak)."""
