"""``make run``: the whole system on one machine for development, in the production shape.

The embedded broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` names a cluster to use instead), the
topics (created with their configuration), then one process each for the provider simulator
(``python -m devstack simulator``), a worker and a webhook dispatcher (``python -m devstack
worker|webhooks``: the product's, with ``devstack.consumer``) and the front-end (``python -m
worker api``), so the stack uses every core and each process stops the way it does in
production. Ctrl-C (or SIGTERM) stops them in reverse order of dependency: front-end and worker
drain first, then the simulator, then the broker. Children get SIGTERM if this process dies.

While it runs, the stack supervises its components as Kubernetes would: one that exits
unexpectedly (a worker past ``KAFKA_OUTAGE_TOLERANCE_S``, a crash) is restarted after a
back-off of 1 s doubling to 30 s (reset once it ran for a minute), with a log line each time,
instead of the whole stack stopping.

The children run with ``ENVIRONMENT=development`` (loopback addresses allowed), and the stack
configures both sides of the provider credential: a token generated for the run (or
``SIMULATOR_TOKEN``) that the simulator requires and the worker reads from a file
(``PROVIDER_SIMULATOR_TOKEN_FILE``), so every provider call of the stack carries it.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from devstack.broker import EmbeddedBroker, die_with_parent, wait_for_port
from devstack.demo import register_accounts
from devstack.keys import DEV_KEY, DEV_WORKSPACE, dev_keys_file
from devstack.settings import EMBEDDED_API_FETCH_MAX_WAIT_MS, DevSettings
from worker.dispatcher.app import secrets_box
from worker.engine.kafka import build_producer, ensure_topics
from worker.runtime import trace_export
from worker.runtime.logs import get_logger
from worker.runtime.process import on_stop_signals
from worker.webhooks.endpoint_writes import EndpointStore
from worker.webhooks.endpoints import EndpointRegistry
from worker.webhooks.secrets_box import generate_key

log = get_logger(__name__)

READY_TIMEOUT_S = 90.0
#: Restart back-off of a component that exited: first, and the cap it doubles up to.
RESTART_BACKOFF_S = (1.0, 30.0)
#: A component that ran this long before exiting starts again from the first back-off.
STABLE_AFTER_S = 60.0


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
    started_at: float = 0.0
    backoff_s: float = 0.0
    restart_at: float | None = None
    restarts: int = 0

    def start(self) -> None:
        self.started_at = time.monotonic()
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


def supervise(components: list[Component], now: float) -> None:
    """One supervision round: schedule the restart of each component that exited (logged
    with its exit code and the back-off), and start those whose back-off is over."""
    first, cap = RESTART_BACKOFF_S
    for c in components:
        if c.running():
            continue
        if c.restart_at is None:
            stable = now - c.started_at >= STABLE_AFTER_S
            c.backoff_s = first if stable or not c.backoff_s else min(cap, c.backoff_s * 2)
            c.restart_at = now + c.backoff_s
            log.error(
                "component_exited",
                component=c.name,
                code=c.proc and c.proc.returncode,
                restart_in_s=c.backoff_s,
            )
        elif now >= c.restart_at:
            c.restart_at = None
            c.restarts += 1
            log.warning("component_restarting", component=c.name, restarts=c.restarts)
            c.start()


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
    settings = _with_webhooks(settings)
    env = dict(os.environ)
    # Readable logs for a person at a terminal; production's default stays JSON.
    env.setdefault("LOG_FORMAT", "console")
    env.pop("PROVIDER_SIMULATOR_TOKEN", None)  # the file below is the worker's credential
    # The worker calls the simulator this stack starts, on whatever SIMULATOR_PORT says (the
    # product's default names 8090 alone), unless PROVIDER_URLS names providers of its own.
    env.setdefault("PROVIDER_URLS", json.dumps({"simulator": simulator_url(settings)}))
    env.update(
        {
            "ENVIRONMENT": "development",
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap,
            **provider_credential(settings, keys_dir),
            # The topics the stack made: the front-end, a product process with production
            # defaults, checks them against these.
            "KAFKA_AUTO_CREATE_TOPICS": str(settings.kafka_auto_create_topics).lower(),
            "KAFKA_REPLICATION_FACTOR": str(settings.kafka_replication_factor),
            "KAFKA_MIN_INSYNC_REPLICAS": str(settings.kafka_min_insync_replicas),
            # The partition counts the topics were made with (the dev stack's, devstack/settings.py)
            # for every process, the front-end's reply partitions among them.
            "COMMANDS_PARTITIONS": str(settings.commands_partitions),
            "OTHER_PARTITIONS": str(settings.other_partitions),
            "API_KEYS_FILE": str(keys),
            # The demo receiver listens on loopback over plain HTTP: relaxed for this stack
            # only (the defaults allow public https targets alone).
            "WEBHOOK_ALLOW_HTTP": "true",
            "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
        }
    )
    # Portal links are built on the configured public base, never on a request's Host: here,
    # the address this stack serves the front-end on (an operator's own setting wins).
    env.setdefault("API_PUBLIC_BASE_URL", f"http://{settings.api_host}:{settings.api_port}")
    assert settings.webhook_secrets_key is not None
    env["WEBHOOK_SECRETS_KEY"] = settings.webhook_secrets_key.get_secret_value()
    if broker is not None:
        # The embedded broker looks for data again only after half a fetch's remaining wait
        # (the production default is long: Kafka answers when data arrives); a short one keeps
        # the stack responsive.
        env.setdefault("KAFKA_FETCH_MAX_WAIT_MS", str(settings.kafka_fetch_max_wait_ms))
        # A fetch there can skip a batch not stored yet: readers wait for it.
        env.setdefault("KAFKA_OFFSET_GAP_HOLD_S", str(settings.kafka_offset_gap_hold_s))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    simulator = Component("simulator", ["devstack", "simulator"], env=env)
    # The product's worker and dispatcher with the embedded broker's group consumer (a no-op
    # on Kafka): a restarted one gets its partitions at once, not a session timeout later.
    worker = Component("worker", ["devstack", "worker"], env=env)
    dispatcher_env = env
    if broker is not None:
        dispatcher_env = env | {
            "KAFKA_FETCH_MAX_WAIT_MS": str(settings.dispatcher_fetch_max_wait_ms)
        }
    dispatcher = Component("dispatcher", ["devstack", "webhooks"], env=dispatcher_env)
    # The dev stack is what the load benchmarks drive (bench/api_load.py, bench.stack_cost):
    # thousands of requests a second from one workspace. Its front-end has no per-workspace
    # rate limit unless API_RATE_LIMIT_PER_S is set.
    api_env = {"API_RATE_LIMIT_PER_S": "0"} | env
    if broker is not None:
        # Each POST waits for its reply's fetch, so the front-end's wait is short. And its one
        # front-end reads every reply partition: with one partition holding every reply, each
        # POST slowed the longer the stack ran (docs/architecture.md, "The embedded broker").
        # An API_REPLY_PARTITIONS of the caller's is kept (bench.stack_cost runs the product's 1).
        api_env = api_env | {
            "KAFKA_FETCH_MAX_WAIT_MS": str(EMBEDDED_API_FETCH_MAX_WAIT_MS),
            "API_REPLY_PARTITIONS": env.get("API_REPLY_PARTITIONS")
            or str(settings.other_partitions),
        }
    api = Component("api", ["worker", "api"], env=api_env)
    components = [simulator, worker, dispatcher, api]
    try:
        await ensure_topics(settings.kafka_config(), settings.topic_plan())
        endpoint_id, secret = await create_demo_endpoint(settings)
        receiver = Component(
            "receiver", ["devstack", "receiver"], env=env | {"RECEIVER_SECRET": secret}
        )
        components.insert(0, receiver)
        for component in components:
            component.start()
        await _until_ready(settings, components, stop)
        if not stop.is_set():
            accounts = demo_account_refs(demo_accounts)
            await register_accounts(settings, DEV_WORKSPACE, accounts)
            _banner(settings, accounts, endpoint_id, await portal_url(settings))
        while not stop.is_set():
            supervise(components, time.monotonic())
            await asyncio.sleep(0.25)
    finally:
        grace = settings.worker_shutdown_grace_s + 10
        await asyncio.gather(
            asyncio.to_thread(api.stop, grace),
            asyncio.to_thread(worker.stop, grace),
            asyncio.to_thread(dispatcher.stop, grace),
        )
        support = [c for c in components if c not in (api, worker, dispatcher)]
        await asyncio.gather(*(asyncio.to_thread(c.stop, 10) for c in support))
        if broker is not None:
            broker.stop()
        shutil.rmtree(keys_dir, ignore_errors=True)  # the dev keys and provider credential
        print("stack stopped", flush=True)


async def _until_ready(
    settings: DevSettings, components: list[Component], stop: asyncio.Event
) -> None:
    """Until the simulator listens and the worker and the front-end answer /readyz 200."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    for host, port in (
        (settings.simulator_host, settings.simulator_port),
        (settings.receiver_host, settings.receiver_port),
    ):
        await asyncio.to_thread(wait_for_port, host, port, READY_TIMEOUT_S)
    probes = [
        f"http://{settings.worker_metrics_host}:{settings.worker_metrics_port}/readyz",
        f"http://{settings.webhook_metrics_host}:{settings.webhook_metrics_port}/readyz",
        f"http://{settings.api_host}:{settings.api_port}/readyz",
    ]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as client:
        for url in probes:
            while not stop.is_set():
                if any(not c.running() for c in components):
                    raise RuntimeError("a component exited during start-up; see its log above")
                try:
                    async with client.get(url, allow_redirects=False) as answer:
                        if answer.status == 200:
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} not ready after {READY_TIMEOUT_S:.0f}s")
                await asyncio.sleep(0.2)


