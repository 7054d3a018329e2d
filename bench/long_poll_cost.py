"""What waiting costs the worker: callers polling ``GET .../auth`` once a second against the
same number long-polling (``after_version``, ``wait_s``) accounts that do not change, in one
run, the worker's CPU read from /proc.

    python -m bench.long_poll_cost --callers 500 --clients 4 --seconds 120 --idle-s 60 --rounds 2

For each phase it starts ``python -m devstack stack`` (what ``make run`` runs) afresh on
spare loopback ports with its own keys file, registers ``--workspaces`` workspaces of
``--accounts`` quiet accounts each (a workspace's long-polls are held within its share,
docs/architecture.md, "Long-polls"), and spreads the callers evenly over them. The callers
run in ``--clients`` processes, each caller on its own keep-alive connection speaking just
enough HTTP (``bench.stack.Connection``), so the harness is not what limits the load offered;
the rates offered and answered are printed.

Phases alternate (poll, long-poll, then the reverse) so a drift of the machine favours
neither. Each measures its own stack idle, the worker's own cost, which the comparison
subtracts: half of ``--idle-s`` before its callers start and half after they stopped and the
worker's last waits ended (``--wait-s`` and its slack later), and takes the phase above the
two windows' mean. An idle stack's cost drifts by as much as the long-polls cost, and every
process's CPU for the same work moves together, so each figure is also given corrected: the
idle cost scaled by how the dispatcher's CPU (its work does not depend on the GETs) moved,
to a power fitted over the idle windows' parts (``elasticity``); the raw figures are kept.
Each round's ratio is given beside the mean's, with the rounds' standard error, and each
phase's GET /auth 500s by cause, read from the front-end's metrics. A poller
asks on its own one-second grid (the grids spread over the first second). A long-poller asks
once plainly, then again and again with the version it got and ``wait_s`` = ``--wait-s``; the
first asks are spread over one wait, so the deadlines are spread as a population's would be,
and only after ``--warmup-s`` is anything counted: what is measured is the steady state.
Loopback only; every caller, client and phase ends by its deadline."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from bench.common import REPO_ROOT, base_env
from bench.stack import Connection, Stack, samples_of, start_stack, stop_process
from worker.contract.messages import SLACK_SHARE

MODES: Final = ("poll", "long-poll")
#: A caller whose answer came back unchanged sooner than this (its long-poll was not held:
#: past a share) waits a second before it asks again, as docs/api.md's login loop does.
EARLY_S: Final = 1.0
#: Stack processes whose CPU each phase reads, by bench.stack's role names.
ROLES: Final = ("worker", "front-end", "broker", "dispatcher")
#: The yardstick of the machine's drift: the dispatcher's work does not depend on the GETs
#: (no account changes), yet its CPU moves with the idle worker's (bench/README.md).
REFERENCE: Final = "dispatcher"


@dataclass
class Tally:
    """What one client process's callers did within the measured window."""

    sent: int = 0
    answered: int = 0
    early: int = 0
    errors: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self).items()}

    def add(self, other: Tally) -> None:
        self.sent += other.sent
        self.answered += other.answered
        self.early += other.early
        self.errors += other.errors
        self.statuses.update(other.statuses)
        self.cpu_s += other.cpu_s


@dataclass
class Phase:
    """One stack's phase: ``cpu_s`` over ``seconds`` with its callers, ``idle_cpu_s`` over
    ``idle_s``, the idle windows before and after them together; ``idle_drift``: the worker's
    cores after less before."""

    mode: str
    seconds: float
    cpu_s: dict[str, float]
    tally: Tally
    load_avg: float
    idle_s: float
    idle_cpu_s: dict[str, float]
    idle_drift: float = 0.0
    #: The idle windows in parts, each ``(seconds, CPU seconds by role)``: what the fit of
    #: ``elasticity`` reads.
    idle_parts: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    #: The front-end's GET /auth 500s by cause over the phase (``passkey_api_query_failures``).
    failures: dict[str, int] = field(default_factory=dict)

    def cores(self, role: str = "worker") -> float:
        return self.cpu_s[role] / self.seconds

    def idle_cores(self, role: str = "worker") -> float:
        return self.idle_cpu_s[role] / self.idle_s

    def price(self) -> float:
        """How much more CPU the reference's unchanged work took with the callers than idle."""
        return self.cores(REFERENCE) / self.idle_cores(REFERENCE)

    def above_idle(self, role: str = "worker", elasticity: float = 0.0) -> float:
        """CPU seconds above what the same stack spent idle over as many seconds, that idle
        cost taken ``price ** elasticity`` times (0: raw; ``elasticity()``: the machine's
        drift taken out)."""
        idle = self.idle_cores(role) * math.pow(self.price(), elasticity)
        return self.cpu_s[role] - idle * self.seconds


