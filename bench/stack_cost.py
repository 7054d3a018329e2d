"""What a confirm through the front-end costs: per POST against the HTTP-only ceiling, per
process of the whole stack, in Kafka records and provider requests, and its latency.

``python -m bench.stack_cost`` starts the dev stack (``python -m devstack stack``: embedded
broker, simulator, worker, dispatcher, receiver, front-end) on spare loopback ports and the
ceiling (``bench.api_ceiling``) next to it, then:

1. ``--rounds`` times front-end, Kafka floor, ceiling, back to back, the order reversed every
   other round (so neither the front-end nor its floor always runs first): the front-end
   closed loop, ``--connections`` keep-alive connections, ``--requests`` POSTs; the ceiling
   open loop at the rate the front-end just reached (``--ceiling-requests``, default as many),
   so both are at one offered rate; CPU per POST of each from ``/proc/<pid>/stat`` (user and
   system apart), the front-end's and the ceiling's over their load alone (the same window
   rule); the Kafka floor (``bench.kafka_floor``, on
   the stack's broker) is the same count of requests, as many in flight, doing only a POST's
   Kafka part, with its requester's CPU per request; for the front-end phases also every stack
   process's CPU per confirm (the phase plus ``--settle-s`` for the asynchronous tail: status
   events, webhook deliveries), the records each topic gained per confirm (counted by a
   group-less consumer, paused while a phase runs) and the provider calls per confirm
   (``/_sim/stats``);
2. open loop at ``--fractions`` of the front-end's closed-loop rate, ``--latency-s`` each:
   p50/p99 from each request's scheduled time (no coordinated omission), the front-end's CPU
   per request, and the ceiling's at the same offered rate (a paced ceiling: the closed-loop
   one runs at many times the front-end's rate, where a loop wake-up serves many requests).

``--replicas N`` (N > 1) measures something else: N front-end replicas sharing a load versus
one with 1/N of it (``bench.replica_cost``).

Bounded in requests and time; stops the stack itself. Writes ``--out`` (JSON, every figure)
and prints the figures against the targets (figures: bench/README.md, "Front-end cost").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench import baseline, post_trace
from bench.common import REPO_ROOT, base_env, clean, machine, names
from bench.kafka_floor import CLIENTS, Floor
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
from devstack.settings import EMBEDDED_API_FETCH_MAX_WAIT_MS, EMBEDDED_FETCH_MAX_WAIT_MS
from worker.contract.topics import Topics
from worker.engine.tail import partitions_of
from worker.runtime import eventloop

ACCOUNT: Final = "acc_demo_{n}"
ROUTE: Final = "/v1/accounts/" + ACCOUNT + "/auth/passkey-confirm"
TARGET_RATIO: Final = 3.0
TARGET_FLOOR_RATIO: Final = 1.5
TARGET_STACK_MS: Final = 2.5
#: The product's processes, reported apart from the dev stack's (broker, simulator, receiver).
PRODUCT: Final = ("front-end", "worker", "dispatcher")
TARGET_P99_SLACK_MS: Final = 30.0


async def closed_loop(
    port: int, numbers: Iterator[int], requests: int, connections: int, key: str
) -> dict[str, Any]:
    """``requests`` POSTs over ``connections`` connections, each sending its next request when
    the previous one was answered."""
    conns = [await Connection.open(port) for _ in range(connections)]
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    left = iter(range(requests))

    async def run(conn: Connection) -> None:
        for _ in left:
            t = time.perf_counter()
            status, _body = await conn.post(ROUTE.format(n=next(numbers)), key)
            latencies.append(time.perf_counter() - t)
            statuses[status] += 1

    started = time.perf_counter()
    try:
        await asyncio.gather(*(run(c) for c in conns))
    finally:
        for c in conns:
            c.close()
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": requests,
        "seconds": elapsed,
        "rate": requests / elapsed,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "statuses": {str(k): v for k, v in statuses.items()},
    }


#: Below every keep-alive time-out of the servers measured (uvicorn's default is 5 s).
IDLE_REUSE_S = 2.0


async def open_loop(
    port: int,
    numbers: Iterator[int],
    rate: float,
    seconds: float,
    key: str,
    *,
    limit: int,
    cap: int = 400,
    timings: dict[str, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """Arrivals every ``1/rate`` s for ``seconds``, whatever the answers do; each request on an
    idle connection (a new one when none is idle, at most ``cap``). Latency counts from the
    scheduled arrival, so a stall is charged to every request it delays. At most ``limit``
    requests (the demo accounts left). A connection idle for ``IDLE_REUSE_S`` or longer is
    closed rather than reused: the server may have closed it (its keep-alive time-out), and a
    POST written to it would be answered by the end of the stream. ``timings``, when given,
    gets each account's scheduled and answered times (epoch seconds) for ``bench.post_trace``."""
    idle: list[tuple[Connection, float]] = []
    opened = 0
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    total = max(1, min(int(rate * seconds), limit))
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    to_epoch = time.time() - loop.time()
    slots = asyncio.Semaphore(cap)

    async def one(scheduled: float) -> None:
        nonlocal opened
        async with slots:
            conn = None
            while idle and conn is None:
                conn, since = idle.pop()
                if loop.time() - since >= IDLE_REUSE_S:
                    conn.close()
                    conn = None
            if conn is None:
                opened += 1
                conn = await Connection.open(port)
            n = next(numbers)
            status, _ = await conn.post(ROUTE.format(n=n), key)
            latencies.append(loop.time() - scheduled)
            if timings is not None:
                timings[ACCOUNT.format(n=n)] = (scheduled + to_epoch, loop.time() + to_epoch)
            statuses[status] += 1
            idle.append((conn, loop.time()))

    tasks = []
    for i in range(total):
        at = start + i / rate
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(at)))
    await asyncio.gather(*tasks)
    elapsed = loop.time() - start
    for c, _ in idle:
        c.close()
    latencies.sort()
    return {
        "offered_rate": rate,
        "achieved_rate": total / elapsed,
        "requests": total,
        "connections": opened,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": latencies[-1] * 1000,
        "statuses": {str(k): v for k, v in statuses.items()},
    }