def simulator_url(settings: DevSettings) -> str:
    """Where the stack's provider simulator listens (``SIMULATOR_HOST``, ``SIMULATOR_PORT``)."""
    return f"http://{settings.simulator_host}:{settings.simulator_port}"


def provider_credential(settings: DevSettings, directory: Path) -> dict[str, str]:
    """Both sides of the simulator's credential: ``SIMULATOR_TOKEN`` for the simulator and
    ``PROVIDER_SIMULATOR_TOKEN_FILE`` (written here, mode 0600) for the worker."""
    configured = settings.simulator_token
    token = configured.get_secret_value() if configured else secrets.token_urlsafe(24)
    path = directory / "provider-simulator.token"
    path.touch(mode=0o600)
    path.write_text(token + "\n", encoding="ascii")
    return {"SIMULATOR_TOKEN": token, "PROVIDER_SIMULATOR_TOKEN_FILE": str(path)}


def _with_webhooks(settings: DevSettings) -> DevSettings:
    """The stack's settings with a webhook secrets key (generated for this run unless one
    is configured) and the loopback receiver allowed."""
    key = settings.webhook_secrets_key
    return settings.model_copy(
        update={
            "webhook_secrets_key": key or SecretStr(generate_key()),
            "webhook_allow_http": True,
            "webhook_allow_private_targets": True,
        }
    )


