"""``python -m bench`` (``make bench``): throughput, latency, CPU, memory and restore.

Everything runs on this machine, over loopback: an embedded broker, the provider simulator
(``python -m devstack simulator``, its own process), and one scenario after another, each on
fresh topics and a fresh consumer group, each contender in its own process(es); ``--rounds``
times, the order reversed every other round (so neither a process nor its floor always runs
first), each figure the median over the rounds; every CPU window ends by the same rule
(``--settle-s`` after the last reply and status event); ``--rate`` runs them all at one
offered rate:

==================  ======================================================================
ceiling             pass-through consumer: decodes nothing, calls nothing, produces the same
                    records per command as the worker (``bench.proc``)
floor               the worker's floor: decodes, makes the worker's provider call with its
                    HTTP client, the worker's state record, then reply and event, per batch
                    (states acknowledged first); each account in order; commits every 0.2 s;
                    no decision table, retries or instrumentation (``bench.floor``)
batched             the worker's decision, provider adapter and full records in the floor's
                    shape: per batch, states then one ack wait, replies and events then one
                    more; no engine lanes or instrumentation (``bench.batched``)
baseline            partition-ordered loop: one record at a time per partition, partitions
                    concurrent, HTTP provider (``bench.proc``)
worker-1p           ``python -m worker run``, HTTP provider
worker-2p           two ``python -m worker run`` in one consumer group, HTTP provider
worker-inproc       the HTTP adapter on the in-process simulator transport (no sockets)
baseline-spread     the baseline, ``spread`` mix (repeat confirms per account)
worker-1p-spread    worker-1p, ``spread`` mix
batched-spread      the batched contender, ``spread`` mix (each account's order across batches)
==================  ======================================================================

Every scenario first registers its accounts (``register_account`` at
``passkey_confirmation``, provider ``simulator``, unique refs) and waits for their status
events; then the confirm phase is measured: commands/s, end-to-end latency (command
``issued_at`` → reply record timestamp on auth.replies), CPU µs per command and peak RSS of the
contender process(es). Then a latency curve (open-loop arrivals at fractions of worker-1p's
maximum rate), state bytes per account and the restore rate of one partition.

Writes ``results.json`` and ``results.png`` into ``--out-dir`` (default ``bench/``) and prints
the table. See ``bench/README.md`` for the method, the measured numbers and what limits them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx
from aiokafka.admin import AIOKafkaAdminClient

from bench import baseline
from bench.common import (
    REPO_ROOT,
    base_env,
    clean,
    fmt,
    fractions,
    ints,
    names,
    run_meta,
    topics_named,
)
from bench.load import (
    Mix,
    Outputs,
    Progress,
    SendLog,
    Workload,
    percentile,
    proc_cpu_s,
    proc_peak_rss,
    proc_user_sys_s,
    produce_confirms,
    produce_registrations,
)
from bench.memory import restore_rate, store_memory
from bench.procs import Proc, start_proc, start_profiler, stop_procs
from bench.stack import samples_of
from devstack.broker import EmbeddedBroker, free_port, wait_for_port
from devstack.settings import EMBEDDED_FETCH_MAX_WAIT_MS, EMBEDDED_OFFSET_GAP_HOLD_S
from worker.contract.topics import Topics
from worker.engine.kafka import build_producer, client_options, ensure_topics
from worker.runtime import eventloop
from worker.settings import Settings

WORKER_DEFAULT_IN_FLIGHT: int = Settings.model_fields["worker_max_in_flight"].default
WINDOW: int = Settings.model_fields["worker_dedup_window"].default
HTTP_WORKERS_1P = ("worker-1p",)
HTTP_WORKERS = ("worker-1p", "worker-2p")
#: The sample a worker's /metrics shows once it has been assigned partitions.
ASSIGNED = ("passkey_auth_rebalances_total", (("kind", "assigned"),))
Kind = Literal["ceiling", "floor", "batched", "baseline", "worker"]
Provider = Literal["http", "inproc"]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    kind: Kind
    processes: int = 1
    provider: Provider = "http"
    mix: Mix = "fresh"
    rate: float | None = None  # None: send as fast as possible (throughput run)
    commands: int | None = None  # None: --commands
    max_in_flight: int | None = None  # None: --max-in-flight, else the worker's default


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("ceiling", "ceiling"),
        Scenario("floor", "floor"),
        Scenario("batched", "batched"),
        Scenario("baseline", "baseline"),
        Scenario("worker-1p", "worker"),
        Scenario("worker-2p", "worker", processes=2),
        Scenario("worker-inproc", "worker", provider="inproc"),
        Scenario("baseline-spread", "baseline", mix="spread"),
        Scenario("worker-1p-spread", "worker", mix="spread"),
        Scenario("batched-spread", "batched", mix="spread"),
    )
}
QUICK_SCENARIOS = ("ceiling", "floor", "baseline", "worker-1p", "worker-2p", "worker-inproc")


class ScenarioFailed(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Throughput/latency benchmark of the worker against a ceiling and a "
        "partition-ordered baseline, on an embedded broker and the provider simulator.",
    )
    p.add_argument("--quick", action="store_true", help="CI smoke size (under two minutes)")
    p.add_argument("--partitions", type=int, default=12, help="partitions per topic (12)")
    p.add_argument("--commands", type=int, default=None, help="confirms per scenario (20000)")
    p.add_argument("--accounts", type=int, default=None, help="accounts of the spread mix (5000)")
    p.add_argument(
        "--mix",
        choices=["fresh", "spread"],
        default="fresh",
        help="mix of the main scenarios: fresh = one freshly registered account per confirm "
        "(every command calls the provider; default); spread = confirms round-robin over "
        "--accounts accounts (only the first per account calls the provider)",
    )
    p.add_argument("--latency-ms", type=float, default=20.0, help="provider median latency (20)")
    p.add_argument("--jitter-ms", type=float, default=5.0, help="provider latency std dev (5)")
    p.add_argument(
        "--scenarios",
        type=names(SCENARIOS, "scenarios"),
        default=None,
        help=f"comma list of {','.join(SCENARIOS)}",
    )
    p.add_argument(
        "--curve",
        type=fractions,
        default=None,
        help="open-loop rates as fractions of worker-1p's max (0.1,0.25,0.5,0.75); '' skips",
    )
    p.add_argument(
        "--curve-seconds", type=float, default=None, help="length of each curve run (20)"
    )
    p.add_argument(
        "--max-rate",
        type=float,
        default=None,
        help="max rate for the curve when worker-1p is not run (commands/s)",
    )
    p.add_argument(
        "--memory-sizes",
        type=ints,
        default=None,
        help="accounts for the state memory measurement (100000,1000000)",
    )
    p.add_argument(
        "--restore-records", type=int, default=None, help="records for the restore rate (200000)"
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="WORKER_MAX_IN_FLIGHT of the worker scenarios without their own (default: the "
        "worker's default, 1000)",
    )
    p.add_argument(
        "--provider-max-connections",
        type=int,
        default=None,
        help="PROVIDER_MAX_CONNECTIONS of the HTTP contenders (default: the worker's default)",
    )
    p.add_argument(
        "--gc-threshold",
        type=int,
        default=None,
        help="WORKER_GC_THRESHOLD of the contenders (default: the worker's default; 0: "
        "the interpreter's)",
    )
    p.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=None,
        help="KAFKA_FETCH_MAX_WAIT_MS of the contenders (default 20: the embedded broker holds "
        "every fetch for the full wait, so the production default of 500 would be latency)",
    )
    p.add_argument(
        "--follow-up-poll-s",
        type=float,
        default=3600.0,
        help="WORKER_FOLLOW_UP_POLL_S: pushed past the run (3600) so the measured work is "
        "the command path only; lower it to include the follow-up polls",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="runs of every scenario, the order reversed each round so no contender always "
        "goes first (default 2; --quick 1); figures are the medians over the rounds",
    )
    p.add_argument(
        "--settle-s",
        type=float,
        default=0.3,
        help="every scenario's CPU window ends this long after its last reply and status "
        "event arrived (0.3: past one commit interval), the same rule for all",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="send the main scenarios' confirms open-loop at this rate (commands/s), so "
        "every contender is measured at the same offered rate (default: as fast as possible)",
    )
    p.add_argument(
        "--phase-timeout", type=float, default=300.0, help="bound of each phase in seconds"
    )
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench")
    p.add_argument("--no-plot", action="store_true", help="skip results.png")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="directory for py-spy profiles (raw collapsed stacks) of the worker scenarios",
    )
    p.add_argument(
        "--cprofile",
        type=Path,
        default=None,
        help="directory for cProfile files (CPU time, bench.cprofiled) of the python -m "
        "worker run, floor and batched contenders, where py-spy cannot attach; cProfile "
        "slows them, so read shares, not times",
    )
    p.add_argument(
        "--latency-trace",
        type=Path,
        default=None,
        help="directory for per-command step timestamps, collector pauses and loop lag "
        "(bench.latency_trace) of the python -m worker run contenders; "
        "python -m bench.latency_trace report FILE... breaks them down",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep contender logs (temp dir)")
    p.add_argument(
        "--record-spans",
        action="store_true",
        help="record every span of the python -m worker run contenders and drop it "
        "(bench.traced): what tracing costs, apart from a collector",
    )
    p.add_argument(
        "--webhooks",
        action="store_true",
        help="run the webhook delivery benchmark instead (bench.webhooks); every other flag is "
        "then one of its flags (python -m bench.webhooks --help)",
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="LOG_LEVEL of the contender processes (WARNING)",
    )
    baseline.add_arguments(p)
    return p


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    quick = args.quick
    defaults: dict[str, Any] = {
        "commands": 1500 if quick else 20_000,
        "accounts": 500 if quick else 5000,
        "scenarios": list(QUICK_SCENARIOS) if quick else list(SCENARIOS),
        "curve": [0.1, 0.5] if quick else [0.1, 0.25, 0.5, 0.75],
        "curve_seconds": 3.0 if quick else 20.0,
        "memory_sizes": [20_000, 100_000] if quick else [100_000, 1_000_000],
        "restore_records": 20_000 if quick else 200_000,
        "rounds": 1 if quick else 2,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------


@dataclass
class CpuSnapshot:
    contender: float
    contender_user: float
    broker: float
    simulator: float
    load: float
    wall: float


@dataclass
class Bench:
    args: argparse.Namespace
    bootstrap: str
    broker_pid: int | None
    log_dir: Path
    tag: str
    sim_url: str = ""
    sim_proc: Proc | None = None
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=10))
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    # -- settings --------------------------------------------------------------------------

    def settings_for(self, topics: Topics, group: str) -> Settings:
        return Settings(
            kafka_bootstrap_servers=self.bootstrap,
            kafka_consumer_group=group,
            commands_partitions=self.args.partitions,
            other_partitions=self.args.partitions,
            kafka_offset_gap_hold_s=EMBEDDED_OFFSET_GAP_HOLD_S,
            provider_urls={"simulator": self.sim_url or "http://127.0.0.1:1"},
            topics=topics,
        )

    def env_for(
        self, settings: Settings, probes_port: int | None, max_in_flight: int | None
    ) -> dict[str, str]:
        a = self.args
        env = base_env(a.log_level)
        env.update(
            {
                "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                "KAFKA_CONSUMER_GROUP": settings.kafka_consumer_group,
                "KAFKA_SESSION_TIMEOUT_MS": "6000",
                "KAFKA_HEARTBEAT_INTERVAL_MS": "500",
                "KAFKA_FETCH_MAX_WAIT_MS": str(a.fetch_max_wait_ms or EMBEDDED_FETCH_MAX_WAIT_MS),
                "KAFKA_OFFSET_GAP_HOLD_S": str(EMBEDDED_OFFSET_GAP_HOLD_S),
                "COMMANDS_PARTITIONS": str(a.partitions),
                "OTHER_PARTITIONS": str(a.partitions),
                "PROVIDER_URLS": json.dumps(settings.provider_urls),
                "WORKER_METRICS_HOST": "127.0.0.1",
                "WORKER_METRICS_PORT": str(probes_port or 0),
                "WORKER_SHUTDOWN_GRACE_S": "5",
                "WORKER_FOLLOW_UP_POLL_S": str(a.follow_up_poll_s),
                "SIMULATOR_LATENCY_MS": str(a.latency_ms),
                "SIMULATOR_JITTER_MS": str(a.jitter_ms),
            }
        )
        if max_in_flight is not None:
            env["WORKER_MAX_IN_FLIGHT"] = str(max_in_flight)
        if a.gc_threshold is not None:
            env["WORKER_GC_THRESHOLD"] = str(a.gc_threshold)
        if a.provider_max_connections is not None:
            env["PROVIDER_MAX_CONNECTIONS"] = str(a.provider_max_connections)
        topics = settings.topics
        env.update({f"TOPIC_{f.upper()}": getattr(topics, f) for f in Topics.model_fields})
        return env

    # -- simulator -------------------------------------------------------------------------

    async def start_simulator(self) -> None:
        port = free_port()
        env = base_env() | {
            "SIMULATOR_HOST": "127.0.0.1",
            "SIMULATOR_PORT": str(port),
            "SIMULATOR_LATENCY_MS": str(self.args.latency_ms),
            "SIMULATOR_JITTER_MS": str(self.args.jitter_ms),
        }
        self.sim_proc = start_proc("simulator", ["-m", "devstack", "simulator"], env, self.log_dir)
        await asyncio.to_thread(wait_for_port, "127.0.0.1", port, 30.0)
        self.sim_url = f"http://127.0.0.1:{port}"
        (await self.http.get(f"{self.sim_url}/healthz")).raise_for_status()

    async def sim_calls(self) -> int:
        """Provider calls the simulator has answered since its last reset."""
        if not self.sim_url:
            return 0
        answer = await self.http.get(f"{self.sim_url}/_sim/stats")
        answer.raise_for_status()
        return int(answer.json()["total_calls"])

    async def reset_simulator(self) -> None:
        if self.sim_url:
            (await self.http.post(f"{self.sim_url}/_sim/reset")).raise_for_status()

    # -- contenders ------------------------------------------------------------------------

    def max_in_flight(self, sc: Scenario) -> int | None:
        return sc.max_in_flight or self.args.max_in_flight

    def start_contenders(self, sc: Scenario, settings: Settings) -> list[Proc]:
        procs = []
        for i in range(sc.processes):
            port = free_port()
            env = self.env_for(settings, port, self.max_in_flight(sc))
            if sc.kind == "worker" and sc.provider == "http":
                argv = ["-m", "bench.traced" if self.args.record_spans else "worker", "run"]
                if self.args.cprofile is not None:
                    argv = self.cprofiled(argv, settings, i)
                elif self.args.latency_trace is not None:
                    self.args.latency_trace.mkdir(parents=True, exist_ok=True)
                    out = self.args.latency_trace / f"{settings.kafka_consumer_group}-{i}.json"
                    argv = ["-m", "bench.latency_trace", str(out.resolve()), *argv[2:]]
            elif sc.kind == "worker":
                argv = ["-m", "bench.proc", "worker-inproc"]
            else:
                argv = ["-m", "bench.proc", sc.kind]
                if self.args.cprofile is not None and sc.kind in ("floor", "batched"):
                    argv = self.cprofiled(argv, settings, i)
            proc = start_proc(f"{settings.kafka_consumer_group}-{i}", argv, env, self.log_dir)
            proc.port = port if sc.kind == "worker" else None
            procs.append(proc)
        return procs

    def cprofiled(self, argv: list[str], settings: Settings, i: int) -> list[str]:
        """``python -m MODULE ...`` run under ``bench.cprofiled``, its stats in ``--cprofile``."""
        assert self.args.cprofile is not None
        self.args.cprofile.mkdir(parents=True, exist_ok=True)
        out = self.args.cprofile / f"{settings.kafka_consumer_group}-{i}.prof"
        return ["-m", "bench.cprofiled", str(out), *argv[1:]]

    async def wait_ready(self, procs: list[Proc], timeout: float = 90.0) -> None:
        """Workers: /readyz 200 and partitions assigned (so no rebalance is left to happen);
        ceiling and baseline: their ``assigned N`` line."""
        deadline = time.monotonic() + timeout
        while True:
            ready = 0
            for proc in procs:
                if not proc.alive():
                    raise ScenarioFailed(f"{proc.name} exited early:\n{proc.tail()}")
                if proc.port is None:
                    with contextlib.suppress(OSError):
                        if b"assigned " in proc.log.read_bytes():
                            ready += 1
                    continue
                with contextlib.suppress(httpx.HTTPError):
                    base = f"http://127.0.0.1:{proc.port}"
                    if (await self.http.get(f"{base}/readyz")).status_code == 200:
                        text = (await self.http.get(f"{base}/metrics")).text
                        if samples_of(text).get(ASSIGNED, 0.0) >= 1:
                            ready += 1
            if ready == len(procs):
                return
            if time.monotonic() > deadline:
                raise ScenarioFailed("contenders not ready in time")
            await asyncio.sleep(0.2)

    # -- measuring -------------------------------------------------------------------------

    def snapshot(self, procs: list[Proc]) -> CpuSnapshot:
        splits = [proc_user_sys_s(p.pid) for p in procs]
        return CpuSnapshot(
            contender=sum(user + system for user, system in splits),
            contender_user=sum(user for user, _ in splits),
            broker=proc_cpu_s(self.broker_pid) if self.broker_pid else math.nan,
            simulator=proc_cpu_s(self.sim_proc.pid) if self.sim_proc else math.nan,
            load=time.process_time(),
            wall=time.monotonic(),
        )

    async def run_scenario(self, sc: Scenario, label: str | None = None) -> dict[str, Any]:
        a = self.args
        label = label or sc.name
        idx = next(self._seq)
        prefix = f"bench-{self.tag}-{idx:02d}-{label}"
        topics = topics_named(prefix)
        settings = self.settings_for(topics, f"{prefix}.group")
        await ensure_topics(settings.kafka_config(), settings.topic_plan())
        await self.reset_simulator()
        commands = sc.commands or a.commands
        workload = Workload(f"{self.tag}{idx:02d}", commands, a.accounts, sc.mix)
        procs = self.start_contenders(sc, settings)
        profiler: subprocess.Popen[bytes] | None = None
        producer = build_producer(settings.kafka_config())
        outputs: Outputs | None = None
        try:
            await self.wait_ready(procs)
            outputs = await Outputs.open(settings, topics, a.partitions)
            await producer.start()

            # registration (not measured)
            progress = Progress(f"[{label}] register", workload.registered)
            deadline = time.monotonic() + a.phase_timeout
            await produce_registrations(producer, topics.commands, workload)
            while outputs.status_events < workload.registered and time.monotonic() < deadline:
                self._check_alive(procs)
                await outputs.pump()
                progress.update(outputs.status_events)
            progress.close(outputs.status_events)
            if outputs.status_events < workload.registered:
                raise ScenarioFailed(f"registration incomplete: {outputs.status_events}")

            # the measured confirm phase
            if a.profile is not None and sc.kind != "ceiling":
                profiler = start_profiler(procs[0].pid, a.profile / f"{label}.txt")
            what = "confirm" if sc.rate is None else f"confirm @{sc.rate:.0f}/s"
            progress = Progress(f"[{label}] {what}", commands)
            sent = SendLog()
            calls = await self.sim_calls()
            before = self.snapshot(procs)
            deadline = time.monotonic() + a.phase_timeout
            generator = asyncio.create_task(
                produce_confirms(
                    producer,
                    topics.commands,
                    workload,
                    outputs,
                    rate=sc.rate,
                    log=sent,
                    deadline=deadline,
                )
            )
            while outputs.matched < commands and time.monotonic() < deadline:
                self._check_alive(procs)
                if generator.done() and generator.exception() is not None:
                    await generator
                await outputs.pump(timeout_ms=50)
                progress.update(outputs.matched)
            await self._settle(procs, outputs, workload, deadline)
            after = self.snapshot(procs)
            calls = await self.sim_calls() - calls
            progress.close(outputs.matched)
            if not generator.done():
                generator.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await generator
            result = self._result(sc, label, workload, outputs, sent, before, after, procs)
            done = outputs.matched
            result["provider_calls_per_command"] = round(calls / done, 3) if done else None
            return result
        finally:
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(profiler.wait, 30)
            await asyncio.to_thread(stop_procs, procs)
            with contextlib.suppress(Exception):
                await producer.stop()
            if outputs is not None:
                await outputs.close()
            await self._delete_topics(topics)

    async def _settle(
        self, procs: list[Proc], outputs: Outputs, workload: Workload, deadline: float
    ) -> None:
        """The same end of the CPU window for every contender: every status event of the run
        arrived (one per registration and per first confirm), then ``--settle-s`` more, so
        the tail each one leaves after its last reply (events, the last commit) is counted
        alike."""
        events = workload.registered + min(workload.commands, workload.registered)
        while outputs.status_events < events and time.monotonic() < deadline:
            self._check_alive(procs)
            await outputs.pump(timeout_ms=50)
        end = time.monotonic() + self.args.settle_s
        while time.monotonic() < end:
            await outputs.pump(timeout_ms=max(1, round((end - time.monotonic()) * 1000)))

    def _check_alive(self, procs: list[Proc]) -> None:
        for proc in procs:
            if not proc.alive():
                raise ScenarioFailed(f"{proc.name} exited:\n{proc.tail()}")

    async def _delete_topics(self, topics: Topics) -> None:
        """Best effort: the embedded broker keeps every record in memory."""
        kafka = Settings(kafka_bootstrap_servers=self.bootstrap).kafka_config()
        admin = AIOKafkaAdminClient(**client_options(kafka))
        with contextlib.suppress(Exception):
            await admin.start()
            await asyncio.wait_for(admin.delete_topics(topics.all()), timeout=10)
        with contextlib.suppress(Exception):
            await admin.close()

    def _result(
        self,
        sc: Scenario,
        label: str,
        workload: Workload,
        outputs: Outputs,
        sent: SendLog,
        before: CpuSnapshot,
        after: CpuSnapshot,
        procs: list[Proc],
    ) -> dict[str, Any]:
        done = outputs.matched
        window = (outputs.last_reply_ms / 1000.0 - sent.first_issued) if done else math.nan
        wall = after.wall - before.wall
        lat = outputs.latencies_ms
        contender_cpu = after.contender - before.contender
        user_cpu = after.contender_user - before.contender_user
        rss = [proc_peak_rss(p.pid) for p in procs]
        ok = sum(n for k, n in outputs.http_status.items() if k in ("200", "pass-through"))
        in_flight = self.max_in_flight(sc) or WORKER_DEFAULT_IN_FLIGHT
        return {
            "name": label,
            "kind": sc.kind,
            "processes": sc.processes,
            "provider": "none" if sc.kind == "ceiling" else sc.provider,
            "mix": sc.mix,
            "accounts": workload.registered,
            "commands": workload.commands,
            "sent": sent.sent,
            "replies": done,
            "complete": done == workload.commands,
            "ok_replies": ok,
            "ok_share": round(ok / done, 4) if done else 0.0,
            "max_in_flight": in_flight if sc.kind == "worker" else None,
            "offered_rate": sc.rate,
            "generator_behind_max_s": round(sent.behind_max_s, 4),
            "seconds": round(window, 3),
            # successful replies per second (all replies per second next to it)
            "throughput": round(ok / window, 1) if ok and window > 0 else 0.0,
            "replies_per_s": round(done / window, 1) if done and window > 0 else 0.0,
            "latency_ms": {
                "p50": round(percentile(lat, 50), 1),
                "p95": round(percentile(lat, 95), 1),
                "p99": round(percentile(lat, 99), 1),
                "max": round(max(lat), 1) if lat else math.nan,
            },
            "cpu_us_per_command": round(contender_cpu / done * 1e6, 1) if done else math.nan,
            # the same split into user and system time (system: socket I/O, page faults)
            "cpu_us_per_command_user": round(user_cpu / done * 1e6, 1) if done else math.nan,
            "cpu_us_per_command_sys": round((contender_cpu - user_cpu) / done * 1e6, 1)
            if done
            else math.nan,
            "cpu_cores": {
                "contender": round(contender_cpu / wall, 2),
                "broker": round((after.broker - before.broker) / wall, 2),
                "simulator": round((after.simulator - before.simulator) / wall, 2)
                if sc.provider == "http" and sc.kind != "ceiling"
                else 0.0,
                "load_generator": round((after.load - before.load) / wall, 2),
            },
            "peak_rss_mb": round(max(rss) / 2**20, 1) if rss else 0.0,
            "peak_rss_mb_total": round(sum(rss) / 2**20, 1),
            "http_status": dict(outputs.http_status),
        }


# --------------------------------------------------------------------------------------------
# orchestration
# --------------------------------------------------------------------------------------------


async def run_all(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    tag = datetime.now(UTC).strftime("%H%M%S")
    results: dict[str, Any] = {
        "meta": run_meta(
            "python -m bench",
            args.argv,
            {
                "partitions": args.partitions,
                "commands": args.commands,
                "accounts_spread": args.accounts,
                "mix": args.mix,
                "provider_latency_ms": args.latency_ms,
                "provider_jitter_ms": args.jitter_ms,
                "max_in_flight": args.max_in_flight,
                "follow_up_poll_s": args.follow_up_poll_s,
                "curve_seconds": args.curve_seconds,
                "rounds": args.rounds,
                "settle_s": args.settle_s,
                "rate": args.rate,
                "gc_threshold": Settings.model_fields["worker_gc_threshold"].default
                if args.gc_threshold is None
                else args.gc_threshold,
                "fetch_max_wait_ms": args.fetch_max_wait_ms or EMBEDDED_FETCH_MAX_WAIT_MS,
            },
        ),
        "scenarios": {},
        "failures": {},
        "latency_curve": [],
        "order": [],
    }
    with EmbeddedBroker() as broker:
        broker_pid = broker._proc.pid if broker._proc is not None else None
        bench = Bench(args, broker.bootstrap, broker_pid, log_dir, tag)
        try:
            await bench.start_simulator()
            runs: dict[str, list[dict[str, Any]]] = {}
            for i in range(args.rounds):
                # Reversed every other round: no contender always runs first (or last).
                order = args.scenarios if i % 2 == 0 else args.scenarios[::-1]
                for name in order:
                    sc = SCENARIOS[name]
                    if args.mix == "spread":
                        sc = dataclasses.replace(sc, mix="spread")
                    if args.rate is not None:
                        sc = dataclasses.replace(sc, rate=args.rate)
                    label = name if args.rounds == 1 else f"{name}-r{i + 1}"
                    results["order"].append(label)
                    try:
                        runs.setdefault(name, []).append(await bench.run_scenario(sc, label))
                    except ScenarioFailed as exc:
                        print(f"\n[{label}] FAILED: {exc}", file=sys.stderr)
                        results["failures"][label] = str(exc)
            for name in args.scenarios:
                if name in runs:
                    results["scenarios"][name] = combine(name, runs[name])
            if args.rounds > 1:
                results["cpu_ratios_by_round"] = [
                    cpu_ratios({n: r[i] for n, r in runs.items() if len(r) > i})
                    for i in range(args.rounds)
                ]
            max_rate = args.max_rate or max(
                (results["scenarios"].get(n, {}).get("throughput", 0.0) for n in HTTP_WORKERS_1P),
                default=0.0,
            )
            for frac in args.curve if max_rate else []:
                rate = frac * max_rate
                n = max(100, min(args.commands, int(rate * args.curve_seconds)))
                label = f"curve-{round(frac * 100)}"
                sc = Scenario(label, "worker", mix=args.mix, rate=rate, commands=n)
                try:
                    point = await bench.run_scenario(sc, label)
                except ScenarioFailed as exc:
                    print(f"\n[{label}] FAILED: {exc}", file=sys.stderr)
                    results["failures"][label] = str(exc)
                    continue
                point["fraction_of_max"] = frac
                point["max_rate"] = max_rate
                results["latency_curve"].append(point)

            if args.restore_records:  # `--restore-records 0` skips the restore measurement
                print("restore: producing and restoring one partition ...", file=sys.stderr)
                prefix = f"bench-{tag}-restore"
                topics = topics_named(prefix)
                settings = bench.settings_for(topics, f"{prefix}.group")
                await ensure_topics(settings.kafka_config(), settings.topic_plan())
                restore = await restore_rate(settings, args.restore_records)
                results["restore"] = restore.as_dict()
                await bench._delete_topics(topics)
        finally:
            await bench.http.aclose()
            if bench.sim_proc is not None:
                await asyncio.to_thread(stop_procs, [bench.sim_proc])
    memory = []
    for n in args.memory_sizes:
        for settled in (False, True):
            kind = "settled" if settled else "in-flow"
            print(f"memory: {n:,} accounts, {kind} records ...", file=sys.stderr)
            memory.append(store_memory(n, settled=settled).as_dict())
    if args.memory_sizes:  # `--memory-sizes ''` skips the memory measurement
        n = min(args.memory_sizes)
        print(f"memory: {n:,} accounts, full dedup window ...", file=sys.stderr)
        memory.append(store_memory(n, confirms=WINDOW - 1).as_dict())
    results["memory"] = memory
    results["ratios"] = ratios(results["scenarios"])
    results["cpu_ratios"] = cpu_ratios(results["scenarios"])
    results["targets"] = targets(results, args)
    results["meta"]["seconds"] = round(time.monotonic() - args.t0, 1)
    return results


def combine(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One scenario's figure over its rounds: the first round's record with the medians of
    its rate and CPU figures, every round's kept under ``rounds``."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[0], name=name, complete=all(r["complete"] for r in runs))
    for key in (
        "throughput",
        "replies_per_s",
        "cpu_us_per_command",
        "cpu_us_per_command_user",
        "cpu_us_per_command_sys",
    ):
        out[key] = round(statistics.median(r[key] for r in runs), 1)
    out["rounds"] = [
        {k: r[k] for k in ("name", "throughput", "cpu_us_per_command", "complete")} for r in runs
    ]
    return out


def ratios(scenarios: dict[str, Any]) -> dict[str, float]:
    """Throughput (successful replies/s) of every worker scenario over ceiling and baseline of
    the same mix."""
    out = {}
    for name, s in scenarios.items():
        if s["kind"] != "worker" or not s["throughput"]:
            continue
        for kind in ("ceiling", "baseline"):
            refs = [r for r in scenarios.values() if r["kind"] == kind and r["mix"] == s["mix"]]
            if refs and refs[0]["throughput"]:
                out[f"{name}/{refs[0]['name']}"] = round(s["throughput"] / refs[0]["throughput"], 2)
    return out


def baseline_figures(results: dict[str, Any]) -> dict[str, float]:
    """What ``--baseline`` compares: CPU per command and rate of each scenario, the worker's
    CPU ratios (when the tree has them), p99 and CPU of each curve point."""
    out: dict[str, float] = {}
    for name, s in results["scenarios"].items():
        out[f"{name}: CPU µs/cmd"] = _number(s.get("cpu_us_per_command"))
        out[f"{name}: ok cmd/s"] = _number(s.get("throughput"))
    # From the scenarios, not ``cpu_ratios``: a tree from before the floor has none.
    for name, by in cpu_ratios(results["scenarios"]).items():
        for kind, value in by.items():
            out[f"{name}: CPU ÷ {kind}"] = _number(value)
    for p in results.get("latency_curve", []):
        out[f"{p['name']}: p99 ms"] = _number(p["latency_ms"]["p99"])
        out[f"{p['name']}: CPU µs/cmd"] = _number(p.get("cpu_us_per_command"))
    return out


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def cpu_ratios(scenarios: dict[str, Any]) -> dict[str, dict[str, float]]:
    """CPU per command of every worker scenario over the ceiling's, the floor's and the batched
    contender's of the same mix (the floor: what a minimal service on the same libraries
    spends, ``bench.floor``; batched: the worker's own decisions in the floor's shape,
    ``bench.batched``), and of the batched contender over the floor's and the ceiling's."""
    out: dict[str, dict[str, float]] = {}
    for name, s in scenarios.items():
        cpu = s.get("cpu_us_per_command")
        if s["kind"] not in ("worker", "batched") or cpu is None or math.isnan(cpu):
            continue
        for kind in ("ceiling", "floor", "batched"):
            if kind == s["kind"]:
                continue
            refs = [r for r in scenarios.values() if r["kind"] == kind and r["mix"] == s["mix"]]
            ref = refs[0].get("cpu_us_per_command") if refs else None
            if ref and not math.isnan(ref):
                out.setdefault(name, {})[kind] = round(cpu / ref, 2)
    return out


def targets(results: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The figures of the performance targets, in the order of the issue's table, then the
    older ones (in-process worker vs ceiling, restore rate)."""
    r = results["ratios"]
    scenarios: dict[str, Any] = results["scenarios"]
    out: list[dict[str, Any]] = []

    def add(name: str, want: str, value: float | None, met: bool | None, note: str = "") -> None:
        out.append({"target": name, "wanted": want, "measured": value, "met": met, "note": note})

    def cpu(name: str) -> float | None:
        v = scenarios.get(name, {}).get("cpu_us_per_command")
        return None if v is None or math.isnan(v) else float(v)

    def cpu_ratio(name: str, num: float | None, den: float | None, limit: float) -> None:
        """One CPU-per-command ratio of this run against its wanted bound."""
        value = round(num / den, 2) if num is not None and den else None
        add(
            name,
            f"≤ {limit:g}",
            value,
            None if value is None else value <= limit,
            "" if value is None else f"{num:,.0f} ÷ {den:,.0f} µs, same run",
        )

    w, c, f, b = cpu("worker-1p"), cpu("ceiling"), cpu("floor"), cpu("batched")
    cpu_ratio("worker-1p CPU per command ÷ ceiling CPU per command", w, c, 4)
    cpu_ratio("worker-1p CPU per command ÷ floor CPU per command", w, f, 1.3)
    cpu_ratio(
        "batched (the worker's decisions in the floor's shape) ÷ floor, CPU per command", b, f, 1.3
    )
    best = max(
        ((r[f"{n}/baseline"], n) for n in HTTP_WORKERS if f"{n}/baseline" in r), default=None
    )
    add(
        "worker ≥ 10x partition-ordered baseline (HTTP provider)",
        "≥ 10",
        best[0] if best else None,
        None if best is None else best[0] >= 10,
        f"best HTTP worker scenario: {best[1]}" if best else "",
    )
    half = [p for p in results["latency_curve"] if p.get("fraction_of_max") == 0.5]
    limit = args.latency_ms + 30
    p99 = half[0]["latency_ms"]["p99"] if half else None
    add(
        "p99 ≤ provider latency + 30 ms at 50% of max rate",
        f"≤ {limit:g} ms",
        p99,
        None if p99 is None else p99 <= limit,
        "" if not half else f"open loop at {half[0]['offered_rate']:,.0f}/s",
    )
    # CPU per command at low load over the full-load (burst) figure: fixed costs (fetch,
    # timers, commits) spread over few commands. Measured at the lowest curve point; only a
    # point at 10% or below decides the target.
    points: list[dict[str, Any]] = results["latency_curve"]
    low = min(points, key=lambda p: float(p.get("fraction_of_max", 1.0)), default=None)
    note, factor, decided = "", None, False
    if low is not None and w and low.get("cpu_us_per_command") is not None:
        low_cpu, frac = float(low["cpu_us_per_command"]), float(low["fraction_of_max"])
        factor, decided = round(low_cpu / w, 2), frac <= 0.1
        note = f"{low_cpu:,.0f} µs at {frac:.0%} ({low['throughput']:,.0f}/s) ÷ {w:,.0f} µs"
        note += "" if decided else "; no 10% point, so not decided"
    add(
        "worker CPU per command at 10% load ≤ 2x its value at full load",
        "≤ 2",
        factor,
        factor <= 2 if factor is not None and decided else None,
        note,
    )
    big = max((m["accounts"] for m in results["memory"]), default=0)
    at = {m["record"]: m["bytes_per_account"] for m in results["memory"] if m["accounts"] == big}
    per = at.get("in-flow")
    add(
        "≤ 1 KB state per account",
        "≤ 1024 B",
        per,
        None if per is None else per <= 1024,
        ""
        if per is None
        else f"in-flow records at {big:,} accounts; settled: {at.get('settled', math.nan):,.0f} B",
    )
    v = r.get("worker-inproc/ceiling")
    add("in-process worker ≥ 0.6x ceiling", "≥ 0.6", v, None if v is None else v >= 0.6)
    rate = results.get("restore", {}).get("records_per_s")
    add(
        "restore ≥ 50,000 records/s per partition",
        "≥ 50000/s",
        rate,
        None if rate is None else rate >= 50_000,
    )
    return out


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def cpu_cell(s: dict[str, Any]) -> str:
    total = fmt(s["cpu_us_per_command"])
    if "cpu_us_per_command_user" not in s:
        return total
    return f"{total} ({fmt(s['cpu_us_per_command_user'])}+{fmt(s['cpu_us_per_command_sys'])})"