# -- Kafka records -----------------------------------------------------------------------------


class RecordCounter:
    """Counts the records every topic gains, with one group-less consumer that is paused
    (fetches nothing, costs the broker nothing) except while it counts."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100
        )
        self.topics = topics
        self.tps: list[TopicPartition] = []
        #: (topic, account) → CreateTime in epoch seconds of the first command, state record
        #: and reply of each account read by the last ``count`` (``bench.post_trace``).
        self.stamps: dict[tuple[str, str], float] = {}

    async def start(self) -> None:
        await self.consumer.start()
        deadline = time.monotonic() + 10
        self.tps = [
            TopicPartition(t, p)
            for t in self.topics
            for p in sorted(await partitions_of(self.consumer, t, deadline=deadline))
        ]
        self.consumer.assign(self.tps)
        await self.consumer.seek_to_beginning(*self.tps)
        await self.count()

    async def count(self, quiet_polls: int = 2) -> Counter[str]:
        """Records per topic since the last count: reads until every partition is at its
        high-water mark and ``quiet_polls`` polls in a row were empty."""
        self.consumer.resume(*self.tps)
        got: Counter[str] = Counter()
        self.stamps = {}
        quiet = 0
        while quiet < quiet_polls:
            chunk = await self.consumer.getmany(timeout_ms=300, max_records=10_000)
            for tp, records in chunk.items():
                got[tp.topic] += len(records)
                if tp.topic in post_trace.TRACED:
                    for record in records:
                        if account := post_trace.account_of(record.value):
                            self.stamps.setdefault((tp.topic, account), record.timestamp / 1000)
            behind = False
            for tp in self.tps:
                high = self.consumer.highwater(tp)
                if high is not None and await self.consumer.position(tp) < high:
                    behind = True
            quiet = 0 if chunk or behind else quiet + 1
        self.consumer.pause(*self.tps)
        return got

    async def stop(self) -> None:
        await self.consumer.stop()


async def sim_calls(port: int) -> int:
    async with httpx.AsyncClient(timeout=5) as client:
        stats = (await client.get(f"http://127.0.0.1:{port}/_sim/stats")).json()
    return int(stats["total_calls"])


def profiler(out_dir: Path | None, pid: int, run: int) -> subprocess.Popen[bytes] | None:
    """py-spy sampling ``pid`` (collapsed stacks, idle frames left out) until SIGINT."""
    if out_dir is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen(
        [
            str(spy),
            "record",
            "-p",
            str(pid),
            "-f",
            "raw",
            "-r",
            "200",
            "--nonblocking",
            "-o",
            str(out_dir / f"front-end-{run}.txt"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# -- the run -----------------------------------------------------------------------------------


def per_request(window: CpuWindow, n: int) -> dict[str, dict[str, float]]:
    """µs of CPU per request of each process: user, system, total."""
    return {
        name: {
            "user_us": u / n * 1e6,
            "system_us": s / n * 1e6,
            "total_us": (u + s) / n * 1e6,
        }
        for name, (u, s) in window.spent.items()
    }


def spread(values: list[float]) -> dict[str, float]:
    """min/median/max; NaN for each when nothing was measurable."""
    if not values:
        return dict.fromkeys(("min", "median", "max"), math.nan)
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="stack-cost-"))
    keys = dev_keys_file(workdir / "api-keys.json")
    latency_total = int(sum(args.fractions) * args.max_rate_guess * args.latency_s * 1.6)
    accounts = args.rounds * args.requests + latency_total + 200
    replies = {"API_REPLY_PARTITIONS": str(args.reply_partitions)} if args.reply_partitions else {}
    stack = start_stack(accounts, workdir, keys, args.start_timeout_s, replies)
    ceiling_port = free_port()
    ceiling = subprocess.Popen(  # noqa: ASYNC220 - started once, before any measurement
        [
            sys.executable,
            "-m",
            "bench.api_ceiling",
            "--port",
            str(ceiling_port),
            "--keys-file",
            str(keys),
        ],
        cwd=REPO_ROOT,
        env=base_env(),
        stdin=subprocess.DEVNULL,
    )
    counter: RecordCounter | None = None
    floors: dict[str, Floor] = {}
    floor_n = args.floor_requests or args.requests
    try:
        await asyncio.to_thread(wait_for_port, "127.0.0.1", ceiling_port, 30)
        api = stack.ports["api"]
        await until_registered(api, accounts, args.start_timeout_s)
        for client in [] if args.no_floor else args.floor_clients:
            # The fetch waits the stack gives the worker (the echo's part) and the front-end's
            # reply consumer on the embedded broker.
            floors[client] = await Floor.start(
                f"127.0.0.1:{stack.ports['broker']}",
                echo_fetch_wait_ms=EMBEDDED_FETCH_MAX_WAIT_MS,
                reply_fetch_wait_ms=EMBEDDED_API_FETCH_MAX_WAIT_MS,
                in_flight=args.connections,
                size=args.floor_size,
                delay_ms=args.floor_delay_ms,
                timeout_s=args.start_timeout_s,
                client=client,
            )
        numbers = iter(range(1, accounts + 1))
        # Warm them up (imports, first connections) outside every window.
        await closed_loop(ceiling_port, iter(range(10**9, 10**9 + 200)), 200, 10, DEV_KEY)
        await closed_loop(api, numbers, 50, 10, DEV_KEY)
        for floor in floors.values():
            await floor_phase(floor, 200)
        topics = Topics().all()
        counter = RecordCounter(f"127.0.0.1:{stack.ports['broker']}", topics)
        await counter.start()
        # The floors' requesters and the ceiling idle beside the stack: each one's idle cost
        # is left out of its busy figure below, as the front-end's is.
        idle = CpuWindow(
            stack.pids
            | {"ceiling": ceiling.pid}
            | {f"floor-{c}": floor.pids["requester"] for c, floor in floors.items()}
        )
        idle.start()
        await asyncio.sleep(args.idle_s)
        idle.stop()
        ceiling_runs: list[dict[str, Any]] = []
        floor_runs: dict[str, list[dict[str, Any]]] = {client: [] for client in floors}
        frontend_runs: list[dict[str, Any]] = []
        fake = iter(range(10**9, 2 * 10**9))

        async def ceiling_phase() -> None:
            """The ceiling at the rate the front-end last reached: paced alike, both pay the
            same wake-ups per request (closed loop it ran at many times the front-end's rate,
            where one wake-up serves many requests)."""
            rate = frontend_runs[-1]["rate"]
            n = args.ceiling_requests or args.requests
            window = CpuWindow({"ceiling": ceiling.pid})
            loadavg = os.getloadavg()[0]
            window.start()
            load = await open_loop(ceiling_port, fake, rate, (n + 0.5) / rate, DEV_KEY, limit=n)
            window.stop()
            ceiling_runs.append(
                load
                | {
                    "cpu": per_request(window, load["requests"])["ceiling"],
                    "loadavg_1m": loadavg,
                    "window_s": window.wall,
                }
            )

        async def floor_phases() -> None:
            for client, floor in floors.items():
                pids = floor.pids | {"broker": stack.pids["broker"]}
                floor_runs[client].append(await floor_phase(floor, floor_n, CpuWindow(pids)))

        for i in range(args.rounds):
            if i % 2:
                await ceiling_phase()
                await floor_phases()
            calls = await sim_calls(stack.ports["simulator"])
            spy = profiler(args.profile, stack.pids["front-end"], len(frontend_runs))
            window = CpuWindow(stack.pids)
            # The front-end's own figure ends with its load, as the ceiling's does; the
            # stack's window also takes the settle, for the worker's and dispatcher's tail.
            own = CpuWindow({"front-end": stack.pids["front-end"]})
            loadavg = os.getloadavg()[0]
            window.start()
            own.start()
            load = await closed_loop(api, numbers, args.requests, args.connections, DEV_KEY)
            own.stop()
            await asyncio.sleep(args.settle_s)
            window.stop()
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                await asyncio.to_thread(spy.wait, 30)
            records = await counter.count()
            calls = await sim_calls(stack.ports["simulator"]) - calls
            cpu = per_request(window, args.requests)
            frontend_runs.append(
                load
                | {
                    "cpu": cpu,
                    "stack_total_us": sum(c["total_us"] for c in cpu.values()),
                    "product_total_us": product_sum(cpu),
                    "window_s": window.wall,
                    "records_per_confirm": {
                        t: n / args.requests for t, n in sorted(records.items())
                    },
                    "records_total_per_confirm": sum(records.values()) / args.requests,
                    "provider_calls_per_confirm": calls / args.requests,
                    "loadavg_1m": loadavg,
                    "frontend_cpu": per_request(own, args.requests)["front-end"],
                    "frontend_window_s": own.wall,
                    "first": i % 2 == 0,
                }
            )
            if i % 2 == 0:
                await floor_phases()
                await ceiling_phase()
        max_rate = statistics.median(r["rate"] for r in frontend_runs)
        latency = []
        for fraction in args.fractions if args.latency_s > 0 else []:
            left = accounts - next(numbers) + 1
            window = CpuWindow({"front-end": stack.pids["front-end"]})
            timings: dict[str, tuple[float, float]] = {}
            window.start()
            point = await open_loop(
                api,
                numbers,
                max_rate * fraction,
                args.latency_s,
                DEV_KEY,
                limit=left,
                timings=timings,
            )
            window.stop()
            await asyncio.sleep(args.settle_s)
            await counter.count()
            trace = post_trace.summary(post_trace.legs(timings, counter.stamps))
            # The ceiling at the same offered rate: the closed-loop ceiling runs at many times
            # the front-end's rate, where one loop wake-up serves many requests; paced, both
            # pay the same per-request wake-ups, so this ratio compares code, not rates.
            paced = CpuWindow({"ceiling": ceiling.pid})
            paced.start()
            ceiling_point = await open_loop(
                ceiling_port, fake, max_rate * fraction, args.latency_s, DEV_KEY, limit=left
            )
            paced.stop()
            latency.append(
                point
                | {
                    "fraction": fraction,
                    "frontend_cpu_us": per_request(window, point["requests"])["front-end"],
                    "ceiling_cpu_us": per_request(paced, ceiling_point["requests"])["ceiling"],
                    "trace": trace,
                }
            )
    finally:
        if counter is not None:
            await counter.stop()
        await asyncio.gather(*(floor.stop() for floor in floors.values()))
        stop_process(ceiling)
        stop_process(stack.proc, 60)
    # A run too short for the ceiling to use one clock tick of CPU has no ratio (None), not
    # an infinite one: /proc counts CPU in 10 ms ticks.
    ratios = [
        frontend_us(f) / c["cpu"]["total_us"] if c["cpu"]["total_us"] else None
        for c, f in zip(ceiling_runs, frontend_runs, strict=True)
    ]
    idle_cores = {name: (u + s) / idle.wall for name, (u, s) in idle.spent.items()}
    aiokafka_floor = floor_figures(
        ceiling_runs, frontend_runs, floor_runs.get("aiokafka", []), idle_cores, "aiokafka"
    )
    return {
        "parameters": vars(args) | {"out": str(args.out)},
        "machine": machine() | {"loadavg_end": os.getloadavg()},
        "pids": stack.pids,
        "idle_cores": idle_cores,
        "ceiling": ceiling_runs,
        "floor": floor_runs.get("aiokafka", []),
        "frontend": frontend_runs,
        "ratio": ratios,
        "ratio_spread": spread([r for r in ratios if r is not None]),
        **aiokafka_floor,
        # The same floor with the requester on librdkafka: what a C client would leave.
        "floor_confluent": {
            "runs": runs,
            **floor_figures(ceiling_runs, frontend_runs, runs, idle_cores, "confluent"),
        }
        if (runs := floor_runs.get("confluent"))
        else None,
        "ceiling_us_spread": spread([c["cpu"]["total_us"] for c in ceiling_runs]),
        "frontend_us_spread": spread([frontend_us(f) for f in frontend_runs]),
        "stack_us_spread": spread([f["stack_total_us"] for f in frontend_runs]),
        "product_us_spread": spread([f["product_total_us"] for f in frontend_runs]),
        "max_rate": max_rate,
        "latency": latency,
        "provider_latency_ms": args.provider_latency_ms,
    }


def frontend_us(run: dict[str, Any]) -> float:
    """The front-end's CPU per POST over its load alone (a run from before that figure: over
    the stack's window, settle included)."""
    own = run.get("frontend_cpu") or run["cpu"]["front-end"]
    return float(own["total_us"])


