"""``python -m devstack stack`` (what ``make run`` runs) as a subprocess on free loopback
ports, for the tests that drive the whole stack."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from devstack.broker import free_port

REPO = Path(__file__).resolve().parents[2]
PORTS = (
    "EMBEDDED_BROKER_PORT",
    "SIMULATOR_PORT",
    "WORKER_METRICS_PORT",
    "API_PORT",
    "API_METRICS_PORT",
    "WEBHOOK_METRICS_PORT",
    "RECEIVER_PORT",
)


@dataclass
class RunningStack:
    proc: subprocess.Popen[str]
    ports: dict[str, int]
    stderr: IO[str]
    banner: str

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports['API_PORT']}"

    @property
    def worker(self) -> str:
        return f"http://127.0.0.1:{self.ports['WORKER_METRICS_PORT']}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports['EMBEDDED_BROKER_PORT']}"

    def log(self) -> str:
        """Everything the stack's components logged so far."""
        self.stderr.flush()
        return Path(self.stderr.name).read_text(encoding="utf-8", errors="replace")

    async def read_until(self, marker: str) -> str:
        """Stack output (stdout) up to and including the line holding ``marker``."""
        assert self.proc.stdout is not None
        seen: list[str] = []
        while True:
            line = await asyncio.to_thread(self.proc.stdout.readline)
            if not line:
                raise AssertionError("stack exited:\n" + "".join(seen))
            seen.append(line)
            if marker in line:
                return "".join(seen)

    async def until_worker_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.worker}/readyz")).status_code == 200:
                        return
                assert time.monotonic() < deadline, "the worker never became ready"
                await asyncio.sleep(0.3)


@contextlib.asynccontextmanager
async def running_stack(*args: str, **env: str) -> AsyncIterator[RunningStack]:
    """The stack with ``args`` (e.g. ``--demo-accounts 2``) and ``env`` on top of free ports,
    up and printing its banner; killed on exit if still running."""
    ports = {name: free_port() for name in PORTS}
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TOPIC_"))}
    # No PROVIDER_URLS: the stack points its worker at the simulator it starts on the free
    # SIMULATOR_PORT below (test_stack_up_flow_and_clean_ctrl_c's flow depends on it).
    environ.pop("PROVIDER_URLS", None)
    environ.update({k: str(v) for k, v in ports.items()})
    environ.update(
        {
            "COMMANDS_PARTITIONS": "3",
            "OTHER_PARTITIONS": "3",
            "SIMULATOR_AUTHORIZE_DELAY_S": "0.5",
            "WORKER_FOLLOW_UP_POLL_S": "0.3",
            "PYTHONPATH": str(REPO),
            **env,
        }
    )
    # The stack's own temporary files (its keys directory) go in a directory removed on exit:
    # a stack killed below (SIGKILL) cannot remove them itself.
    with (
        tempfile.TemporaryDirectory(prefix="passkey-test-", ignore_cleanup_errors=True) as scratch,
        tempfile.NamedTemporaryFile("w+", suffix=".log", encoding="utf-8") as stderr,
    ):
        environ["TMPDIR"] = env.get("TMPDIR", scratch)
        proc = subprocess.Popen(
            [sys.executable, "-m", "devstack", "stack", *args],
            env=environ,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            stack = RunningStack(proc, ports, stderr, banner="")
            stack.banner = await asyncio.wait_for(stack.read_until("Ctrl-C stops everything."), 60)
            yield stack
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
