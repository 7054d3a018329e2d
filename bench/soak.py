"""``python -m bench.soak``: ordinary traffic through the whole dev stack for a long time.

Fresh accounts are registered on auth.commands (as the account service does) at a steady rate;
once the worker's status event shows an account waiting for its confirmation, and at least
``--confirm-after-s`` later, it is confirmed over HTTP on a pool of keep-alive connections.
Every confirm's outcome is counted; an account is finished when its status event reaches
``authorized`` or ``failed``. Every process's RSS and CPU are sampled every ``--sample-s``,
and the slope of memory per finished account is fitted per process over the run's second half
(warm-up left out). For every confirm not answered 200, the run ends with a trace of where its
command went: its record on auth.commands (partition, offset), its reply on auth.replies,
dead letters and error events, and the stack's log lines naming it.

Load loops are bounded by ``--duration-s`` and stop by themselves; all traffic goes to the
stack on loopback. Figures: bench/README.md ("Soak").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiokafka import TopicPartition

from bench.common import REPO_ROOT, run_meta
from bench.stack import (
    Connection,
    Samples,
    cpu_of,
    percentile,
    samples_of,
    start_stack,
    stop_process,
)
from devstack.keys import DEV_KEY, DEV_WORKSPACE, dev_keys_file
from worker.contract.messages import RegisterAccount
from worker.engine.catch_up import catch_up
from worker.engine.kafka import build_consumer, build_producer
from worker.engine.tail import partitions_of
from worker.settings import Settings

CONFIRM = "/v1/accounts/{}/auth/passkey-confirm"
FINISHED = frozenset({"authorized", "failed"})
IDLE_EXPIRY_S = 2.0
"""A connection idle longer is replaced before use: the front-end closes idle keep-alive
connections, and a request written as it does so is answered by nothing."""
PROCESSES = ("broker", "worker", "dispatcher", "front-end", "simulator", "receiver")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs; None with fewer than 3 points or no spread."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


@dataclass
class Soak:
    """The run's state: accounts by phase, outcomes, samples."""

    prefix: str
    registered: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)
    outcomes: Counter[int | str] = field(default_factory=Counter)
    failed: list[dict[str, Any]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    finished: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)
    confirmed: int = 0
    seen: set[str] = field(default_factory=set)
    #: Seconds each confirm was sent after it was due (the pool was full, or seen late).
    late: list[float] = field(default_factory=list)
    #: When each confirm was sent (monotonic), for the rate minute by minute.
    sent_at: list[float] = field(default_factory=list)


