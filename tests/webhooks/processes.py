"""Webhook dispatchers as real processes (``python -m worker webhooks``), for the tests that
need what only a process has: SIGKILL at any instruction, the CLI's exit codes, the probes on
their own port. The settings of the test become the child's environment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

from devstack.broker import free_port
from tests.cluster import kafka_env
from tests.conftest import SettingsFactory
from tests.harness import REPO
from worker.contract.topics import Topics
from worker.settings import Settings
from worker.webhooks.secrets_box import generate_key

#: How long a SIGTERM may take before the helper gives up and SIGKILLs: longer than the
#: process' own watchdog (grace 5 s + 25 s), so an overrun shows as exit code 70, not -9.
STOP_WAIT_S = 45.0


def dispatcher_settings(make_settings: SettingsFactory, **overrides: Any) -> Settings:
    """Settings for a dispatcher pool on the session broker: its own topics and groups,
    plain-HTTP loopback targets allowed, a fresh secrets key."""
    values: dict[str, Any] = {
        "webhook_secrets_key": generate_key(),
        "webhook_allow_http": True,
        "webhook_allow_private_targets": True,
        "webhook_timeout_s": 2.0,
    }
    values.update(overrides)
    settings = make_settings(**values)
    return settings.model_copy(
        update={"webhook_consumer_group": f"{settings.kafka_consumer_group}.webhooks"}
    )


def dispatcher_env(settings: Settings, metrics_port: int, **extra: str) -> dict[str, str]:
    """Environment of a ``python -m worker webhooks`` child bound to ``settings``; nothing of
    the parent's Kafka, topic or webhook configuration leaks in."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TOPIC_", "KAFKA_", "WEBHOOK_", "WORKER_"))
    }
    key = settings.webhook_secrets_key
    env.update(kafka_env(settings))
    env.update(
        {
            "ENVIRONMENT": "development",
            "KAFKA_SESSION_TIMEOUT_MS": str(settings.kafka_session_timeout_ms),
            "KAFKA_HEARTBEAT_INTERVAL_MS": str(settings.kafka_heartbeat_interval_ms),
            "KAFKA_FETCH_MAX_WAIT_MS": str(settings.kafka_fetch_max_wait_ms),
            "COMMANDS_PARTITIONS": str(settings.commands_partitions),
            "OTHER_PARTITIONS": str(settings.other_partitions),
            "WEBHOOK_CONSUMER_GROUP": settings.webhook_consumer_group,
            "WEBHOOK_ALLOW_HTTP": str(settings.webhook_allow_http).lower(),
            "WEBHOOK_ALLOW_PRIVATE_TARGETS": str(settings.webhook_allow_private_targets).lower(),
            "WEBHOOK_RETRY_SCHEDULE_S": settings.webhook_retry_schedule_s,
            "WEBHOOK_TIMEOUT_S": str(settings.webhook_timeout_s),
            "WEBHOOK_METRICS_HOST": "127.0.0.1",
            "WEBHOOK_METRICS_PORT": str(metrics_port),
            "WORKER_SHUTDOWN_GRACE_S": str(settings.worker_shutdown_grace_s),
            "LOG_LEVEL": "WARNING",
            "LOG_FORMAT": "console",
            "PYTHONPATH": str(REPO),
        }
    )
    if key is not None:
        env["WEBHOOK_SECRETS_KEY"] = key.get_secret_value()
    env.update({f"TOPIC_{f.upper()}": getattr(settings.topics, f) for f in Topics.model_fields})
    env.update(extra)
    return env


class DispatcherPool:
    """``n`` dispatcher slots; each (re)start of a slot is a new process on the slot's port,
    logging to its own file so a failure can show what the process said."""

    def __init__(self, settings: Settings, n: int, log_dir: Path, **extra_env: str) -> None:
        self.settings = settings
        self.extra_env = extra_env
        self.ports = [free_port() for _ in range(n)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self.log_dir = log_dir
        self.log_paths: list[Path | None] = [None] * n
        self.starts = 0
        self.stop_seconds: list[float] = []
        self._logs: list[IO[bytes]] = []

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def start(self, i: int) -> subprocess.Popen[bytes]:
        self.starts += 1
        path = self.log_dir / f"dispatcher-{i}-{self.starts}.log"
        self.log_paths[i] = path
        log = path.open("wb")
        self._logs.append(log)
        proc = subprocess.Popen(
            # The product's dispatcher with the embedded broker's group consumer
            # (devstack.consumer): a stopped member hands its partitions over at once.
            [sys.executable, "-m", "devstack", "webhooks"],
            env=dispatcher_env(self.settings, self.ports[i], **self.extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        self.procs[i] = proc
        return proc

    def signal(self, i: int, sig: int) -> int | None:
        """Send ``sig`` to slot ``i`` and wait for the process to end; its return code."""
        proc = self.procs[i]
        if proc is None:
            return None
        if proc.poll() is None:
            started = time.monotonic()
            proc.send_signal(sig)
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()  # never leave one behind; the return code tells the story
                proc.wait(timeout=10)
            if sig == signal.SIGTERM:
                self.stop_seconds.append(round(time.monotonic() - started, 2))
        return proc.returncode

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every slot's process answers ``/readyz`` with 200 (joined, restored)."""
        deadline = time.monotonic() + timeout
        for i in range(len(self.procs)):
            await wait_status(f"{self.url(i)}/readyz", 200, deadline, self.procs[i])

    def log_tail(self, i: int, lines: int = 40) -> str:
        path = self.log_paths[i]
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    async def ready_slots(self) -> list[int]:
        """The slots whose process answers ``/readyz`` with 200 right now."""
        ready = []
        async with httpx.AsyncClient(timeout=1.0) as client:
            for i in range(len(self.procs)):
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{self.url(i)}/readyz")).status_code == 200:
                        ready.append(i)
        return ready

    def terminate_all(self) -> list[int | None]:
        """SIGTERM every live process at once (a deployment scaled to zero), then wait for
        each; their return codes."""
        started = time.monotonic()
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        try:
            for proc in live:
                try:
                    proc.wait(timeout=max(0.1, started + STOP_WAIT_S - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()  # never leave one behind; the return code tells the story
                    proc.wait(timeout=10)
                self.stop_seconds.append(round(time.monotonic() - started, 2))
        finally:
            self.close()
        return [None if p is None else p.returncode for p in self.procs]

    def close(self) -> None:
        """SIGKILL whatever still runs (the ``finally`` of a failed test) and close the logs."""
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for log in self._logs:
            log.close()
        self._logs.clear()


async def wait_status(
    url: str, status: int, deadline: float, proc: subprocess.Popen[bytes] | None = None
) -> httpx.Response:
    """Poll ``url`` until it answers ``status``; fails early when ``proc`` has exited."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"process exited with {proc.returncode} before {url}")
            try:
                resp = await client.get(url)
                if resp.status_code == status:
                    return resp
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer {status} in time")
            await asyncio.sleep(0.2)
