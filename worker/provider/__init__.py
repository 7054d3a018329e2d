"""Provider adapters: the protocol, the HTTP adapter, the registry, and the simulator.

The worker depends on ``ProviderAdapter`` and ``ProviderError`` only; which provider answers,
and how its failures map to catalogued errors, stays inside this package.
"""

from worker.provider.base import (
    CallObserver,
    CallOutcome,
    ProviderAdapter,
    ProviderAuthState,
    ProviderError,
    RetryObserver,
)
from worker.provider.breaker import BreakerState, CircuitBreaker, CircuitOpenError
from worker.provider.errors import map_upstream_failure
from worker.provider.http import (
    HttpProviderAdapter,
    ProviderHttpClient,
    ShardedClient,
    build_http_client,
)
from worker.provider.registry import ProviderRegistry, build_registry
from worker.provider.retry import RetryPolicy
from worker.provider.simulator import (
    InProcessProvider,
    ProviderSimulator,
    build_simulator_app,
    running_simulator,
    serve_simulator,
)
from worker.provider.transport import AiohttpClient

__all__ = [
    "AiohttpClient",
    "BreakerState",
    "CallObserver",
    "CallOutcome",
    "CircuitBreaker",
    "CircuitOpenError",
    "HttpProviderAdapter",
    "InProcessProvider",
    "ProviderAdapter",
    "ProviderAuthState",
    "ProviderError",
    "ProviderHttpClient",
    "ProviderRegistry",
    "ProviderSimulator",
    "RetryObserver",
    "RetryPolicy",
    "ShardedClient",
    "build_http_client",
    "build_registry",
    "build_simulator_app",
    "map_upstream_failure",
    "running_simulator",
    "serve_simulator",
]