def elasticity(phases: list[Phase]) -> float:
    """How the idle worker's CPU follows the reference's: the slope of log(worker cores) on
    log(reference cores) over the idle windows' parts, each phase's about its own means (the
    stacks differ; the drift within one is what is corrected); 0 if nothing moved."""
    points: list[tuple[float, float]] = []
    for p in phases:
        logs = [
            (math.log(cpu[REFERENCE] / s), math.log(cpu["worker"] / s))
            for s, cpu in p.idle_parts
            if cpu[REFERENCE] > 0 and cpu["worker"] > 0
        ]
        if len(logs) > 1:
            mx, my = (statistics.fmean(v) for v in zip(*logs, strict=True))
            points += [(x - mx, y - my) for x, y in logs]
    sxx = sum(x * x for x, _ in points)
    return sum(x * y for x, y in points) / sxx if sxx > 0 else 0.0


def first_ask(index: int, callers: int, mode: str, wait_s: float) -> float:
    """Seconds after the phase's start at which caller ``index`` asks first: pollers spread
    over one second, long-pollers over one wait (so their deadlines are spread)."""
    span = wait_s if mode == "long-poll" else 1.0
    return span * index / max(1, callers)


def _ratio(long_poll: float, poll: float) -> float:
    return long_poll / poll if poll > 0 else float("nan")


def drain_s(mode: str, wait_s: float) -> float:
    """After the callers stop, how long until the worker holds no wait of theirs: a parked
    wait ends at its time-out, at most a tenth of it late (``SLACK_SHARE``)."""
    return (wait_s * (1 + SLACK_SHARE) if mode == "long-poll" else 0.0) + 2.0


def summarize(phases: list[Phase]) -> dict[str, Any]:
    """Per mode: the worker's cores (CPU seconds over wall seconds of that mode's phases), the
    same stacks' idle cores, the cores above them and the CPU per answered GET; offered and
    answered GETs a second. Then what polling and long-polling cost above idle, their ratio,
    and each round's (a poll and a long-poll phase in run order); each also ``_corrected``
    for the machine's drift (``elasticity``, ``Phase.above_idle``)."""
    out: dict[str, Any] = {"modes": {}}
    for mode in MODES:
        mine = [p for p in phases if p.mode == mode]
        seconds = sum(p.seconds for p in mine)
        if not seconds:
            continue
        above = sum(p.above_idle() for p in mine)
        answered = sum(p.tally.answered for p in mine)
        out["modes"][mode] = {
            "seconds": seconds,
            "cores": {r: sum(p.cpu_s[r] for p in mine) / seconds for r in ROLES},
            "idle_cores": sum(p.idle_cpu_s["worker"] for p in mine) / sum(p.idle_s for p in mine),
            "above_idle": above / seconds,
            "us_per_answer": above / answered * 1e6 if answered else float("nan"),
            "offered_per_s": sum(p.tally.sent for p in mine) / seconds,
            "answered_per_s": answered / seconds,
            "query_failures": dict(sum((Counter(p.failures) for p in mine), Counter())),
        }
    modes = out["modes"]
    if set(MODES) <= modes.keys():
        rounds = [phases[i : i + 2] for i in range(0, len(phases) - 1, 2)]
        fitted = out["elasticity"] = elasticity(phases)
        for tail, e in (("", 0.0), ("_corrected", fitted)):
            cost = {
                m: sum(p.above_idle(elasticity=e) for p in phases if p.mode == m)
                / modes[m]["seconds"]
                for m in MODES
            }
            out["poll_above_idle" + tail] = cost["poll"]
            out["long_poll_above_idle" + tail] = cost["long-poll"]
            out["ratio" + tail] = _ratio(cost["long-poll"], cost["poll"])
            ratios = out["round_ratios" + tail] = [
                _ratio(
                    *(
                        sum(p.above_idle(elasticity=e) for p in r if p.mode == m)
                        for m in MODES[::-1]
                    )
                )
                for r in rounds
            ]
            if len(ratios) > 1:
                out["round_ratio_stderr" + tail] = statistics.stdev(ratios) / len(ratios) ** 0.5
    return out


