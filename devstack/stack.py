"""``make run``: the whole system on one machine for development, in the production shape.

The embedded broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` is set), then one process each for
the provider simulator (``python -m devstack simulator``), a worker and the front-end
(``python -m worker run|api``),
so the stack uses every core and each process stops the way it does in production. Ctrl-C
(or SIGTERM) stops them in reverse order of dependency: front-end and worker drain first,
then the simulator, then the broker. Children get SIGTERM if this process dies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from devstack.broker import EmbeddedBroker, die_with_parent, wait_for_port
from devstack.demo import register_accounts
from devstack.keys import DEV_KEY, DEV_WORKSPACE, dev_keys_file
from devstack.settings import DevSettings
from worker.kafka import ensure_topics
from worker.logs import get_logger
from worker.process import on_stop_signals

log = get_logger(__name__)

READY_TIMEOUT_S = 90.0


def demo_account_refs(n: int) -> list[tuple[str, str]]:
    """(account_id, provider_account_ref): ``n`` happy accounts plus scripted faults."""
    accounts = [(f"acc_demo_{i}", f"demo-{i}") for i in range(1, n + 1)]
    accounts += [
        ("acc_demo_unavailable", "sim-unavailable-demo"),
        ("acc_demo_mismatch", "sim-mismatch-demo"),
        ("acc_demo_fail", "sim-fail-demo"),
    ]
    return accounts


#: The repository root: children find ``devstack`` here whatever their working directory.
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Component:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *self.argv],
            env=self.env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the stack only; it stops us in order
            preexec_fn=die_with_parent,
        )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM, wait for the graceful exit, SIGKILL after ``grace_s``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.error("component_killed", component=self.name, grace_s=grace_s)
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


async def run_stack(settings: DevSettings, *, demo_accounts: int = 5) -> None:
    stop = asyncio.Event()
    with on_stop_signals(stop.set):
        await _run_stack(settings, stop, demo_accounts)


async def _run_stack(settings: DevSettings, stop: asyncio.Event, demo_accounts: int) -> None:
    broker: EmbeddedBroker | None = None
    if settings.kafka_bootstrap_servers is None:
        broker = EmbeddedBroker(port=settings.embedded_broker_port).start()
    keys_dir = Path(tempfile.mkdtemp(prefix="passkey-stack-"))
    keys = settings.api_keys_file or dev_keys_file(keys_dir / "api-keys.json")
    env = dict(os.environ)
    env.update({"KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap, "API_KEYS_FILE": str(keys)})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    simulator = Component("simulator", ["devstack", "simulator"], env=env)
    worker = Component("worker", ["worker", "run"], env=env)
    api = Component("api", ["worker", "api"], env=env)
    components = [simulator, worker, api]
    try:
        await ensure_topics(settings)
        for component in components:
            component.start()
        await _until_ready(settings, components, stop)
        if not stop.is_set():
            accounts = demo_account_refs(demo_accounts)
            await register_accounts(settings, DEV_WORKSPACE, accounts)
            _banner(settings, accounts)
        while not stop.is_set():
            dead = [c for c in components if not c.running()]
            if dead:
                log.error(
                    "component_exited",
                    component=dead[0].name,
                    code=dead[0].proc and dead[0].proc.returncode,
                )
                break
            await asyncio.sleep(0.25)
    finally:
        grace = settings.worker_shutdown_grace_s + 10
        await asyncio.gather(
            asyncio.to_thread(api.stop, grace), asyncio.to_thread(worker.stop, grace)
        )
        await asyncio.to_thread(simulator.stop, 10)
        if broker is not None:
            broker.stop()
        print("stack stopped", flush=True)


async def _until_ready(
    settings: DevSettings, components: list[Component], stop: asyncio.Event
) -> None:
    """Until the simulator listens and the worker and the front-end answer /readyz 200."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    await asyncio.to_thread(
        wait_for_port, settings.simulator_host, settings.simulator_port, READY_TIMEOUT_S
    )
    probes = [
        f"http://{settings.worker_metrics_host}:{settings.worker_metrics_port}/readyz",
        f"http://{settings.api_host}:{settings.api_port}/readyz",
    ]
    async with httpx.AsyncClient(timeout=2) as client:
        for url in probes:
            while not stop.is_set():
                if any(not c.running() for c in components):
                    raise RuntimeError("a component exited during start-up; see its log above")
                try:
                    if (await client.get(url)).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} not ready after {READY_TIMEOUT_S:.0f}s")
                await asyncio.sleep(0.2)


def _banner(settings: DevSettings, accounts: list[tuple[str, str]]) -> None:
    base = f"http://{settings.api_host}:{settings.api_port}"
    first = accounts[0][0]
    lines = [
        "",
        "passkey auth-flow stack is up",
        f"  kafka bootstrap   {settings.bootstrap}",
        f"  provider sim      http://{settings.simulator_host}:{settings.simulator_port}",
        f"  worker probes     http://{settings.worker_metrics_host}:{settings.worker_metrics_port}"
        "/metrics  /healthz  /readyz",
        f"  API front-end     {base}  (workspace {DEV_WORKSPACE}, key {DEV_KEY})",
        "",
        "try a flow:",
        f"  curl -s -X POST -H 'X-Api-Key: {DEV_KEY}' "
        f"{base}/v1/accounts/{first}/auth/passkey-confirm",
        f"  curl -s -H 'X-Api-Key: {DEV_KEY}' {base}/v1/accounts/{first}/auth",
        "or straight through Kafka:",
        f"  .venv/bin/python -m devstack demo confirm {accounts[1][0]}",
        "demo accounts (status passkey_confirmation): "
        + ", ".join(a for a, _ in accounts[:8])
        + (f" … ({len(accounts)} in all)" if len(accounts) > 8 else ""),
        "Ctrl-C stops everything.",
        "",
    ]
    print("\n".join(lines), flush=True)
