"""Provider adapters by name: a read-only mapping the decision policy and the executor use
without knowing how adapters are built."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from worker.auth.provider.base import CallObserver, ProviderAdapter, RetryObserver
from worker.auth.provider.breaker import CircuitBreaker
from worker.auth.provider.credentials import Credential, client_tls
from worker.auth.provider.http import HttpProviderAdapter, Requester, build_http_client
from worker.auth.provider.transport import ProviderHttpClient

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["ProviderRegistry", "build_registry"]


class ProviderRegistry(Mapping[str, ProviderAdapter]):
    """Immutable name → adapter map; ``get(name)`` returns the adapter or None."""

    def __init__(
        self,
        adapters: Iterable[ProviderAdapter] = (),
        *,
        clients: Iterable[ProviderHttpClient] = (),
    ) -> None:
        self._clients = tuple(clients)
        self._adapters: dict[str, ProviderAdapter] = {}
        for adapter in adapters:
            if adapter.name in self._adapters:
                raise ValueError(f"two provider adapters are named {adapter.name!r}")
            self._adapters[adapter.name] = adapter

    def __getitem__(self, name: str) -> ProviderAdapter:
        return self._adapters[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._adapters)

    def __len__(self) -> int:
        return len(self._adapters)

    def breakers(self) -> Iterator[tuple[str, CircuitBreaker]]:
        """``(provider name, breaker)`` of each HTTP adapter that has a circuit breaker (all of
        those ``build_registry`` builds), read at call time."""
        for name, adapter in self._adapters.items():
            if isinstance(adapter, HttpProviderAdapter) and adapter.breaker is not None:
                yield name, adapter.breaker

    async def aclose(self) -> None:
        """Close every adapter and the clients the registry built for single providers. The
        shared HTTP client is the caller's to close, after this."""
        for adapter in self._adapters.values():
            await adapter.aclose()
        for client in self._clients:
            await client.aclose()

    def __repr__(self) -> str:
        return f"ProviderRegistry({sorted(self._adapters)!r})"


def build_registry(
    settings: Settings,
    client: Requester,
    *,
    on_call: CallObserver | None = None,
    on_retry: RetryObserver | None = None,
) -> ProviderRegistry:
    """One HTTP adapter (with its own circuit breaker and credential) per entry of
    ``PROVIDER_URLS``; a provider with TLS material or timeouts of its own gets its own client,
    which the registry closes."""
    adapters: list[HttpProviderAdapter] = []
    owned: list[ProviderHttpClient] = []  # open no connection until their first request
    for name, url in settings.provider_urls.items():
        connection = settings.provider_connection(name)
        credential = Credential.for_provider(name, connection)
        requester: Requester = client
        if connection.needs_own_client:
            own = build_http_client(
                settings,
                tls=client_tls(name, connection),
                timeout_s=connection.timeout_s,
                connect_timeout_s=connection.connect_timeout_s,
            )
            owned.append(own)
            requester = own
        adapters.append(
            HttpProviderAdapter.from_settings(
                name,
                url,
                requester,
                settings,
                on_call=on_call,
                on_retry=on_retry,
                credential=credential,
            )
        )
    return ProviderRegistry(adapters, clients=owned)