def product_sum(cpu: dict[str, dict[str, float]]) -> float:
    """The product's processes' CPU per confirm in one round's per-process figures (summed in
    the report's order: float sums depend on it)."""
    return sum(c["total_us"] for name, c in cpu.items() if name in PRODUCT)


def product_us(run: dict[str, Any]) -> float | None:
    """The product's three processes' CPU per confirm in a front-end round; a tree from before
    that figure (237ce6f) has the processes' own, so it is summed from them alike."""
    if run.get("product_total_us") is not None:
        return float(run["product_total_us"])
    cpu = run.get("cpu", {})
    return product_sum(cpu) if all(name in cpu for name in PRODUCT) else None


def baseline_figures(result: dict[str, Any]) -> dict[str, float]:
    """What ``--baseline`` compares: medians over the rounds of the stack's, the front-end's
    and each process's CPU per confirm, the ceiling, the floors, the rate and the p99s."""

    def median(values: list[Any]) -> float:
        real = [float(v) for v in values if v is not None]
        return statistics.median(real) if real else math.nan

    runs = result["frontend"]
    out = {
        "stack µs/confirm": median([r["stack_total_us"] for r in runs]),
        "product µs/confirm": median([product_us(r) for r in runs]),
        "front-end ÷ ceiling": median(result["ratio"]),
        # From the rounds, not ``frontend_by_floor``: a tree from before it has the parts.
        "front-end ÷ floor": median(
            [
                frontend_us(f) / (c["cpu"]["total_us"] + u)
                for c, f, u in zip(
                    result["ceiling"], runs, result.get("floor_us", []), strict=False
                )
                if c["cpu"]["total_us"] + u
            ]
        ),
        "ceiling µs/POST": median([c["cpu"]["total_us"] for c in result["ceiling"]]),
        "Kafka floor µs/req": median(result.get("floor_us", [])),
        "closed-loop rate /s": float(result["max_rate"]),
    }
    for name in runs[0]["cpu"] if runs else []:
        out[f"{name} µs/confirm"] = median([r["cpu"][name]["total_us"] for r in runs])
    for point in result["latency"]:
        out[f"p99 ms at {point['fraction']:.0%}"] = float(point["p99_ms"])
    return out


