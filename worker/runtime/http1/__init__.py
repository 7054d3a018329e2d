"""The outbound HTTP/1.1 client both the provider client and the webhook sender are built on
(docs/architecture.md, "Outbound HTTP")."""

from worker.runtime.http1 import errors
from worker.runtime.http1.client import Http1Client, SocketFactory
from worker.runtime.http1.connection import HEAD_CAP
from worker.runtime.http1.errors import *  # noqa: F403 (every cause, as ``errors.__all__`` names)
from worker.runtime.http1.wire import Target, target

__all__ = ["HEAD_CAP", "Http1Client", "SocketFactory", "Target", "target"]
__all__ += errors.__all__
