"""What every process exports beside its own families (``export_process_metrics``), and the
providers' circuit-breaker state gauge, read from a real registry's exposition.

The breaker is driven by real calls to the provider simulator on loopback (a ``sim-unavailable-``
account fails with 503); a fake clock stands in for the reset time, so nothing sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devstack.simulator import ProviderSimulator, running_simulator
from tests.deploy.test_metric_names import STANDARD_FAMILIES, STANDARD_LABELS
from worker import __version__
from worker.auth.metrics import WorkerMetrics
from worker.auth.provider import (
    BREAKER_STATES,
    CircuitBreaker,
    HttpProviderAdapter,
    ProviderError,
    ProviderRegistry,
    build_http_client,
)
from worker.runtime import tracing
from worker.runtime.metrics import export_process_metrics
from worker.settings import Settings

BREAKER = "passkey_auth_provider_breaker_state"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scrape(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Family name as deploy/metrics.txt spells it -> its samples (``*_created`` left out)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        out[name] = [
            (dict(s.labels), s.value) for s in family.samples if not s.name.endswith("_created")
        ]
    return out


def test_process_families_and_build_info_on_each_registry() -> None:
    """Each process builds its own registry; two in one interpreter (as the tests run them)
    each get the full set, and nothing else."""
    for service in (tracing.SERVICE_WORKER, tracing.SERVICE_API):
        registry = CollectorRegistry()
        export_process_metrics(registry, service)
        families = scrape(registry)
        assert set(families) == STANDARD_FAMILIES | {"passkey_build_info"}
        assert families["passkey_build_info"] == [({"service": service, "version": __version__}, 1)]
        labels = {k for name in STANDARD_FAMILIES for ls, _ in families[name] for k in ls}
        assert labels == STANDARD_LABELS
        [(_, rss)] = families["process_resident_memory_bytes"]
        assert rss > 0
        generations = {ls["generation"] for ls, _ in families["python_gc_collections_total"]}
        assert generations == {"0", "1", "2"}


@pytest.fixture
async def simulator_url() -> AsyncIterator[str]:
    simulator = ProviderSimulator(latency_ms=0.0, jitter_ms=0.0)
    async with running_simulator(simulator) as url:
        yield url


def states(registry: CollectorRegistry) -> dict[str, dict[str, float]]:
    """provider -> state -> value of the breaker gauge."""
    out: dict[str, dict[str, float]] = {}
    for labels, value in scrape(registry)[BREAKER]:
        out.setdefault(labels["provider"], {})[labels["state"]] = value
    return out


def only(state: str) -> dict[str, float]:
    return {s: 1.0 if s == state else 0.0 for s in BREAKER_STATES}


async def test_breaker_state_follows_the_provider(simulator_url: str) -> None:
    clock = FakeClock()
    async with build_http_client(Settings(provider_timeout_s=5.0)) as client:
        down = HttpProviderAdapter(
            "down",
            simulator_url,
            client,
            max_attempts=1,
            breaker=CircuitBreaker(threshold=2, reset_s=10.0, clock=clock),
        )
        healthy = HttpProviderAdapter(
            "healthy",
            simulator_url,
            client,
            breaker=CircuitBreaker(threshold=2, reset_s=10.0, clock=clock),
        )
        unguarded = HttpProviderAdapter("unguarded", simulator_url, client)  # breaker=None
        providers = ProviderRegistry([down, healthy, unguarded])
        registry = CollectorRegistry()
        WorkerMetrics(registry).export_breakers(providers.breakers)

        # Every state of every guarded provider is a series from the start; an adapter
        # without a breaker has none.
        assert states(registry) == {"down": only("closed"), "healthy": only("closed")}

        for _ in range(2):
            with pytest.raises(ProviderError):
                await down.get_auth_state("sim-unavailable-acct")
        assert states(registry) == {"down": only("open"), "healthy": only("closed")}

        clock.now += 10.0  # read at scrape time: the reset time passing shows without a call
        assert states(registry)["down"] == only("half_open")

        state = await down.get_auth_state("acct-recovered")  # the probe succeeds
        assert state.status
        assert states(registry) == {"down": only("closed"), "healthy": only("closed")}
        await providers.aclose()