def floor_figures(
    ceiling_runs: list[dict[str, Any]],
    frontend_runs: list[dict[str, Any]],
    floor_runs: list[dict[str, Any]],
    idle_cores: dict[str, float] | None = None,
    client: str = "aiokafka",
) -> dict[str, Any]:
    """A floor's CPU per request beside the ceiling's and the front-end's, round by round.

    ``frontend_by_floor_busy`` is the same ratio with each side's idle cost left out (its CPU
    while the stack idles, in cores, times its phase's wall time): on the embedded broker a
    fetch is held for its whole wait, so the front-end's readers fetch ~100 times a second
    with nothing to do, a fixed cost per second that its closed loop spreads over ~6 times
    fewer requests than the Kafka floor's (bench/README.md, "Front-end cost")."""
    floor_us = [f["cpu"]["total_us"] for f in floor_runs]
    idle = idle_cores or {}

    def busy(
        total_us: float, cores: float, run: dict[str, Any], n: int, key: str = "window_s"
    ) -> float | None:
        if key not in run or not n:
            return None
        return float(total_us - cores * run[key] * 1e6 / n)

    busy_ratios: list[float | None] = []
    for c, f, u in zip(ceiling_runs, frontend_runs, floor_runs, strict=False):
        wall = "frontend_window_s" if "frontend_window_s" in f else "window_s"
        fe = busy(frontend_us(f), idle.get("front-end", 0.0), f, f.get("requests", 0), wall)
        ce = busy(c["cpu"]["total_us"], idle.get("ceiling", 0.0), c, c.get("requests", 0))
        fl = busy(u["cpu"]["total_us"], idle.get(f"floor-{client}", 0.0), u, u.get("requests", 0))
        busy_ratios.append(
            None if fe is None or ce is None or fl is None or ce + fl <= 0 else fe / (ce + fl)
        )
    # (ceiling + floor) ÷ ceiling: what a front-end costing only HTTP and Kafka would score.
    floor_ratios = [
        (c["cpu"]["total_us"] + f) / c["cpu"]["total_us"] if c["cpu"]["total_us"] else None
        for c, f in zip(ceiling_runs, floor_us, strict=False)
    ]
    # The front-end ÷ its floor (the HTTP ceiling + the Kafka floor): what of its CPU per POST
    # is its own code, next to front-end ÷ ceiling.
    by_floor = [
        frontend_us(f) / (c["cpu"]["total_us"] + u) if c["cpu"]["total_us"] + u else None
        for c, f, u in zip(ceiling_runs, frontend_runs, floor_us, strict=False)
    ]
    return {
        "floor_us": floor_us,
        "floor_ratio": floor_ratios,
        "frontend_by_floor": by_floor,
        "frontend_by_floor_spread": spread([r for r in by_floor if r is not None]),
        "floor_ratio_spread": spread([r for r in floor_ratios if r is not None]),
        "frontend_minus_floor_us": [
            frontend_us(f) - u for f, u in zip(frontend_runs, floor_us, strict=False)
        ],
        "floor_us_spread": spread(floor_us),
        "frontend_by_floor_busy": busy_ratios,
        "frontend_by_floor_busy_spread": spread([r for r in busy_ratios if r is not None]),
    }


