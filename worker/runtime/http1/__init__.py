"""The outbound HTTP/1.1 client both the provider client and the webhook sender are built on
(docs/architecture.md, "Outbound HTTP")."""

from worker.runtime.http1.client import Answer, Http1Client, Resolve, SocketFactory
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
from worker.runtime.http1.wire import Origin, Target, parse_url, target

__all__ = [
    "HEAD_CAP",
    "Answer",
    "DialFailed",
    "Http1Client",
    "HttpError",
    "HttpTimeout",
    "InvalidRequest",
    "NameNotResolved",
    "Origin",
    "PeerClosed",
    "PoolTimeout",
    "ProtocolError",
    "Resolve",
    "SocketFactory",
    "Target",
    "TlsFailed",
    "parse_url",
    "target",
]
