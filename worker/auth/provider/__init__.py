"""Provider adapters: the protocol, the HTTP adapter, the registry and the error mapping; the
worker depends only on ``ProviderAdapter`` and ``ProviderError``."""

from worker.auth.provider.answer import ProviderAnswer
from worker.auth.provider.base import (
    CallObserver,
    CallOutcome,
    ProviderAdapter,
    ProviderAuthState,
    ProviderError,
    RetryObserver,
)
from worker.auth.provider.breaker import (
    BREAKER_STATES,
    BreakerState,
    CircuitBreaker,
    CircuitOpenError,
)
from worker.auth.provider.errors import map_upstream_failure
from worker.auth.provider.failures import (
    ConnectFailed,
    ConnectionLost,
    InvalidTarget,
    TimedOut,
    TransportFailure,
)
from worker.auth.provider.http import HttpProviderAdapter, build_http_client
from worker.auth.provider.registry import ProviderRegistry, build_registry
from worker.auth.provider.retry import RetryPolicy
from worker.auth.provider.transport import ProviderHttpClient

__all__ = [
    "BREAKER_STATES",
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
    "ProviderHttpClient",
    "ProviderRegistry",
    "RetryObserver",
    "RetryPolicy",
    "TimedOut",
    "TransportFailure",
    "build_http_client",
    "build_registry",
    "map_upstream_failure",
]