async def floor_phase(floor: Floor, n: int, window: CpuWindow | None = None) -> dict[str, Any]:
    """One Kafka-floor phase of ``n`` requests; with ``window`` (the requester, the echo, the
    broker), the CPU per request of each: ``cpu`` is the requester's, ``processes`` all of
    them (the echo stands in for the worker; neither it nor the broker is the floor)."""
    await floor.resume_echo()
    loadavg = os.getloadavg()[0]
    if window is not None:
        window.start()
    load = await floor.run(n)
    if window is not None:
        window.stop()
    await floor.pause_echo()
    if window is None:
        return load
    cpu = per_request(window, n)
    return load | {
        "cpu": cpu["requester"],
        "processes": cpu,
        "loadavg_1m": loadavg,
        "window_s": window.wall,
        "requests": n,
    }


def report(result: dict[str, Any]) -> str:
    ratio = result["ratio_spread"]
    stack = result["stack_us_spread"]
    product = result["product_us_spread"]
    last = result["frontend"][-1]
    lines = [
        "ceiling CPU/POST µs  "
        + " / ".join(f"{c['cpu']['total_us']:,.0f}" for c in result["ceiling"]),
        "front-end CPU/POST µs "
        + " / ".join(
            f"{own['total_us']:,.0f} (u {own['user_us']:,.0f} s {own['system_us']:,.0f})"
            for own in (f.get("frontend_cpu") or f["cpu"]["front-end"] for f in result["frontend"])
        )
        + " (over its load; the ceiling paced at its rate, rounds alternating in order)",
        f"front-end ÷ ceiling  {ratio['min']:.2f}-{ratio['max']:.2f}x"
        f"  target ≤ {TARGET_RATIO}x  {'OK' if ratio['median'] <= TARGET_RATIO else 'MISS'}",
        *(
            [
                f"front-end ÷ floor    {by['min']:.2f}-{by['max']:.2f}x  (floor = ceiling + "
                f"Kafka floor; target ≤ {TARGET_FLOOR_RATIO}x  "
                f"{'OK' if by['median'] <= TARGET_FLOOR_RATIO else 'MISS'})"
            ]
            if result["floor"]
            and not math.isnan((by := result["frontend_by_floor_spread"])["median"])
            else []
        ),
        *(
            [
                f"  idle cost left out {busy['min']:.2f}-{busy['max']:.2f}x  (each side's CPU"
                " while the stack idles, times its phase's time, per request)"
            ]
            if result["floor"]
            and not math.isnan((busy := result["frontend_by_floor_busy_spread"])["median"])
            else []
        ),
        *floor_lines(result["floor"], result, "Kafka floor"),
        *floor_lines(
            (result["floor_confluent"] or {}).get("runs", []),
            result["floor_confluent"],
            "Kafka floor, librdkafka",
            with_rest=False,
        ),
        f"stack CPU/confirm    {stack['min'] / 1000:.2f}-{stack['max'] / 1000:.2f} ms"
        f"  target ≤ {TARGET_STACK_MS} ms"
        f"  {'OK' if stack['median'] / 1000 <= TARGET_STACK_MS else 'MISS'}",
        f"  the product's three processes (front-end, worker, dispatcher)"
        f" {product['min'] / 1000:.2f}-{product['max'] / 1000:.2f} ms; the dev stack's"
        " (embedded broker, simulator, demo receiver) the rest",
        "  per process (last run, µs): "
        + ", ".join(f"{k} {v['total_us']:,.0f}" for k, v in last["cpu"].items()),
        # The embedded broker's fetches cost more as a partition's history grows
        # (bench/README.md, "The embedded broker slows with history"): round by round.
        "  broker per round (µs): "
        + " / ".join(f"{f['cpu']['broker']['total_us']:,.0f}" for f in result["frontend"]),
        f"  records/confirm {last['records_total_per_confirm']:.2f}: "
        + ", ".join(f"{k} {v:.2f}" for k, v in last["records_per_confirm"].items()),
        f"  provider calls/confirm {last['provider_calls_per_confirm']:.2f}",
        f"max rate (closed loop, {result['parameters']['connections']} conns) "
        f"{result['max_rate']:,.0f}/s",
    ]
    limit = result["provider_latency_ms"] + TARGET_P99_SLACK_MS
    for point in result["latency"]:
        verdict = ""
        if point["fraction"] == 0.5:
            verdict = (
                f"  target p99 ≤ {limit:.0f} ms {'OK' if point['p99_ms'] <= limit else 'MISS'}"
            )
        lines.append(
            f"open loop {point['fraction']:.0%} ({point['offered_rate']:,.0f}/s): "
            f"p50 {point['p50_ms']:.1f} ms p99 {point['p99_ms']:.1f} ms{verdict}"
        )
        if "ceiling_cpu_us" in point:
            fe, ce = point["frontend_cpu_us"]["total_us"], point["ceiling_cpu_us"]["total_us"]
            paced = f"{fe / ce:.2f}x" if ce else "no ratio"
            lines.append(
                f"  paced at that rate, CPU/request µs: front-end {fe:,.0f}, ceiling {ce:,.0f}"
                f" ({paced})"
            )
        if "trace" in point:
            lines.extend(post_trace.lines(point["trace"]))
    return "\n".join(lines)


