"""``make run``: the whole system on one machine for development.

Embedded broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` is set), topics, provider simulator, one
worker and the front-end, all in this process tree; Ctrl-C stops them in reverse order.
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from worker.broker import EmbeddedBroker
from worker.demo import register_accounts
from worker.kafka import ensure_topics
from worker.logs import get_logger
from worker.settings import Settings

log = get_logger(__name__)

DEMO_WORKSPACE = "ws_demo"
DEMO_KEY = "dev-key-ws-demo"


def demo_account_refs(n: int) -> list[tuple[str, str]]:
    """(account_id, provider_account_ref): ``n`` happy accounts plus scripted faults."""
    accounts = [(f"acc_demo_{i}", f"demo-{i}") for i in range(1, n + 1)]
    accounts += [
        ("acc_demo_unavailable", "sim-unavailable-demo"),
        ("acc_demo_mismatch", "sim-mismatch-demo"),
        ("acc_demo_fail", "sim-fail-demo"),
    ]
    return accounts


async def run_stack(settings: Settings, *, demo_accounts: int = 5) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    broker: EmbeddedBroker | None = None
    if settings.kafka_bootstrap_servers is None:
        broker = EmbeddedBroker(port=settings.embedded_broker_port).start()
    tasks: list[asyncio.Task[Any]] = []
    try:
        await ensure_topics(settings)
        keys_dir = Path(tempfile.mkdtemp(prefix="passkey-stack-"))
        settings = _with_dev_keys(settings, keys_dir)
        tasks.append(_task("simulator", _simulator(settings)))
        from worker.app import run_worker

        tasks.append(_task("worker", run_worker(settings, stop=stop, install_signals=False)))
        api = _api(settings, stop)
        tasks.append(_task("api", api))
        accounts = demo_account_refs(demo_accounts)
        await register_accounts(settings, DEMO_WORKSPACE, accounts)
        _banner(settings, accounts)
        done, _ = await asyncio.wait(
            [*tasks, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        for task in done:
            if task in tasks and task.exception() is not None:
                log.error("stack_component_failed", component=task.get_name())
    finally:
        # Reverse order of dependencies: the front-end and the worker drain first (the worker
        # may still need the simulator and the broker), then the simulator, then the broker.
        stop.set()
        graceful = [t for t in tasks if t.get_name() in ("api", "worker")]
        results = await asyncio.gather(*graceful, return_exceptions=True)
        for task in tasks:
            task.cancel()
        results += await asyncio.gather(
            *(t for t in tasks if t not in graceful), return_exceptions=True
        )
        for task, result in zip(
            [*graceful, *(t for t in tasks if t not in graceful)], results, strict=True
        ):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("stack_component_error", component=task.get_name(), error=repr(result))
        if broker is not None:
            broker.stop()
        print("stack stopped", flush=True)


def _task(name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    return asyncio.create_task(coro, name=name)


async def _simulator(settings: Settings) -> None:
    from worker.provider.simulator import serve_simulator

    await serve_simulator(settings)


def _api(settings: Settings, stop: asyncio.Event) -> Coroutine[Any, Any, None]:
    from worker.api.app import serve_api

    return serve_api(settings, install_signals=False, stop=stop)


def _with_dev_keys(settings: Settings, directory: Path) -> Settings:
    if settings.api_keys_file is not None:
        return settings
    from worker.api.keys import dev_keys_file

    path = dev_keys_file(directory / "api-keys.json")
    return settings.model_copy(update={"api_keys_file": path})


def _banner(settings: Settings, accounts: list[tuple[str, str]]) -> None:
    lines = [
        "",
        "passkey auth-flow stack is up",
        f"  kafka bootstrap   {settings.bootstrap}",
        f"  provider sim      http://{settings.simulator_host}:{settings.simulator_port}",
        f"  worker probes     http://{settings.worker_metrics_host}:{settings.worker_metrics_port}"
        "/metrics  /healthz  /readyz",
    ]
    base = f"http://{settings.api_host}:{settings.api_port}"
    lines += [
        f"  API front-end     {base}  (workspace {DEMO_WORKSPACE}, key {DEMO_KEY})",
        "",
        "try a flow:",
        f"  curl -s -X POST -H 'X-Api-Key: {DEMO_KEY}' "
        f"{base}/v1/accounts/{accounts[0][0]}/auth/passkey-confirm",
        f"  curl -s -H 'X-Api-Key: {DEMO_KEY}' {base}/v1/accounts/{accounts[0][0]}/auth",
    ]
    lines += [
        "",
        "or straight through Kafka:",
        f"  python -m worker demo confirm {accounts[1][0] if len(accounts) > 1 else 'acc'}",
        "demo accounts (status passkey_confirmation): "
        + ", ".join(a for a, _ in accounts[:8])
        + (f" … ({len(accounts)} in all)" if len(accounts) > 8 else ""),
        "Ctrl-C stops everything.",
        "",
    ]
    print("\n".join(lines), flush=True)