def table(results: dict[str, Any]) -> str:
    rows = [
        "| scenario | ok cmd/s | ok % | p50 ms | p95 ms | p99 ms | CPU µs/cmd (user+sys) "
        "| peak RSS MB "
        "| x ceiling | x baseline | CPU ÷ ceiling | CPU ÷ floor | CPU ÷ batched "
        "| provider calls/cmd | cores: contender/broker/sim/loadgen |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    scenarios: dict[str, Any] = results["scenarios"]
    r: dict[str, float] = results["ratios"]
    by_cpu: dict[str, dict[str, float]] = results.get("cpu_ratios", {})
    for name, s in scenarios.items():
        tp = s["throughput"]
        lat = s["latency_ms"]
        c = s["cpu_cores"]
        x_ceiling = next((v for k, v in r.items() if k.startswith(f"{name}/ceiling")), None)
        x_base = next((v for k, v in r.items() if k.startswith(f"{name}/baseline")), None)
        rows.append(
            f"| {name}{'' if s['complete'] else ' (incomplete)'} | {fmt(tp)} "
            f"| {fmt(100 * s['ok_share'], '.1f')} "
            f"| {fmt(lat['p50'], ',.1f')} | {fmt(lat['p95'], ',.1f')} "
            f"| {fmt(lat['p99'], ',.1f')} | {cpu_cell(s)} "
            f"| {fmt(s['peak_rss_mb'], '.0f')} | {fmt(x_ceiling, '.2f')} "
            f"| {fmt(x_base, '.2f')} "
            f"| {fmt(by_cpu.get(name, {}).get('ceiling'), '.2f')} "
            f"| {fmt(by_cpu.get(name, {}).get('floor'), '.2f')} "
            f"| {fmt(by_cpu.get(name, {}).get('batched'), '.2f')} "
            f"| {fmt(s.get('provider_calls_per_command'), '.2f')} "
            f"| {c['contender']:.2f}/{c['broker']:.2f}/{c['simulator']:.2f}"
            f"/{c['load_generator']:.2f} |"
        )
    for name, why in results["failures"].items():
        reason = why.strip().splitlines()[-1] if why.strip() else "failed"
        rows.append(f"| {name} | FAILED: {reason[:120]} |" + " |" * 12)
    out = ["\n".join(rows)]
    by_round = results.get("cpu_ratios_by_round", [])
    for name in by_cpu if by_round else ():
        for kind in by_cpu[name]:
            each = " / ".join(fmt(r.get(name, {}).get(kind), ".2f") for r in by_round)
            out.append(f"{name} CPU ÷ {kind}, each round (order reversed each round): {each}")
    if results["latency_curve"]:
        curve = [
            "| offered | offered cmd/s | achieved cmd/s | p50 ms | p95 ms | p99 ms | max ms "
            "| CPU µs/cmd (user+sys) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in results["latency_curve"]:
            lat = p["latency_ms"]
            curve.append(
                f"| {p['fraction_of_max']:.0%} of {p['max_rate']:,.0f} "
                f"| {p['offered_rate']:,.0f} | {fmt(p['throughput'])} "
                f"| {fmt(lat['p50'], ',.1f')} | {fmt(lat['p95'], ',.1f')} "
                f"| {fmt(lat['p99'], ',.1f')} | {fmt(lat['max'], ',.1f')} | {cpu_cell(p)} |"
            )
        out.append("\n".join(curve))
    mem = [
        "| accounts | record | dedup outcomes | bytes/account | record JSON bytes |",
        "|---:|---|---:|---:|---:|",
    ]
    for m in results.get("memory", []):
        mem.append(
            f"| {m['accounts']:,} | {m['record']} | {m['dedup_outcomes']} "
            f"| {m['bytes_per_account']:,.0f} | {m['record_json_bytes']} |"
        )
    out.append("\n".join(mem))
    if "restore" in results:
        r = results["restore"]
        out.append(
            f"restore: {r['records']:,} records of one partition in {r['seconds']:.2f} s "
            f"= {r['records_per_s']:,} records/s"
        )
    tg = ["| target | wanted | measured | met | note |", "|---|---|---:|---|---|"]
    for t in results.get("targets", []):
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        tg.append(
            f"| {t['target']} | {t['wanted']} | {fmt(t['measured'], ',.2f')} | {met} "
            f"| {t['note']} |"
        )
    out.append("\n".join(tg))
    return "\n\n".join(out)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios: dict[str, Any] = results["scenarios"]
    names = list(scenarios)
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    ax = axes[0][0]
    values = [scenarios[n]["throughput"] for n in names]
    colors = ["tab:blue" if scenarios[n]["ok_share"] == 1 else "tab:red" for n in names]
    bars = ax.bar(names, values, color=colors)
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
    ax.set_yscale("log")
    ax.set_title("throughput: successful replies/s (red: some replies were errors)")
    ax.tick_params(axis="x", rotation=30)
    ax = axes[0][1]
    width = 0.27
    for i, q in enumerate(("p50", "p95", "p99")):
        xs = [j + (i - 1) * width for j in range(len(names))]
        ax.bar(xs, [scenarios[n]["latency_ms"][q] for n in names], width, label=q)
    ax.set_xticks(range(len(names)), names, rotation=30)
    ax.set_yscale("log")
    ax.set_title("end-to-end latency under full load (ms; backlog-dominated)")
    ax.legend()
    ax = axes[1][0]
    curve = results["latency_curve"]
    if curve:
        rates = [p["throughput"] for p in curve]
        for q in ("p50", "p95", "p99"):
            ax.plot(rates, [p["latency_ms"][q] for p in curve], marker="o", label=q)
        limit = results["meta"]["params"]["provider_latency_ms"] + 30
        ax.axhline(limit, color="red", linestyle="--", label=f"target p99 @50% ({limit:g} ms)")
        ax.set_xlabel("achieved commands/s (open-loop, worker-1p)")
        ax.legend()
    ax.set_title("latency curve (ms)")
    ax = axes[1][1]
    values = [scenarios[n]["cpu_us_per_command"] for n in names]
    bars = ax.bar(names, values, color="tab:orange")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
    ax.set_yscale("log")
    ax.set_title("contender CPU µs per command (all its processes)")
    ax.tick_params(axis="x", rotation=30)
    fig.suptitle(
        f"passkey worker bench: {results['meta']['params']['commands']:,} commands, "
        f"{results['meta']['params']['partitions']} partitions, provider "
        f"{results['meta']['params']['provider_latency_ms']:g}±"
        f"{results['meta']['params']['provider_jitter_ms']:g} ms, "
        f"{results['meta']['machine']['cpus']} CPUs"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(settings: Settings, argv: list[str]) -> int:
    """Entry point of ``python -m bench ARGS``; returns the exit status."""
    # The benchmark builds its own settings per scenario; only the event loop of this process
    # (the load generator and the collector) is taken from here.
    if "--webhooks" in argv:  # a benchmark of its own, with its own flags
        from bench import webhooks

        return webhooks.main([a for a in argv if a != "--webhooks"])
    parser = build_parser()
    args = resolve_defaults(parser.parse_args(argv))
    if args.baseline:
        return baseline.run(
            module="bench",
            argv=argv,
            parser=parser,
            ref=args.baseline,
            rounds=args.baseline_rounds,
            out_args=lambda d: [
                "--out-dir",
                str(d),
                *([] if "--no-plot" in argv else ["--no-plot"]),
            ],
            results_file=lambda d: d / "results.json",
            figures=baseline_figures,
            summary=args.baseline_json,
        )
    args.argv = argv
    args.t0 = time.monotonic()
    log_dir = Path(tempfile.mkdtemp(prefix="worker-bench-"))
    try:
        results = eventloop.run(run_all(args, log_dir), settings.event_loop)
    except KeyboardInterrupt:
        print(f"\ninterrupted; logs in {log_dir}", file=sys.stderr)
        return 130
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "results.json").write_text(json.dumps(clean(results), indent=2) + "\n")
    if not args.no_plot:
        plot(results, args.out_dir / "results.png")
    print(table(results))
    print(f"\nwrote {args.out_dir / 'results.json'}" + ("" if args.no_plot else " and results.png"))
    failed = bool(results["failures"]) or not all(
        s["complete"] for s in [*results["scenarios"].values(), *results["latency_curve"]]
    )
    if failed or args.keep_logs:
        print(f"contender logs: {log_dir}", file=sys.stderr)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 1 if failed else 0
