"""Provider adapters: the protocol, the HTTP adapter, the registry and the error mapping; the
worker depends only on ``ProviderAdapter`` and ``ProviderError``."""

from worker.provider.answer import ProviderAnswer
from worker.provider.base import (
    CallObserver,
    CallOutcome,
    ProviderAdapter,
    ProviderAuthState,
    ProviderError,
    RetryObserver,
)
from worker.provider.breaker import (
    BREAKER_STATES,
    BreakerState,
    CircuitBreaker,
    CircuitOpenError,
)
from worker.provider.errors import map_upstream_failure
from worker.provider.failures import (
    ConnectFailed,
    ConnectionLost,
    InvalidTarget,
    TimedOut,
    TransportFailure,
)
from worker.provider.http import HttpProviderAdapter, build_http_client
from worker.provider.registry import ProviderRegistry, build_registry
from worker.provider.retry import RetryPolicy
from worker.provider.transport import AiohttpClient

__all__ = [
    "BREAKER_STATES",
    "AiohttpClient",
    "BreakerState",
    "CallObserver",
    "CallOutcome",
    "CircuitBreaker",
    "CircuitOpenError",
    "ConnectFailed",
    "ConnectionLost",
    "HttpProviderAdapter",
    "InvalidTarget",
    "ProviderAdapter",
    "ProviderAnswer",
    "ProviderAuthState",
    "ProviderError",
    "ProviderRegistry",
    "RetryObserver",
    "RetryPolicy",
    "TimedOut",
    "TransportFailure",
    "build_http_client",
    "build_registry",
    "map_upstream_failure",
]