async def watch_status(
    settings: Settings, soak: Soak, stop: asyncio.Event, fetch_wait_ms: int = 10_000
) -> None:
    """Follow auth.status from its end: accounts of this run waiting for their confirm, and
    accounts finished. A long fetch wait: on the embedded broker a fetch that returns data costs
    what the whole topic holds (bench/README.md, "What a fetch costs the embedded broker"), and
    the soak's own reader should not be what loads the stack it measures."""
    consumer = build_consumer(settings.kafka_config(), fetch_max_wait_ms=fetch_wait_ms)
    await consumer.start()
    try:
        parts = await partitions_of(
            consumer, settings.topics.status, deadline=time.monotonic() + 30
        )
        tps = [TopicPartition(settings.topics.status, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            for records in batch.values():
                for record in records:
                    event = json.loads(record.value)
                    account = event.get("account_id", "")
                    if not account.startswith(soak.prefix):
                        continue
                    status = event.get("status")
                    if status == "passkey_confirmation" and account in soak.registered:
                        soak.waiting[account] = time.monotonic()
                        soak.seen.add(account)
                    elif status in FINISHED:
                        soak.finished += 1
    finally:
        await consumer.stop()


async def register(settings: Settings, soak: Soak, rate: float, until: float) -> None:
    """Register ``rate`` fresh accounts a second until ``until`` (monotonic)."""
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        start, n = time.monotonic(), 0
        while time.monotonic() < until:
            due = start + n / rate
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            account = f"{soak.prefix}{n}"
            command = RegisterAccount(
                command_id=f"register-{account}",
                workspace_id=DEV_WORKSPACE,
                account_id=account,
                provider="simulator",
                provider_account_ref=account,
                status="passkey_confirmation",
            )
            soak.registered[account] = time.monotonic()
            await producer.send(
                settings.topics.commands,
                command.model_dump_json().encode(),
                key=account.encode(),
            )
            n += 1
        await producer.flush()
    finally:
        await producer.stop()


class Pool:
    """Keep-alive connections to the front-end, spread over several loopback client addresses
    (127.0.0.1, 127.0.0.2, ...) as many callers would be: the front-end bounds the connections
    of one address, and an open-loop schedule at a rising latency needs more than that bound.
    Idle connections are reused last-in first-out, so the hot ones stay hot and the cold ones
    expire instead of racing the server's keep-alive time-out."""

    def __init__(self, port: int, addresses: int, per_address: int) -> None:
        self.port = port
        self.open_by_address = dict.fromkeys((f"127.0.0.{i}" for i in range(1, addresses + 1)), 0)
        self.per_address = per_address
        self.idle: list[tuple[float, str, Connection]] = []
        self.freed = asyncio.Condition()

    async def take(self) -> tuple[str, Connection]:
        """An idle connection, a new one while an address has room, else wait for one."""
        async with self.freed:
            while True:
                while self.idle:
                    used, address, conn = self.idle.pop()
                    if time.monotonic() - used <= IDLE_EXPIRY_S:
                        return address, conn
                    self._closed(address, conn)
                address = min(self.open_by_address, key=self.open_by_address.__getitem__)
                if self.open_by_address[address] < self.per_address:
                    self.open_by_address[address] += 1
                    break
                await self.freed.wait()
        try:
            return address, await Connection.open(self.port, local_host=address)
        except OSError:
            async with self.freed:
                self.open_by_address[address] -= 1
                self.freed.notify()
            raise

    async def give(self, address: str, conn: Connection, reusable: bool) -> None:
        async with self.freed:
            if reusable and not conn.closing:
                self.idle.append((time.monotonic(), address, conn))
            else:
                self._closed(address, conn)
            self.freed.notify()

    def _closed(self, address: str, conn: Connection) -> None:
        conn.close()
        self.open_by_address[address] -= 1

    def close(self) -> None:
        for _, address, conn in self.idle:
            self._closed(address, conn)
        self.idle.clear()


async def confirm(pool: Pool, soak: Soak, account: str, due: float) -> None:
    """One confirm, its outcome and how late it was sent counted."""
    started, took = time.monotonic(), 0.0
    try:
        address, conn = await pool.take()
    except OSError as exc:
        status, body = 0, repr(exc).encode()
    else:
        started = time.monotonic()
        reusable = False
        try:
            status, body = await conn.post(CONFIRM.format(account), DEV_KEY)
            reusable = True
        except Exception as exc:  # any failed exchange (a malformed answer too) is its outcome
            status, body = 0, repr(exc).encode()
        finally:  # the slot goes back whatever the exchange raised (a cancel included)
            took = time.monotonic() - started
            await pool.give(address, conn, reusable)
    soak.confirmed += 1
    soak.outcomes[status] += 1
    soak.latencies.append(took)
    soak.late.append(max(0.0, started - due))
    soak.sent_at.append(started)
    if status != 200:
        soak.failed.append(
            {
                "account_id": account,
                "status": status,
                "seconds": round(took, 3),
                "at_s": round(started, 3),
                "body": body[:300].decode(errors="replace"),
            }
        )


async def confirmer(pool: Pool, soak: Soak, after_s: float, stop: asyncio.Event) -> None:
    """Confirm each account ``after_s`` after its registration, once it is seen waiting, on an
    open-loop schedule: a confirm is sent when due whatever the earlier ones are still waiting
    for (up to the pool's capacity), so a rising latency shows as latency, not as a falling
    rate. How late each was sent is kept (``late``)."""
    in_flight: set[asyncio.Task[None]] = set()
    try:
        while not stop.is_set():
            account = next(iter(soak.waiting), None)
            if account is None:
                await asyncio.sleep(0.01)
                continue
            del soak.waiting[account]
            due = soak.registered[account] + after_s
            if (pause := due - time.monotonic()) > 0:
                await asyncio.sleep(pause)
            task = asyncio.create_task(confirm(pool, soak, account, due))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:  # each is answered within the front-end's reply deadline
            await asyncio.wait(in_flight, timeout=60)
    finally:
        for task in in_flight:
            task.cancel()
        pool.close()


async def sample(pids: dict[str, int], soak: Soak, every_s: float, stop: asyncio.Event) -> None:
    started = time.monotonic()
    while not stop.is_set():
        row: dict[str, Any] = {
            "t_s": round(time.monotonic() - started, 1),
            "finished": soak.finished,
            "confirmed": soak.confirmed,
        }
        for name, pid in pids.items():
            with contextlib.suppress(OSError):
                user, system = cpu_of(pid)
                row[name] = {"rss_mb": round(rss_mb(pid), 2), "cpu_s": round(user + system, 2)}
        soak.samples.append(row)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def scrape(port: int) -> Samples:
    """A process's metrics page at the end of the run (``samples_of``); empty when the page
    cannot be read."""
    async with httpx.AsyncClient(timeout=5) as client:
        try:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        except httpx.HTTPError:
            return {}
    return samples_of(text)


async def held_in_memory(ports: dict[str, int]) -> dict[str, float | None]:
    """What the worker and the dispatcher say they hold, scraped from their metrics at the end:
    accounts in the worker's store, (endpoint, account) pairs in the dispatcher's."""
    wanted = {
        "worker": (ports["worker"], "passkey_auth_state_store_accounts"),
        "dispatcher": (ports["webhooks"], "passkey_webhook_state_store_accounts"),
    }
    return {name: (await scrape(port)).get((metric, ())) for name, (port, metric) in wanted.items()}


def confirms_per_minute(sent_at: list[float]) -> list[int]:
    """Confirms sent in each whole minute from the first (a last, partial minute left out)."""
    if not sent_at:
        return []
    first = min(sent_at)
    counts = Counter(int((t - first) // 60) for t in sent_at)
    whole = int((max(sent_at) - first) // 60)
    return [counts[m] for m in range(whole)]


async def refusals(ports: dict[str, int]) -> dict[str, float]:
    """The front door's refusals by reason (``passkey_api_refusals_total``), scraped at the end:
    a plain-text 503 below the app names no reason, its counter does."""
    return {
        f'reason="{dict(labels).get("reason", "")}"': value
        for (name, labels), value in (await scrape(ports["api_metrics"])).items()
        if name == "passkey_api_refusals_total"
    }


def slopes(samples: list[dict[str, Any]], names: list[str]) -> dict[str, float | None]:
    """MB per 1,000 finished accounts, per process, over the second half of the samples."""
    half = samples[len(samples) // 2 :]
    out: dict[str, float | None] = {}
    for name in names:
        points = [(s["finished"], s[name]["rss_mb"]) for s in half if name in s]
        fitted = slope([p[0] for p in points], [p[1] for p in points])
        out[name] = None if fitted is None else round(fitted * 1000, 3)
    return out


async def trace(settings: Settings, failed: list[dict[str, Any]], log: Path) -> None:
    """Where each failed confirm's command went (see the module docstring)."""
    accounts = {f["account_id"]: f for f in failed}
    if not accounts:
        return
    for f in failed:
        f["trace"] = {
            "commands": [],
            "replies": [],
            "status": [],
            "errors": [],
            "dlq": [],
            "log": [],
        }
    topics = settings.topics
    for topic, kind in (
        (topics.commands, "commands"),
        (topics.replies, "replies"),
        (topics.status, "status"),
        (topics.errors, "errors"),
        (topics.dlq, "dlq"),
    ):
        consumer = build_consumer(settings.kafka_config(), fetch_max_wait_ms=100)
        await consumer.start()
        try:
            parts = await partitions_of(consumer, topic, deadline=time.monotonic() + 30)
            tps = [TopicPartition(topic, p) for p in sorted(parts)]

            def take(tp: TopicPartition, records: list[Any], kind: str = kind) -> None:
                for record in records:
                    text = (record.value or b"").decode(errors="replace")
                    for account in accounts:
                        if account in text:
                            entry = {"partition": tp.partition, "offset": record.offset}
                            with contextlib.suppress(ValueError):
                                value = json.loads(text)
                                entry |= {
                                    k: value.get(k)
                                    for k in ("type", "command_id", "http_status", "status")
                                    if isinstance(value, dict) and k in value
                                }
                            accounts[account]["trace"][kind].append(entry)

            await catch_up(consumer, tps, take, max_records=5000)
        finally:
            await consumer.stop()
    await asyncio.to_thread(_log_lines, log, accounts)


def _log_lines(log: Path, accounts: dict[str, dict[str, Any]]) -> None:
    with open(log, errors="replace") as lines:
        for line in lines:
            for account in accounts:
                if account in line:
                    accounts[account]["trace"]["log"].append(line.strip()[:400])


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    fig, (mem, cpu) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    t = [s["t_s"] / 60 for s in samples]
    for name in result["processes"]:
        mem.plot(t, [s.get(name, {}).get("rss_mb", float("nan")) for s in samples], label=name)
        cpu_s = [s.get(name, {}).get("cpu_s", float("nan")) for s in samples]
        rate = [
            (b - a) / max(1e-9, (tb - ta) * 60)
            for a, b, ta, tb in zip(cpu_s, cpu_s[1:], t, t[1:], strict=False)
        ]
        cpu.plot(t[1:], rate, label=name)
    mem.set_ylabel("RSS (MB)")
    mem.set_yscale("log")
    mem.legend(fontsize=8)
    cpu.set_ylabel("CPU (cores)")
    cpu.set_xlabel("minutes")
    fig.suptitle(
        f"soak: {result['params']['rate']}/s for {result['params']['duration_s']} s, "
        f"{result['confirms']} confirms, {result['outcomes']}"
    )
    fig.savefig(path, dpi=80)


def stack_env(args: argparse.Namespace) -> dict[str, str]:
    """The stack's partition counts and the dispatcher's fetch wait, where the run sets them
    (unset: make run's)."""
    env = {}
    if args.partitions:
        env["COMMANDS_PARTITIONS"] = env["OTHER_PARTITIONS"] = str(args.partitions)
    if args.commands_partitions:
        env["COMMANDS_PARTITIONS"] = str(args.commands_partitions)
    if args.dispatcher_fetch_wait_ms:
        env["DISPATCHER_FETCH_MAX_WAIT_MS"] = str(args.dispatcher_fetch_wait_ms)
    return env


async def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    keys = dev_keys_file(workdir / "api-keys.json")
    tree = args.stack_tree or REPO_ROOT
    stack = start_stack(2, workdir, keys, args.start_timeout_s, stack_env(args), tree=tree)
    settings = Settings(
        kafka_bootstrap_servers=f"127.0.0.1:{stack.ports['broker']}",
        log_format="console",
        log_level="WARNING",
    )
    soak = Soak(prefix=f"acc_soak_{uuid.uuid4().hex[:6]}_")
    stop = asyncio.Event()
    names = [n for n in PROCESSES if n in stack.pids]
    pool = Pool(stack.ports["api"], args.client_addresses, args.connections)
    pids = {n: stack.pids[n] for n in names}
    try:
        tasks = [
            asyncio.create_task(watch_status(settings, soak, stop, args.watch_fetch_wait_ms)),
            asyncio.create_task(sample(pids, soak, args.sample_s, stop)),
            asyncio.create_task(confirmer(pool, soak, args.confirm_after_s, stop)),
        ]
        await asyncio.sleep(1)  # the status watcher is at the end before the first account
        until = time.monotonic() + args.duration_s
        await register(settings, soak, args.rate, until)
        # The last accounts: confirmed once seen, or given up on after the drain time.
        for _ in range(int(args.drain_s / 0.2)):
            if not soak.waiting and soak.confirmed >= len(soak.registered):
                break
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*tasks)
        never_seen = len(soak.registered) - len(soak.seen)
        unseen = [
            {"account_id": a, "status": "registration_never_seen"}
            for a in soak.registered
            if a not in soak.seen
        ]
        held = await held_in_memory(stack.ports)
        refused = await refusals(stack.ports)
        await trace(settings, soak.failed + unseen[:50], stack.log)
    finally:
        stop.set()
        stop_process(stack.proc)
    latencies = sorted(soak.latencies)
    late = sorted(soak.late)
    result = {
        **run_meta(
            "python -m bench.soak", sys.argv[1:], {k: str(v) for k, v in vars(args).items()}
        ),
        "processes": names,
        "accounts": len(soak.registered),
        "confirms": soak.confirmed,
        "registrations_never_seen": never_seen,
        "outcomes": {str(k): v for k, v in soak.outcomes.items()},
        "finished": soak.finished,
        "unconfirmed": len(soak.registered) - soak.confirmed,
        "sent_late_s": {
            "p50": round(percentile(late, 0.5), 3) if late else None,
            "p99": round(percentile(late, 0.99), 3) if late else None,
            "max": round(late[-1], 3) if late else None,
        },
        "confirms_per_minute": confirms_per_minute(soak.sent_at),
        "latency_p50_ms": round(latencies[len(latencies) // 2] * 1000, 1) if latencies else None,
        "latency_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1)
        if latencies
        else None,
        "mb_per_1000_finished": slopes(soak.samples, names),
        "held_at_end": held,
        "front_door_refusals": refused,
        "failed": soak.failed,
        "never_seen": unseen[:50],
        "samples": soak.samples,
        "log": str(stack.log),
    }
    if not (soak.failed or unseen or args.keep_logs):
        # Nothing to trace: the stack's log and keys go (a run that failed keeps them).
        shutil.rmtree(workdir, ignore_errors=True)
        result["log"] = None
    return result


def report(result: dict[str, Any]) -> str:
    lines = [
        f"accounts {result['accounts']}, confirms {result['confirms']}, "
        f"outcomes {result['outcomes']}, finished {result['finished']}, "
        f"registrations never seen {result['registrations_never_seen']}",
        f"confirm latency p50 {result['latency_p50_ms']} ms, p99 {result['latency_p99_ms']} ms",
        f"registered but not confirmed by the end {result['unconfirmed']}; confirms sent after "
        f"due (s) {result['sent_late_s']}; sent per minute {result['confirms_per_minute']}",
        "MB per 1,000 finished accounts (second half): "
        + ", ".join(f"{k} {v}" for k, v in result["mb_per_1000_finished"].items()),
    ]
    lines.append(
        "held at the end: "
        + ", ".join(f"{k} {v}" for k, v in result["held_at_end"].items())
        + " (worker: accounts in its store; dispatcher: (endpoint, account) pairs)"
    )
    last = result["samples"][-1] if result["samples"] else {}
    lines.append(
        "RSS at the end (MB): "
        + ", ".join(f"{k} {last[k]['rss_mb']}" for k in result["processes"] if k in last)
    )
    refused = {k: v for k, v in result["front_door_refusals"].items() if v}
    lines.append(f"front door's refusals by reason (nonzero): {refused}")
    for f in result["failed"][:20]:
        lines.append(f"  not 200: {json.dumps(f)[:600]}")
    for f in result["never_seen"][:10]:
        lines.append(f"  registration never seen: {json.dumps(f)[:600]}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--duration-s", type=float, default=1800)
    parser.add_argument("--rate", type=float, default=50, help="accounts registered a second")
    parser.add_argument("--confirm-after-s", type=float, default=1.0)
    parser.add_argument(
        "--connections",
        type=int,
        default=50,
        help="keep-alive connections at most per client address: half the front-end's "
        "API_MAX_CONNECTIONS_PER_CLIENT (100 by default), because when a bunch of confirms "
        "comes due the pool replaces its expired idle connections at once, and the server "
        "counts the closed ones until it has read their end",
    )
    parser.add_argument(
        "--client-addresses",
        type=int,
        default=8,
        help="loopback addresses the confirms come from (127.0.0.1 up): the pool's capacity is "
        "this times --connections, what the open-loop schedule can have in flight",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="partitions of the stack's topics (0: make run's); the embedded broker's cost "
        "per data-bearing fetch grows with what the fetched partition holds",
    )
    parser.add_argument(
        "--commands-partitions",
        type=int,
        default=0,
        help="partitions of auth.commands and auth.state (0: as --partitions); the topic read "
        "with the shortest wait at the highest rate, so the largest share of the embedded "
        "broker's listing",
    )
    parser.add_argument(
        "--dispatcher-fetch-wait-ms",
        type=int,
        default=0,
        help="the dev stack's DISPATCHER_FETCH_MAX_WAIT_MS (0: its default); a longer wait "
        "makes the dispatcher's reads of auth.status list each partition less often",
    )
    parser.add_argument(
        "--watch-fetch-wait-ms",
        type=int,
        default=10_000,
        help="the fetch wait of the soak's own reader of auth.status (which accounts wait for "
        "their confirm, which finished): on the embedded broker each of its fetches costs what "
        "the topic holds, so a short one loads the stack it measures; a registration is seen "
        "at most about this late",
    )
    parser.add_argument(
        "--stack-tree",
        type=Path,
        default=None,
        help="run the stack of another checkout under this driver (for example a worktree of "
        "an older commit, to see what it keeps), with this interpreter",
    )
    parser.add_argument("--sample-s", type=float, default=30)
    parser.add_argument("--drain-s", type=float, default=30)
    parser.add_argument("--start-timeout-s", type=float, default=120)
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the stack's log and keys after a clean run"
    )
    parser.add_argument("--plot", type=Path, default=None, help="PNG of RSS and CPU over time")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = asyncio.run(run(args))
    print(report(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot)
    ok = result["outcomes"].keys() <= {"200"} and result["registrations_never_seen"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