def floor_lines(
    runs: list[dict[str, Any]], figures: Any, name: str, *, with_rest: bool = True
) -> list[str]:
    """A Kafka floor beside the front-end (nothing when the run had no such phases);
    ``with_rest``: what the front-end spends above it (only meaningful for the front-end's
    own client)."""
    if not runs:
        return []
    ratio = figures["floor_ratio_spread"]
    if math.isnan(ratio["median"]):
        verdict = "no ratio: the ceiling used no CPU tick"
    else:
        side = "above" if ratio["median"] > TARGET_RATIO else "within"
        verdict = f"{side} the {TARGET_RATIO}x target with no front-end code at all"
    return [
        f"{name} CPU/req µs "
        + " / ".join(
            f"{f['cpu']['total_us']:,.0f} (u {f['cpu']['user_us']:,.0f}"
            f" s {f['cpu']['system_us']:,.0f}; {f['rate']:,.0f}/s)"
            for f in runs
        ),
        f"  (ceiling + floor) ÷ ceiling  {ratio['min']:.2f}-{ratio['max']:.2f}x  ({verdict})",
        *(
            ["  front-end - floor µs  " + " / ".join(f"{x:,.0f}" for x in rest)]
            if (rest := figures["frontend_minus_floor_us"]) and with_rest
            else []
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stack_cost", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument(
        "--ceiling-requests",
        type=int,
        default=None,
        help="POSTs of each ceiling phase, paced at the front-end's rate (default --requests)",
    )
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle window (fetch loops)")
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument(
        "--fractions", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 0.5, 0.9]
    )
    parser.add_argument("--latency-s", type=float, default=8.0, help="0: no latency points")
    parser.add_argument(
        "--max-rate-guess",
        type=float,
        default=600.0,
        help="sizes the demo accounts registered for the open-loop points",
    )
    parser.add_argument("--provider-latency-ms", type=float, default=20.0)
    parser.add_argument("--start-timeout-s", type=float, default=120.0)
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the front-end")
    parser.add_argument(
        "--reply-partitions",
        type=int,
        default=1,
        help="auth.replies partitions the front-end reads: 1, the product's default (as "
        "c650674's stack ran it); 0, the dev stack's every one, which keeps a long run's reply "
        "fetches small on the embedded broker and costs its broker more per confirm in a short "
        "one (bench/README.md, 'Front-end cost')",
    )
    parser.add_argument("--no-floor", action="store_true", help="no Kafka-floor phases")
    parser.add_argument(
        "--floor-clients",
        type=names(CLIENTS, "clients"),
        default=list(CLIENTS),
        help="the floor requester's Kafka clients, one floor phase each per round "
        f"(default {','.join(CLIENTS)}: aiokafka is the front-end's; librdkafka asks what a "
        "C client would leave)",
    )
    parser.add_argument(
        "--floor-requests", type=int, default=None, help="per floor phase (default --requests)"
    )
    parser.add_argument("--floor-size", type=int, default=400, help="bytes per floor record")
    parser.add_argument(
        "--floor-delay-ms",
        type=float,
        default=0.0,
        help="the floor's echo holds each batch this long (a floor at a lower rate)",
    )
    parser.add_argument("--out", type=Path, default=None)
    from bench import replica_cost

    replica_cost.add_arguments(parser)
    baseline.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.baseline:
        return baseline.run(
            module="bench.stack_cost",
            argv=sys.argv[1:] if argv is None else argv,
            parser=parser,
            ref=args.baseline,
            rounds=args.baseline_rounds,
            out_args=lambda d: ["--out", str(d / "stack-cost.json")],
            results_file=lambda d: d / "stack-cost.json",
            figures=baseline_figures,
            summary=args.baseline_json,
        )
    if args.replicas > 1:
        args.out = args.out or REPO_ROOT / "bench" / "replica-cost.json"
        return replica_cost.run(args)
    args.out = args.out or REPO_ROOT / "bench" / "stack-cost.json"
    result = eventloop.run(measure(args), "uvloop")
    args.out.write_text(json.dumps(clean(result), indent=2, default=str) + "\n")
    print(report(result))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