# -- one client process: its share of the callers for one phase ---------------------------------


async def caller(
    port: int,
    key: str,
    account: str,
    mode: str,
    at: float,
    counted_from: float,
    end: float,
    wait_s: float,
    tally: Tally,
) -> None:
    """Ask until ``end`` (monotonic); count what is sent, and what is answered, between
    ``counted_from`` and ``end`` (in the steady state the two rates agree)."""
    path = f"/v1/accounts/{account}/auth"
    version: int | None = None
    conn: Connection | None = None
    try:
        while (now := time.monotonic()) < end:
            if at > now:
                await asyncio.sleep(at - now)
                continue
            if conn is None or conn.closing:
                if conn is not None:
                    conn.close()
                conn = await Connection.open(port)
            query = ""
            if mode == "long-poll" and version is not None:
                query = f"?after_version={version}&wait_s={wait_s:g}"
            sent = time.monotonic()
            counted = sent >= counted_from
            tally.sent += counted
            try:
                status, body = await asyncio.wait_for(
                    conn.post(path + query, key, method="GET"), wait_s + 15
                )
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                tally.errors += counted
                conn.close()
                conn = None
                at = sent + 1.0
                continue
            done = time.monotonic()
            counted = counted_from <= done <= end  # a rate: answers in the window
            tally.statuses[str(status)] += counted
            if status != 200:
                at = sent + 1.0
                continue
            tally.answered += counted
            got = int(json.loads(body)["data"]["version"])
            if mode == "poll":  # the next tick of its grid; ticks missed while late are dropped
                at = max(at + 1.0, done)
            elif query and got == version and done - sent < EARLY_S:
                tally.early += counted
                at = sent + EARLY_S
            else:
                at = done
            version = got
    finally:
        if conn is not None:
            conn.close()