async def create_demo_endpoint(settings: DevSettings) -> tuple[str, str]:
    """Register the demo receiver for the demo workspace; returns its id and secret."""
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        store = EndpointStore(
            producer=producer,
            topic=settings.topics.webhook_endpoints,
            registry=EndpointRegistry(),
            cipher=secrets_box(settings),
        )
        record, secret = await store.create(
            DEV_WORKSPACE,
            url=f"http://{settings.receiver_host}:{settings.receiver_port}/webhooks",
            event_types=None,
            description="make run's demo receiver (devstack/receiver.py)",
        )
    finally:
        await producer.stop()
    return record.id, secret


async def portal_url(settings: DevSettings) -> str:
    """A portal session URL for the demo workspace, asked of the front-end with the dev key
    (``POST /v1/portal-sessions``, as an integrator's backend would), or why there is none."""
    url = f"http://{settings.api_host}:{settings.api_port}/v1/portal-sessions"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.post(url, headers={"X-Api-Key": DEV_KEY}) as response,
        ):
            body = await response.json(content_type=None)
            if response.status != 201:
                return f"not available (HTTP {response.status}: {body['error']['code']})"
            portal: str = body["data"]["url"]
            return portal
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
        return f"not available ({type(exc).__name__})"


def _traces_line() -> list[str]:
    """One banner line when OTEL_* sends traces somewhere (the children inherit it)."""
    try:
        targets = trace_export.export_targets()
    except ValueError as exc:
        return [f"  traces            not exported: {exc}"]
    if not targets:
        return []
    return [f"  traces            {', '.join(targets)} (OTEL_* of this shell)"]


def _banner(
    settings: DevSettings, accounts: list[tuple[str, str]], endpoint_id: str, portal: str
) -> None:
    base = f"http://{settings.api_host}:{settings.api_port}"
    first = accounts[0][0]
    lines = [
        "",
        "passkey auth-flow stack is up",
        f"  kafka bootstrap   {settings.bootstrap}",
        f"  provider sim      {simulator_url(settings)}"
        " (bearer token required: SIMULATOR_TOKEN, PROVIDER_SIMULATOR_TOKEN_FILE)",
        f"  worker probes     http://{settings.worker_metrics_host}:{settings.worker_metrics_port}"
        "/metrics  /healthz  /readyz",
        f"  API front-end     {base}  (workspace {DEV_WORKSPACE}, key {DEV_KEY});"
        f" metrics http://{settings.api_metrics_host}:{settings.api_metrics_port}/metrics",
        *_traces_line(),
        f"  webhooks          dispatcher http://{settings.webhook_metrics_host}:"
        f"{settings.webhook_metrics_port}/metrics; demo endpoint {endpoint_id} ->"
        f" http://{settings.receiver_host}:{settings.receiver_port}/webhooks"
        " (each delivery is printed below)",
        f"  webhook portal    {portal}",
        "                    (the demo workspace's portal for 1 h; the link is its password)",
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
