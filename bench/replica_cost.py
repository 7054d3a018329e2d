"""Does a front-end replica's cost follow its own traffic? ``python -m bench.stack_cost
--replicas 3``.

Starts the dev stack (one front-end) and ``replicas - 1`` more front-end processes with the
same environment (read from the stack's front-end) on spare ports, then, per round:

* **one**: one replica serves ``requests / replicas`` requests over ``connections /
  replicas`` connections at ``rate / replicas`` a second;
* **shared**: the replicas share ``requests`` over ``connections`` connections at ``rate`` a
  second, round-robin over their ports (each connection sticks to one replica, as behind a
  load balancer);

each a closed loop of POST confirm and GET /auth alternately, on the stack's demo accounts.
CPU per request of each replica from ``/proc/<pid>/stat`` over the phase, raw and less the
replica's idle CPU rate (measured first, over ``--idle-s``) times the phase's wall time. If a
replica's cost follows its own traffic, a replica of the shared phase costs about what the one
replica costs per request: the ratio is printed (target: within ``TARGET_REPLICA_RATIO``).
Then the time to ready of a new replica, ``--ready-starts`` times, before and after
``--state-records`` more account records on auth.state. Bounded in requests and in time
(``--phase-timeout-s``); stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
from aiokafka import AIOKafkaProducer

from bench.common import REPO_ROOT, clean, machine
from bench.stack import (
    Connection,
    CpuWindow,
    percentile,
    start_stack,
    stop_process,
    until_registered,
)
from devstack.broker import free_port, wait_for_port
from devstack.keys import DEV_KEY, dev_keys_file
from worker.contract.messages import AccountRecord, encode_record
from worker.contract.topics import Topics
from worker.runtime import eventloop

CONFIRM: Final = "/v1/accounts/acc_demo_{n}/auth/passkey-confirm"
AUTH: Final = "/v1/accounts/acc_demo_{n}/auth"
TARGET_REPLICA_RATIO: Final = 1.2


def start_replica(
    template_pid: int, workdir: Path, index: int
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Another front-end like the stack's (same command line and environment), on spare
    ports; returns the process, its public port and its side door's."""
    with open(f"/proc/{template_pid}/environ", "rb") as f:
        env = dict(item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item)
    with open(f"/proc/{template_pid}/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    port, side = free_port(), free_port()
    env |= {"API_PORT": str(port), "API_METRICS_PORT": str(side)}
    log = open(workdir / f"replica-{index}.log", "wb")  # noqa: SIM115 - lives with the process
    proc = subprocess.Popen(
        argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
    )
    return proc, port, side


async def add_state(bootstrap: str, count: int) -> None:
    """``count`` synthetic account records on auth.state (another workspace's, in flow): what
    a replica that read auth.state would have to read before it is ready."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        topic, now = Topics().state, time.time()
        sent = []
        for i in range(count):
            record = AccountRecord(
                account_id=f"acc_bench_{i}",
                workspace_id="ws_bench",
                status="passkey_confirmation",
                auth_status="passkey_confirmation",
                version=1,
                updated_at=now,
            )
            sent.append(
                await producer.send(topic, encode_record(record), key=record.account_id.encode())
            )
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def seconds_to_ready(side_port: int, started: float, timeout_s: float) -> tuple[float, float]:
    """Seconds from ``started`` (``time.monotonic()``) until the side door answers at all
    (the process is up: imports, clients started) and until its ``/readyz`` is 200 (its
    Kafka readers caught up too)."""
    deadline = started + timeout_s
    listening: float | None = None
    async with httpx.AsyncClient(timeout=2) as client:
        while True:
            with contextlib.suppress(httpx.TransportError):
                status = (await client.get(f"http://127.0.0.1:{side_port}/readyz")).status_code
                if listening is None:
                    listening = time.monotonic() - started
                if status == 200:
                    return listening, time.monotonic() - started
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replica on {side_port} not ready after {timeout_s}s")
            await asyncio.sleep(0.02)


async def until_ready(port: int, timeout_s: float) -> None:
    """Until the replica answers GET /auth for the first demo account (its reply consumer is
    positioned and a worker answers)."""
    await asyncio.to_thread(wait_for_port, "127.0.0.1", port, timeout_s)
    await until_registered(port, 1, timeout_s)


async def time_to_ready(
    args: argparse.Namespace, template_pid: int, broker_port: int, workdir: Path
) -> dict[str, list[float]]:
    """Seconds from start to ``/readyz`` 200 of a new replica, ``--ready-starts`` times with
    the stack's accounts, then as often after ``--state-records`` more account records on
    auth.state (each replica stopped before the next starts)."""
    out: dict[str, list[float]] = {"accounts": [], "more_accounts": []}
    up: dict[str, list[float]] = {"accounts_up": [], "more_accounts_up": []}
    for label in ("accounts", "more_accounts"):
        if label == "more_accounts" and args.state_records:
            await add_state(f"127.0.0.1:{broker_port}", args.state_records)
        for k in range(args.ready_starts):
            started = time.monotonic()
            proc, _, side = start_replica(
                template_pid, workdir, (100 if label == "accounts" else 200) + k
            )
            try:
                listening, ready = await seconds_to_ready(side, started, args.start_timeout_s)
            finally:
                await asyncio.to_thread(stop_process, proc)
            out[label].append(ready)
            up[f"{label}_up"].append(listening)
    return out | up


async def mixed_loop(
    ports: list[int], numbers: Iterator[int], requests: int, connections: int, rate: float = 0.0
) -> dict[str, Any]:
    """``requests`` requests, POST confirm and GET /auth alternately, over ``connections``
    keep-alive connections spread round-robin over ``ports``, paced at ``rate`` requests a
    second in all (0: as fast as answered); returns the count each port served, the statuses
    and the latencies."""
    conns = [
        (await Connection.open(ports[i % len(ports)]), ports[i % len(ports)])
        for i in range(connections)
    ]
    served: Counter[int] = Counter()
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    # The same share for every connection, so every port serves the same count.
    shares = [requests // connections + (i < requests % connections) for i in range(connections)]

    interval = connections / rate if rate > 0 else 0.0  # one connection's pace
    started = time.perf_counter()

    async def run(conn: Connection, port: int, share: int) -> None:
        last = 0
        for i in range(share):
            if interval:
                await asyncio.sleep(max(0.0, started + i * interval - time.perf_counter()))
            t = time.perf_counter()
            if i % 2 == 0:  # a confirm, then a poll of the same account
                last = next(numbers)
                status, _ = await conn.post(CONFIRM.format(n=last), DEV_KEY)
                statuses[f"POST {status}"] += 1
            else:
                status, _ = await conn.post(AUTH.format(n=last), DEV_KEY, method="GET")
                statuses[f"GET {status}"] += 1
            latencies.append(time.perf_counter() - t)
            served[port] += 1

    try:
        await asyncio.gather(*(run(c, p, n) for (c, p), n in zip(conns, shares, strict=True)))
    finally:
        for c, _ in conns:
            c.close()
    latencies.sort()
    return {
        "seconds": time.perf_counter() - started,
        "served": {str(p): served[p] for p in ports},
        "statuses": dict(statuses),
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def per_request_us(
    window: CpuWindow, served: dict[str, int], ports: dict[str, int], idle: dict[str, float]
) -> dict[str, dict[str, float]]:
    """µs of CPU per request served, raw and less the idle rate, of each replica that served."""
    out = {}
    for name, (u, s) in window.spent.items():
        n = served.get(str(ports[name]), 0)
        if not n:
            continue
        busy = u + s
        out[name] = {
            "requests": n,
            "total_us": busy / n * 1e6,
            "net_us": max(busy - idle[name] * window.wall, 0.0) / n * 1e6,
        }
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    replicas = args.replicas
    workdir = Path(tempfile.mkdtemp(prefix="replica-cost-"))
    keys = dev_keys_file(workdir / "api-keys.json")
    one_n = args.requests // replicas
    accounts = args.rounds * (one_n + args.requests) // 2 + args.rounds * replicas + 300
    stack = start_stack(accounts, workdir, keys, args.start_timeout_s)
    extra: list[subprocess.Popen[bytes]] = []
    try:
        ports = {"replica-0": stack.ports["api"]}
        pids = {"replica-0": stack.pids["front-end"]}
        await until_registered(ports["replica-0"], accounts, args.start_timeout_s)
        for i in range(1, replicas):
            proc, port, _ = start_replica(stack.pids["front-end"], workdir, i)
            extra.append(proc)
            ports[f"replica-{i}"], pids[f"replica-{i}"] = port, proc.pid
        for port in ports.values():
            await until_ready(port, args.start_timeout_s)
        numbers = iter(range(1, accounts + 1))
        await mixed_loop(list(ports.values()), numbers, 60 * replicas, 6 * replicas)  # warm-up
        idle_window = CpuWindow(pids)
        idle_window.start()
        await asyncio.sleep(args.idle_s)
        idle_window.stop()
        idle = {name: (u + s) / idle_window.wall for name, (u, s) in idle_window.spent.items()}
        rounds: list[dict[str, Any]] = []
        for _ in range(args.rounds):
            result: dict[str, Any] = {"loadavg_1m": os.getloadavg()[0]}
            for phase, targets, n, conns, rate in (
                (
                    "one",
                    [ports["replica-0"]],
                    one_n,
                    max(1, args.connections // replicas),
                    args.rate / replicas,
                ),
                ("shared", list(ports.values()), args.requests, args.connections, args.rate),
            ):
                window = CpuWindow(pids)
                window.start()
                load = await asyncio.wait_for(
                    mixed_loop(targets, numbers, n, conns, rate), args.phase_timeout_s
                )
                window.stop()
                result[phase] = load | {
                    "cpu": per_request_us(window, load["served"], ports, idle),
                    "wall_s": window.wall,
                }
            shared = result["shared"]["cpu"]
            one = result["one"]["cpu"]["replica-0"]
            result["ratio_total"] = (
                statistics.mean(c["total_us"] for c in shared.values()) / one["total_us"]
            )
            result["ratio_net"] = (
                statistics.mean(c["net_us"] for c in shared.values()) / one["net_us"]
                if one["net_us"]
                else None
            )
            rounds.append(result)
        ready = await time_to_ready(args, stack.pids["front-end"], stack.ports["broker"], workdir)
    finally:
        for proc in extra:
            stop_process(proc)
        stop_process(stack.proc, 60)
    nets = [r["ratio_net"] for r in rounds if r["ratio_net"] is not None]
    return {
        "parameters": vars(args) | {"out": str(args.out)},
        "machine": machine() | {"loadavg_end": os.getloadavg()},
        "idle_cores": idle,
        "accounts": accounts,
        "seconds_to_ready": ready,
        "rounds": rounds,
        "ratio_total_median": statistics.median(r["ratio_total"] for r in rounds),
        # None when no round's replica used more CPU than at idle (a tiny run can't tell).
        "ratio_net_median": statistics.median(nets) if nets else None,
    }


def report(result: dict[str, Any]) -> str:
    p = result["parameters"]
    lines = [
        f"{p['replicas']} front-end replicas sharing {p['requests']} requests "
        f"(POST confirm and GET /auth alternately, {p['connections']} connections, "
        f"{p['rate'] or 'unpaced'} req/s in all) versus one "
        f"replica with {p['requests'] // p['replicas']}; CPU µs per request per replica "
        "(raw | less idle):",
        "idle cores per replica: "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(result["idle_cores"].items())),
        f"a new replica's seconds from start to ready, with the stack's {result['accounts']} "
        "accounts: "
        + ", ".join(f"{s:.2f}" for s in result["seconds_to_ready"]["accounts"])
        + f"; with {p['state_records']} more account records: "
        + ", ".join(f"{s:.2f}" for s in result["seconds_to_ready"]["more_accounts"])
        + " (of which up, before its readers caught up: "
        + ", ".join(f"{s:.2f}" for s in result["seconds_to_ready"]["accounts_up"])
        + "; "
        + ", ".join(f"{s:.2f}" for s in result["seconds_to_ready"]["more_accounts_up"])
        + ")",
    ]
    for i, r in enumerate(result["rounds"], 1):
        one = r["one"]["cpu"]["replica-0"]
        shared = " ".join(
            f"{name} {c['total_us']:.0f}|{c['net_us']:.0f} ({c['requests']} req)"
            for name, c in sorted(r["shared"]["cpu"].items())
        )
        net = "n/a" if r["ratio_net"] is None else f"{r['ratio_net']:.2f}"
        lines.append(
            f"round {i}: one {one['total_us']:.0f}|{one['net_us']:.0f} µs "
            f"({r['one']['seconds']:.1f} s, p50 {r['one']['p50_ms']:.0f} ms) | shared {shared} "
            f"({r['shared']['seconds']:.1f} s, p50 {r['shared']['p50_ms']:.0f} ms) | ratio "
            f"{r['ratio_total']:.2f} raw, {net} less idle; loadavg {r['loadavg_1m']:.1f}"
        )
        lines.append(f"  statuses one {r['one']['statuses']} shared {r['shared']['statuses']}")
    net_median = result["ratio_net_median"]
    net = "n/a" if net_median is None else f"{net_median:.2f}"
    lines.append(
        f"median ratio: {result['ratio_total_median']:.2f} raw, "
        f"{net} less idle (target ≤ {TARGET_REPLICA_RATIO})"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    result = eventloop.run(measure(args), "uvloop")
    args.out.write_text(json.dumps(clean(result), indent=2, default=str) + "\n")
    print(report(result))
    print(f"written: {args.out}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="N > 1: the replica-cost mode (this module): N front-ends sharing a load versus "
        "one with 1/N of it",
    )
    parser.add_argument("--phase-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--state-records",
        type=int,
        default=100_000,
        help="replica mode: account records added to auth.state between the two series of "
        "--ready-starts",
    )
    parser.add_argument(
        "--ready-starts",
        type=int,
        default=3,
        help="replica mode: new replicas started (one at a time) and timed to ready, before and "
        "after --state-records more account records",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=180.0,
        help="replica mode: requests a second of the shared phase in all (the one replica gets "
        "1/N of it), so both phases run as long and a replica's idle cost weighs the same; "
        "0: closed loops, as fast as answered",
    )