async def _callers(args: argparse.Namespace, pairs: list[list[str]]) -> Tally:
    offset = time.monotonic() - time.time()  # wall-clock deadlines shared by every process
    start, end = args.start + offset, args.end + offset
    counted_from = start + args.warmup_s
    tally = Tally()
    tasks = [
        asyncio.ensure_future(
            caller(
                args.port,
                pairs[i % len(pairs)][0],
                pairs[i % len(pairs)][1],
                args.mode,
                start + first_ask(i, args.total, args.mode, args.wait_s),
                counted_from,
                end,
                args.wait_s,
                tally,
            )
        )
        for i in range(args.first, args.first + args.count)
    ]
    # A long-poll still held at the end is dropped with its connection (the caller went away).
    await asyncio.wait(tasks, timeout=max(0.0, end - time.monotonic()) + 1.0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    tally.cpu_s = usage.ru_utime + usage.ru_stime
    return tally


def run_callers(args: argparse.Namespace) -> None:
    tally = asyncio.run(_callers(args, json.loads(Path(args.pairs_file).read_text())))
    print(json.dumps(tally.as_dict()), flush=True)


# -- the run ------------------------------------------------------------------------------------


def make_keys(workdir: Path, workspaces: int, accounts: int) -> tuple[Path, list[list[str]]]:
    """A keys file with one key per workspace, and the (key, account) pairs to ask about."""
    from worker.api.keyfile import create_key

    path = workdir / "api-keys.json"
    pairs = []
    for w in range(workspaces):
        _, key = create_key(path, f"ws_lp{w}")
        pairs += [[key, f"acc_lp{w}_{a}"] for a in range(accounts)]
    return path, pairs


async def register(bootstrap: str, pairs: list[list[str]], workspaces: int) -> None:
    from devstack.demo import register_accounts
    from worker.settings import Settings

    settings = Settings(kafka_bootstrap_servers=bootstrap, environment="development")
    for w in range(workspaces):
        mine = [(acc, f"lp-{acc}") for _, acc in pairs if acc.startswith(f"acc_lp{w}_")]
        await register_accounts(settings, f"ws_lp{w}", mine)


async def until_known(port: int, pairs: list[list[str]], timeout_s: float) -> None:
    """Until the front-end answers 200 for every account (the worker registered them)."""
    deadline = time.monotonic() + timeout_s
    conn = await Connection.open(port)
    try:
        for key, account in pairs:
            while (await conn.post(f"/v1/accounts/{account}/auth", key, method="GET"))[0] != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{account} not registered after {timeout_s}s")
                await asyncio.sleep(0.5)
    finally:
        conn.close()


def load_avg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def phase(
    args: argparse.Namespace, mode: str, port: int, pairs_file: Path, pids: dict[str, int]
) -> Phase:
    """One phase: the stack's CPU read idle over half of ``--idle-s``; then the client
    processes start, ask from ``start``, are counted and the stack's CPU read from ``start +
    warm-up`` to ``end``; once they stopped and the worker's waits ended, idle again."""
    parts = idle_window(pids, args.idle_s / 2, args.idle_parts)
    warmup = args.warmup_s
    start = time.time() + 3.0  # the clients' start-up is outside the phase
    end = start + warmup + args.seconds
    clients: list[subprocess.Popen[bytes]] = []
    callers = args.poll_callers if mode == "poll" and args.poll_callers else args.callers
    share = -(-callers // args.clients)
    for first in range(0, callers, share):
        argv = [sys.executable, "-m", "bench.long_poll_cost", "callers"]
        argv += ["--port", str(port), "--mode", mode, "--pairs-file", str(pairs_file)]
        argv += ["--start", repr(start), "--end", repr(end), "--warmup-s", str(warmup)]
        argv += ["--first", str(first), "--count", str(min(share, callers - first))]
        argv += ["--total", str(callers), "--wait-s", str(args.wait_s)]
        clients.append(
            subprocess.Popen(argv, cwd=REPO_ROOT, env=base_env(), stdout=subprocess.PIPE)
        )
    time.sleep(max(0.0, start + warmup - time.time()))
    before = {r: run_s(pids[r]) for r in ROLES}
    loads = []
    while (left := end - time.time()) > 0:
        time.sleep(min(left, 10.0))
        loads.append(load_avg())
    spent = {r: run_s(pids[r]) - before[r] for r in ROLES}
    tally = Tally()
    for client in clients:
        out, _ = client.communicate(timeout=60)
        got = json.loads(out.decode().strip().splitlines()[-1])
        got["statuses"] = Counter(got["statuses"])
        tally.add(Tally(**got))
    time.sleep(max(0.0, end + drain_s(mode, args.wait_s) - time.time()))
    after = idle_window(pids, args.idle_s / 2, args.idle_parts)
    drift = _cores(after) - _cores(parts)
    parts += after
    idle = {r: sum(cpu[r] for _, cpu in parts) for r in ROLES}
    idle_s = sum(s for s, _ in parts)
    load = sum(loads) / len(loads)
    return Phase(mode, args.seconds, spent, tally, load, idle_s, idle, drift, parts)


def _cores(parts: list[tuple[float, dict[str, float]]], role: str = "worker") -> float:
    return sum(cpu[role] for _, cpu in parts) / sum(s for s, _ in parts)


def run_s(pid: int) -> float:
    """CPU seconds ``pid``'s threads have run, to the nanosecond (/proc schedstat): in clock
    ticks a 10 s part of an idle window of a process at 0.02 cores would be 20 +/- 1."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def idle_window(
    pids: dict[str, int], seconds: float, parts: int
) -> list[tuple[float, dict[str, float]]]:
    """The stack's CPU seconds by role over ``seconds`` of nothing asked, in ``parts``, each
    with its length."""
    out = []
    for _ in range(parts):
        before = {r: run_s(pids[r]) for r in ROLES}
        since = time.time()
        time.sleep(seconds / parts)
        out.append((time.time() - since, {r: run_s(pids[r]) - before[r] for r in ROLES}))
    return out


def query_failures(metrics_port: int) -> Counter[str]:
    """The front-end's GET /auth 500s so far by cause, scraped: the stack's logs go with it."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    return Counter(
        {
            dict(labels)["reason"]: int(value)
            for (name, labels), value in samples_of(text).items()
            if name == "passkey_api_query_failures_total"
        }
    )


def report(done: Phase) -> str:
    t = done.tally
    return (
        f"{done.mode:>9}: offered {t.sent / done.seconds:.1f}/s answered"
        f" {t.answered / done.seconds:.1f}/s ({dict(t.statuses)}, {t.errors} errors,"
        f" {t.early} early); worker {done.cores():.4f} cores ({done.idle_cores():.4f}"
        f" idle, drift {done.idle_drift:+.4f},"
        f" {done.above_idle() / max(1, t.answered) * 1e6:.0f} us an answer; the reference's"
        f" price x{done.price():.3f}), 500s by cause"
        f" {done.failures}, front-end"
        f" {done.cores('front-end'):.3f}, broker {done.cores('broker'):.3f}; clients"
        f" {t.cpu_s:.1f} CPU s; load {done.load_avg:.2f}"
    )


def _start(workdir: Path, keys: Path, timeout_s: float, env: dict[str, str]) -> Stack:
    """The stack, started again (twice at most) when it did not come up: its ports are picked
    free, but another process on the machine may take one before the stack binds it."""
    for _ in range(2):
        try:
            return start_stack(1, workdir, keys, timeout_s, env)
        except RuntimeError as exc:
            print(f"stack start failed ({exc}); again", flush=True)
    return start_stack(1, workdir, keys, timeout_s, env)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Each phase on a stack of its own: the embedded broker's fetches cost what the fetched
    topic holds (bench/README.md, "The embedded broker slows with history"), so on one stack
    the later phases would pay for the earlier ones' GETs."""
    phases: list[Phase] = []
    for round_ in range(args.rounds):
        for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
            workdir = Path(tempfile.mkdtemp(prefix="long-poll-cost-"))
            keys, pairs = make_keys(workdir, args.workspaces, args.accounts)
            pairs_file = workdir / "pairs.json"
            pairs_file.write_text(json.dumps(pairs))
            connections = {
                "API_MAX_CONNECTIONS": str(max(1000, 4 * args.callers)),
                "API_MAX_CONNECTIONS_PER_CLIENT": "0",
            }
            stack = _start(workdir, keys, args.start_timeout_s, connections)
            try:
                port = stack.ports["api"]
                bootstrap = f"127.0.0.1:{stack.ports['broker']}"
                asyncio.run(register(bootstrap, pairs, args.workspaces))
                asyncio.run(until_known(port, pairs, args.start_timeout_s))
                failed = query_failures(stack.ports["api_metrics"])
                done = phase(args, mode, port, pairs_file, stack.pids)
                done.failures = dict(query_failures(stack.ports["api_metrics"]) - failed)
            finally:
                stop_process(stack.proc)
            print(report(done), flush=True)
            phases.append(done)
    summary = summarize(phases)
    summary["phases"] = [
        {"mode": p.mode, "seconds": p.seconds, "cpu_s": p.cpu_s, "load_avg": p.load_avg}
        | {"idle_s": p.idle_s, "idle_cpu_s": p.idle_cpu_s, "idle_drift": p.idle_drift}
        | {"idle_parts": p.idle_parts, "price": p.price()}
        | {"query_failures": p.failures}
        | {"cores": {r: p.cores(r) for r in ROLES}, "tally": p.tally.as_dict()}
        for p in phases
    ]
    summary["args"] = {k: v for k, v in vars(args).items() if k != "fn"}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callers", type=int, default=500)
    parser.add_argument(
        "--poll-callers",
        type=int,
        default=None,
        help="pollers, if not --callers: as many as the long-polls' asks a second, to see "
        "what the same query rate costs polled",
    )
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--seconds", type=float, default=120.0, help="measured, per phase")
    parser.add_argument("--warmup-s", type=float, default=30.0)
    parser.add_argument(
        "--idle-s",
        type=float,
        default=60.0,
        help="each stack measured idle, per phase: half before its callers, half after",
    )
    parser.add_argument(
        "--idle-parts", type=int, default=6, help="each half in parts, for the drift's fit"
    )
    parser.add_argument("--wait-s", type=float, default=30.0, help="each long-poll's wait_s")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workspaces", type=int, default=10)
    parser.add_argument("--accounts", type=int, default=10, help="per workspace")
    parser.add_argument("--start-timeout-s", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=None, help="write the summary here (JSON)")
    sub = parser.add_subparsers(dest="command")
    callers = sub.add_parser("callers", help="(internal) one client process's callers")
    callers.add_argument("--port", type=int, required=True)
    callers.add_argument("--mode", choices=MODES, required=True)
    callers.add_argument("--pairs-file", required=True)
    callers.add_argument("--start", type=float, required=True)
    callers.add_argument("--end", type=float, required=True)
    callers.add_argument("--first", type=int, required=True)
    callers.add_argument("--count", type=int, required=True)
    callers.add_argument("--total", type=int, required=True)
    callers.add_argument("--warmup-s", type=float, default=0.0)
    callers.add_argument("--wait-s", type=float, default=30.0)
    args = parser.parse_args()
    if args.command == "callers":
        run_callers(args)
        return
    summary = run(args)
    text = json.dumps(summary, indent=1, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: summary[k] for k in summary if k not in ("phases", "args")}))


if __name__ == "__main__":
    main()
