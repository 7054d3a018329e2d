"""The outbound HTTP/1.1 client both the provider client and the webhook sender are built on
(docs/architecture.md, "Outbound HTTP")."""

from worker.runtime.http1.client import Http1Client, SocketFactory
from worker.runtime.http1.connection import HEAD_CAP
from worker.runtime.http1.errors import (
    DialFailed,
    HttpError,
    HttpTimeout,
    InvalidRequest,
    NameNotResolved,
    PeerClosed,
    PoolTimeout,
    ProtocolError,
    TlsFailed,
)
from worker.runtime.http1.wire import Target, target

__all__ = [
    "HEAD_CAP",
    "DialFailed",
    "Http1Client",
    "HttpError",
    "HttpTimeout",
    "InvalidRequest",
    "NameNotResolved",
    "PeerClosed",
    "PoolTimeout",
    "ProtocolError",
    "SocketFactory",
    "Target",
    "TlsFailed",
    "target",
]
