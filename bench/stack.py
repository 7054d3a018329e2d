"""The dev stack under measurement: start it on spare ports, find its processes, read their
CPU from ``/proc``, drive its front-end over keep-alive connections. Shared by
``bench.stack_cost`` and ``bench.replica_cost``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import REPO_ROOT, base_env
from devstack.broker import free_port
from devstack.keys import DEV_KEY

TICK: Final = os.sysconf("SC_CLK_TCK")
#: Which stack process is which, by its command line.
ROLES: Final = {
    "devstack simulator": "simulator",
    "devstack receiver": "receiver",
    "devstack worker": "worker",
    "devstack webhooks": "dispatcher",
    "worker run": "worker",
    "worker webhooks": "dispatcher",
    "worker api": "front-end",
    "broker --listener-url": "broker",
}


# -- CPU of processes --------------------------------------------------------------------------


def cpu_of(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples_of(exposition: str) -> Samples:
    """A process's metrics page, each sample by (name, sorted labels), parsed with
    prometheus-client's own parser."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def role_of(pid: int) -> str | None:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    return next((role for marker, role in ROLES.items() if marker in cmdline), None)


@dataclass
class CpuWindow:
    """CPU seconds (user, system) each of ``pids`` spent between ``start`` and ``stop``."""

    pids: dict[str, int]
    before: dict[str, tuple[float, float]] = field(default_factory=dict)
    spent: dict[str, tuple[float, float]] = field(default_factory=dict)
    wall: float = 0.0

    def start(self) -> None:
        self.before = {name: cpu_of(pid) for name, pid in self.pids.items()}
        self.wall = time.perf_counter()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self.wall
        for name, pid in self.pids.items():
            u, s = cpu_of(pid)
            bu, bs = self.before[name]
            self.spent[name] = (u - bu, s - bs)


# -- HTTP load ---------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP for this route: cheap, so
    the generator takes little of the two cores the stack runs on."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        #: The last answer said ``Connection: close`` (the server closes it after answering):
        #: the caller opens a new one instead of sending on this.
        self.closing = False

    @classmethod
    async def open(cls, port: int, local_host: str = "127.0.0.1") -> Connection:
        """To the stack on 127.0.0.1, from ``local_host`` (any of 127.0.0.0/8 on Linux)."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=(local_host, 0)
        )
        return cls(reader, writer)

    async def post(self, path: str, key: str, method: str = "POST") -> tuple[int, bytes]:
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Api-Key: {key}\r\n"
            "Content-Length: 0\r\n\r\n".encode()
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
            elif line[:11].lower() == b"connection:":
                self.closing = line[11:].strip().lower() == b"close"
        body = await self.reader.readexactly(length)
        return int(head[9:12]), body

    def close(self) -> None:
        self.writer.close()


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


# -- the stack ---------------------------------------------------------------------------------


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    pids: dict[str, int]
    ports: dict[str, int]
    log: Path


def start_stack(
    accounts: int,
    workdir: Path,
    keys: Path,
    timeout_s: float,
    extra_env: dict[str, str] | None = None,
    tree: Path = REPO_ROOT,
) -> Stack:
    """``python -m devstack stack`` on free loopback ports, until it says it is up. ``tree`` is
    the checkout whose stack runs (another commit's, to compare under the same driver)."""
    ports = {
        name: free_port()
        for name in ("broker", "simulator", "receiver", "api", "api_metrics", "worker", "webhooks")
    }
    env = (
        base_env()
        | {
            "EMBEDDED_BROKER_PORT": str(ports["broker"]),
            "SIMULATOR_PORT": str(ports["simulator"]),
            "RECEIVER_PORT": str(ports["receiver"]),
            "API_PORT": str(ports["api"]),
            "API_METRICS_PORT": str(ports["api_metrics"]),
            "WORKER_METRICS_PORT": str(ports["worker"]),
            "WEBHOOK_METRICS_PORT": str(ports["webhooks"]),
            "API_KEYS_FILE": str(keys),
            "PROVIDER_URLS": json.dumps({"simulator": f"http://127.0.0.1:{ports['simulator']}"}),
            # What make run's receiver does (its runtime lock has no jsonschema): the stack's
            # cost, not the demo's schema check (a dev-lock extra).
            "RECEIVER_SCHEMA_CHECK": "false",
        }
        | {"PYTHONPATH": str(tree)}
        | (extra_env or {})
    )
    log = workdir / "stack.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "devstack", "stack", "--demo-accounts", str(accounts)],
            cwd=tree,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + timeout_s
    while b"stack is up" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the stack did not start; see {log}")
        time.sleep(0.2)
    pids = {}
    for pid in children_of(proc.pid):
        role = role_of(pid)
        if role is not None:
            pids[role] = pid
    return Stack(proc, pids, ports, log)


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def until_registered(port: int, account: int, timeout_s: float) -> None:
    """Until the front-end knows the last demo account (the worker registered them all)."""
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{port}/v1/accounts/acc_demo_{account}/auth"
    async with httpx.AsyncClient(timeout=5) as client:
        while (await client.get(url, headers={"X-Api-Key": DEV_KEY})).status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"acc_demo_{account} not registered after {timeout_s}s")
            await asyncio.sleep(0.5)
