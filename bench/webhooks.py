"""``python -m bench.webhooks`` (or ``python -m bench --webhooks``): webhook delivery benchmark.

One dispatcher PROCESS (``python -m worker webhooks``) delivers signed webhooks to one endpoint
of the workspace: a local receiver process (``bench.webhook_receiver``) answering 204 and
recording when each ``webhook-id`` arrived. Everything runs on loopback next to a fresh
embedded broker started here, so the dispatcher's own cost is what is measured: no provider,
no network, a receiver that does nothing.

1. *Max rate*: ``--events`` status events (``--versions`` per account, accounts interleaved)
   are produced to auth.status first, then the dispatcher starts; deliveries/s from the first
   to the last arrival at the receiver, and the dispatcher's user and system CPU per delivery
   (``/proc/<pid>/stat``, from the first delivery seen to the last), with the receiver's, the
   broker's and this process's CPU for context.
2. *Latency curve*: open-loop arrivals at ``--fractions`` of that rate for ``--seconds`` each,
   fresh accounts per point; ``occurred_at`` is the scheduled send time and latency is the
   receiver's arrival time minus it (so a generator that falls behind shows as latency).
3. *Noisy neighbour*: open-loop arrivals at ``--noisy-rate`` (default a quarter of the max
   rate) for ``--noisy-seconds``, first with the healthy endpoint alone, then again (fresh
   accounts) after a second endpoint of the workspace was registered that accepts
   connections and never answers (a server in this process on loopback, so every attempt
   to it waits the dispatcher's whole time-out). The healthy endpoint's p99 both times, and
   their ratio, against the aim: within max(2 s, 5x its p99 alone).

0. *Floor* (unless ``--no-floor``): the same count of events, pre-loaded on topics of their
   own, drained by the dispatcher's floor (``bench.webhook_floor``: render, sign, POST with
   the dispatcher's client, each account in order, the dispatcher's log entries in its
   window's records; nothing else), in its own process, once before the dispatcher starts
   and once after its max-rate run (so neither always runs first); its CPU per delivery as
   in phase 1 (the same window rule: first to last arrival), the mean of both runs, and the
   dispatcher's ÷ the floor's printed after the table.

Every phase is bounded in count and time (``--phase-timeout``). Writes ``--out`` (JSON) and
prints the measured figures next to the aims: ≥ 2,000 signed deliveries/s per process,
p99 ≤ 100 ms at 50 % of the max rate, and the noisy-neighbour bound. Method and measured
numbers: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaProducer

from bench import baseline
from bench.common import REPO_ROOT, base_env, clean, fmt, fractions, run_meta, topics_named
from bench.load import (
    Progress,
    host_busy_s,
    percentile,
    proc_cpu_s,
    proc_peak_rss,
    proc_user_sys_s,
)
from bench.procs import Proc, start_proc, start_profiler, stop_procs
from bench.stack import samples_of
from bench.webhook_receiver import SECRET_ENV
from devstack.broker import EmbeddedBroker, free_port, wait_for_port
from devstack.settings import EMBEDDED_FETCH_MAX_WAIT_MS, EMBEDDED_OFFSET_GAP_HOLD_S
from worker.contract.delivery_log import webhook_id
from worker.contract.messages import AuthStatusChanged, event_id
from worker.contract.topics import Topics
from worker.contract.webhook_endpoints import EndpointRecord
from worker.engine.kafka import build_producer, ensure_topics
from worker.runtime import eventloop
from worker.settings import Settings
from worker.webhooks.endpoint_writes import EndpointStore
from worker.webhooks.endpoints import EndpointRegistry
from worker.webhooks.secrets_box import SecretsBox, generate_key

WORKSPACE = "ws_bench_hooks"
STATUSES = ("passkey_confirmation", "passkey_confirmation_sent", "authorized", "failed")
AIM_RATE = 2000.0  # signed deliveries/s per dispatcher process
AIM_P99_MS = 100.0  # at 50 % of the measured max rate
AIM_NOISY_FLOOR_MS = 2000.0  # a hanging neighbour: p99 within max(this, 5x the p99 alone)
AIM_NOISY_FACTOR = 5.0


# --------------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.webhooks",
        description="Webhook delivery benchmark: one dispatcher process, one local endpoint.",
    )
    p.add_argument("--events", type=int, default=20_000, help="events of the max-rate run")
    p.add_argument("--versions", type=int, default=4, help="status versions per account (4)")
    p.add_argument(
        "--fractions",
        type=fractions,
        default=[0.5],
        help="open-loop rates as fractions of the measured max (0.5; e.g. 0.1,0.5,0.9; '' skips)",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="length of each curve point (10)")
    p.add_argument(
        "--max-rate", type=float, default=None, help="use this max rate; skips the max-rate run"
    )
    p.add_argument(
        "--noisy-rate",
        type=float,
        default=None,
        help="events/s of the noisy-neighbour phase (default: 25%% of the max rate, 200/s "
        "without one)",
    )
    p.add_argument(
        "--noisy-seconds",
        type=float,
        default=20.0,
        help="length of each half of the noisy-neighbour phase (20; 0 skips it)",
    )
    p.add_argument("--partitions", type=int, default=12, help="partitions per topic (12)")
    p.add_argument(
        "--no-floor", action="store_true", help="skip the floor phase (bench.webhook_floor)"
    )
    p.add_argument(
        "--max-in-flight", type=int, default=None, help="WEBHOOK_MAX_IN_FLIGHT (worker default)"
    )
    p.add_argument(
        "--take-in-hold-s",
        type=float,
        default=None,
        help="WEBHOOK_TAKE_IN_HOLD_S (the dispatcher's default)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="the receiver verifies every signature with standardwebhooks (costs its CPU)",
    )
    p.add_argument("--phase-timeout", type=float, default=180.0, help="bound of each phase (s)")
    p.add_argument(
        "--out", type=Path, default=REPO_ROOT / "bench" / "webhooks-results.json", help="JSON"
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy raw collapsed stacks of the dispatcher over the max-rate run (a file)",
    )
    p.add_argument(
        "--cprofile",
        type=Path,
        default=None,
        help="run the dispatcher under cProfile timed by CPU (bench.cprofiled) and write its "
        "stats here; it slows the dispatcher several times over, so read shares, not times",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the process logs (temp dir)")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    baseline.add_arguments(p)
    return p


class PhaseFailed(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------
# events
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Events:
    """``count`` status events over ``count / versions`` accounts, interleaved: event ``i`` is
    version ``i // accounts + 1`` of account ``i % accounts``, so one account's versions are
    spread over the stream (the dispatcher sends one account's deliveries one at a time)."""

    tag: str
    count: int
    versions: int

    @property
    def accounts(self) -> int:
        return max(1, math.ceil(self.count / self.versions))

    def at(self, i: int, occurred_at: float) -> tuple[str, bytes, bytes]:
        """(event_id, key, value) of event ``i``."""
        account = f"acc-{self.tag}-{i % self.accounts:07d}"
        version = i // self.accounts + 1
        status = STATUSES[min(version, len(STATUSES) - 1)]
        stamp = datetime.fromtimestamp(occurred_at, UTC).isoformat(timespec="milliseconds")
        event = AuthStatusChanged(
            event_id=event_id("status", account, version),
            account_id=account,
            workspace_id=WORKSPACE,
            previous_status=STATUSES[min(version - 1, len(STATUSES) - 1)],
            status=status,
            auth_status=status,
            version=version,
            occurred_at=stamp.replace("+00:00", "Z"),
        )
        return event.event_id, account.encode(), event.model_dump_json().encode()

    def ids(self) -> Iterator[str]:
        for i in range(self.count):
            account = f"acc-{self.tag}-{i % self.accounts:07d}"
            yield event_id("status", account, i // self.accounts + 1)


# --------------------------------------------------------------------------------------------
# /proc
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """CPU seconds of every process at one instant, with the receiver's delivery count."""

    wall: float
    delivered: int
    user: float
    system: float
    receiver: float
    broker: float
    bench: float
    host: float


class HangingServer:
    """A loopback endpoint that accepts every connection, reads the request and never
    answers: each attempt to it lasts the dispatcher's whole time-out."""

    def __init__(self) -> None:
        self.url = ""
        self.connections = 0
        self.max_open = 0
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/hooks"

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._open.add(writer)
        self.max_open = max(self.max_open, len(self._open))
        try:
            while await reader.read(65536):
                pass
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._open.discard(writer)
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------


@dataclass
class HookBench:
    args: argparse.Namespace
    settings: Settings
    broker_pid: int | None
    log_dir: Path
    receiver_url: str = ""
    endpoint: EndpointRecord | None = None
    secret: str = ""
    receiver: Proc | None = None
    dispatcher: Proc | None = None
    floor: Proc | None = None
    dispatcher_port: int = 0
    http: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        assert self.http is not None
        return self.http

    # -- set-up ------------------------------------------------------------------------------

    async def create_endpoint(self, url: str, role: str = "healthy") -> None:
        """An endpoint for the workspace, every event type: the healthy one before the
        dispatcher starts (it reads the endpoints topic to its end first); a ``hanging`` one
        later, which the dispatcher's tail picks up while it runs."""
        producer = build_producer(self.settings.kafka_config())
        await producer.start()
        try:
            key = self.settings.webhook_secrets_key
            assert key is not None
            store = EndpointStore(
                producer=producer,
                topic=self.settings.topics.webhook_endpoints,
                registry=EndpointRegistry(),
                cipher=SecretsBox(key.get_secret_value()),
            )
            record, secret = await store.create(
                WORKSPACE, url=url, event_types=None, description=f"bench.webhooks {role}"
            )
            if role == "healthy":
                self.endpoint, self.secret = record, secret
        finally:
            await producer.stop()

    def start_receiver(self, port: int) -> None:
        """The receiver on the port the endpoint was created with."""
        self.receiver_url = f"http://127.0.0.1:{port}"
        argv = ["-m", "bench.webhook_receiver", "--port", str(port)]
        if self.args.verify:
            argv.append("--verify")
        env = base_env(self.args.log_level) | {SECRET_ENV: self.secret}
        self.receiver = start_proc("receiver", argv, env, self.log_dir)
        wait_for_port("127.0.0.1", port, 30.0)

    def dispatcher_env(self) -> dict[str, str]:
        s = self.settings
        key = s.webhook_secrets_key
        assert key is not None
        env = base_env(self.args.log_level) | {
            "KAFKA_BOOTSTRAP_SERVERS": s.bootstrap,
            "KAFKA_SESSION_TIMEOUT_MS": "6000",
            "KAFKA_HEARTBEAT_INTERVAL_MS": "500",
            "KAFKA_FETCH_MAX_WAIT_MS": str(EMBEDDED_FETCH_MAX_WAIT_MS),
            "KAFKA_OFFSET_GAP_HOLD_S": str(EMBEDDED_OFFSET_GAP_HOLD_S),
            "COMMANDS_PARTITIONS": str(s.commands_partitions),
            "OTHER_PARTITIONS": str(s.other_partitions),
            "WEBHOOK_SECRETS_KEY": key.get_secret_value(),
            "WEBHOOK_ALLOW_HTTP": "true",
            "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
            "WEBHOOK_CONSUMER_GROUP": s.webhook_consumer_group,
            "WEBHOOK_METRICS_HOST": "127.0.0.1",
            "WEBHOOK_METRICS_PORT": str(self.dispatcher_port),
            "WORKER_SHUTDOWN_GRACE_S": "5",
        }
        if self.args.max_in_flight is not None:
            env["WEBHOOK_MAX_IN_FLIGHT"] = str(self.args.max_in_flight)
        if self.args.take_in_hold_s is not None:
            env["WEBHOOK_TAKE_IN_HOLD_S"] = str(self.args.take_in_hold_s)
        # The max-rate backlog is one workspace's: past the default cap (10,000 waiting) the
        # run would measure refusals, then wait out its time-out for deliveries never made.
        env["WEBHOOK_WORKSPACE_MAX_PENDING"] = str(max(10_000, 2 * self.args.events))
        env.update({f"TOPIC_{f.upper()}": getattr(s.topics, f) for f in Topics.model_fields})
        return env

    def start_dispatcher(self) -> None:
        self.dispatcher_port = free_port()
        argv = ["-m", "worker", "webhooks"]
        if self.args.cprofile is not None:
            argv = ["-m", "bench.cprofiled", str(self.args.cprofile.resolve()), *argv[1:]]
        self.dispatcher = start_proc("dispatcher", argv, self.dispatcher_env(), self.log_dir)

    async def wait_dispatcher_ready(self, timeout: float = 90.0) -> None:
        """/readyz 200: joined, partitions assigned and restored."""
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.dispatcher_port}/readyz"
        while True:
            self.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                if (await self.client.get(url)).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise PhaseFailed("the dispatcher was not ready in time")
            await asyncio.sleep(0.2)

    def check_alive(self) -> None:
        for proc in (self.dispatcher, self.floor, self.receiver):
            if proc is not None and not proc.alive():
                raise PhaseFailed(f"{proc.name} exited:\n{proc.tail()}")

    # -- measuring ---------------------------------------------------------------------------

    async def receiver_counts(self) -> dict[str, Any]:
        answer = await self.client.get(f"{self.receiver_url}/_stats")
        answer.raise_for_status()
        counts: dict[str, Any] = answer.json()
        return counts

    async def take_arrivals(self) -> dict[str, Any]:
        answer = await self.client.post(f"{self.receiver_url}/_take")
        answer.raise_for_status()
        taken: dict[str, Any] = answer.json()
        return taken

    @property
    def measured(self) -> Proc | None:
        """The delivering process: the floor while its phase runs, else the dispatcher."""
        return self.floor or self.dispatcher

    def snapshot(self, delivered: int) -> Snapshot:
        measured = self.measured
        assert measured is not None and self.receiver is not None
        user, system = proc_user_sys_s(measured.pid)
        return Snapshot(
            wall=time.monotonic(),
            delivered=delivered,
            user=user,
            system=system,
            receiver=proc_cpu_s(self.receiver.pid),
            broker=proc_cpu_s(self.broker_pid) if self.broker_pid else math.nan,
            bench=time.process_time(),
            host=host_busy_s(),
        )

    async def wait_delivered(
        self, want: int, progress: Progress, deadline: float
    ) -> tuple[Snapshot | None, Snapshot]:
        """Poll the receiver until ``want`` unique deliveries; returns the snapshots at the
        first poll that saw a delivery and at the end. When everything arrived between two
        polls there is no such window, and the first snapshot is the one taken before the
        wait (the window then includes the process's start; ``_cpu`` says so)."""
        start = self.snapshot(0)
        first: Snapshot | None = None
        while True:
            self.check_alive()
            unique = int((await self.receiver_counts())["unique"])
            if first is None and unique > 0:
                first = self.snapshot(unique)
            progress.update(unique)
            if unique >= want or time.monotonic() > deadline:
                progress.close(unique)
                if first is not None and first.delivered >= unique:
                    first = start
                return first, self.snapshot(unique)
            await asyncio.sleep(0.05)

    # -- phases ------------------------------------------------------------------------------

    async def preload(self, events: Events, topics: Topics | None = None) -> None:
        topic = (topics or self.settings.topics).status
        producer = build_producer(self.settings.kafka_config())
        await producer.start()
        try:
            pending: list[asyncio.Future[Any]] = []
            now = time.time()
            for i in range(events.count):
                _, key, value = events.at(i, now)
                pending.append(await producer.send(topic, value, key=key))
                if len(pending) >= 2000:
                    await asyncio.gather(*pending)
                    pending.clear()
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

    async def max_rate(self) -> dict[str, Any]:
        """Pre-loaded events, then the dispatcher starts: the rate it drains them at."""
        a = self.args
        events = Events("max", a.events, a.versions)
        print(f"max rate: producing {events.count:,} events ...", file=sys.stderr)
        await self.preload(events)
        self.start_dispatcher()
        assert self.dispatcher is not None
        out = await self.drain(events, self.dispatcher, a.profile)
        out["dispatcher_peak_rss_mb"] = round(proc_peak_rss(self.dispatcher.pid) / 2**20, 1)
        return out

    async def floor_rate(self, tag: str, when: str = "before") -> dict[str, Any]:
        """The same pre-loaded count drained by the dispatcher's floor, on topics of its own
        (the dispatcher, when running, sees none of them); ``when``: before or after the
        dispatcher's max-rate run."""
        a = self.args
        topics = topics_named(f"hooks-{tag}-floor-{when}")
        floor_settings = self.settings.model_copy(update={"topics": topics})
        await ensure_topics(floor_settings.kafka_config(), floor_settings.topic_plan())
        events = Events(f"floor-{when}", a.events, a.versions)
        print(f"floor: producing {events.count:,} events ...", file=sys.stderr)
        await self.preload(events, topics)
        assert self.endpoint is not None
        env = self.dispatcher_env() | {
            f"TOPIC_{f.upper()}": getattr(topics, f) for f in Topics.model_fields
        }
        env |= {
            "WEBHOOK_CONSUMER_GROUP": f"hooks-{tag}-floor-{when}.group",
            "FLOOR_ENDPOINT_ID": self.endpoint.id,
            "FLOOR_ENDPOINT_URL": self.endpoint.url,
            "FLOOR_WORKSPACE_ID": WORKSPACE,
            SECRET_ENV: self.secret,
        }
        self.floor = start_proc("floor", ["-m", "bench.webhook_floor"], env, self.log_dir)
        try:
            label = f"[floor, {when}] delivered"
            out = await self.drain(events, self.floor, None, label=label)
            out["floor_peak_rss_mb"] = round(proc_peak_rss(self.floor.pid) / 2**20, 1)
            out["when"] = when
        finally:
            await asyncio.to_thread(stop_procs, [self.floor])
            self.floor = None
        return out

    async def drain(
        self, events: Events, proc: Proc, profile: Path | None, label: str = "[max rate] delivered"
    ) -> dict[str, Any]:
        """Wait until ``proc`` delivered every pre-loaded event; rate and CPU per delivery."""
        a = self.args
        profiler = None if profile is None else start_profiler(proc.pid, profile)
        try:
            progress = Progress(label, events.count)
            deadline = time.monotonic() + a.phase_timeout
            first, last = await self.wait_delivered(events.count, progress, deadline)
        finally:
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(profiler.wait, 30)
        taken = await self.take_arrivals()
        arrivals: dict[str, float] = taken["arrivals"]
        wanted = self._webhook_ids(events)
        times = sorted(arrivals[w] for w in wanted if w in arrivals)
        window = times[-1] - times[0] if len(times) > 1 else math.nan
        out: dict[str, Any] = {
            "events": events.count,
            "accounts": events.accounts,
            "versions": events.versions,
            "delivered": len(times),
            "complete": len(times) == events.count,
            "requests": taken["requests"],
            "duplicates": taken["duplicates"],
            "verified": taken["verified"],
            "verify_failed": taken["verify_failed"],
            "seconds": round(window, 3),
            "deliveries_per_s": round((len(times) - 1) / window, 1) if window > 0 else 0.0,
        }
        out |= self._cpu(first, last)
        return out

    async def curve_point(self, fraction: float, max_rate: float, index: int) -> dict[str, Any]:
        """Open-loop arrivals at ``fraction`` of ``max_rate`` for ``--seconds``."""
        rate = fraction * max_rate
        point = await self.open_loop(
            rate, self.args.seconds, f"c{index}", f"[{fraction:.0%} of max] delivered"
        )
        return {"fraction_of_max": fraction, "max_rate": round(max_rate, 1)} | point

    async def open_loop(self, rate: float, seconds: float, tag: str, label: str) -> dict[str, Any]:
        """Open-loop arrivals at ``rate`` for ``seconds`` to fresh accounts; the healthy
        endpoint's latencies."""
        a = self.args
        count = max(20, int(rate * seconds))
        events = Events(tag, count, a.versions)
        producer = build_producer(self.settings.kafka_config())
        await producer.start()
        scheduled: dict[str, float] = {}
        behind = 0.0
        try:
            progress = Progress(label, count)
            before = self.snapshot(0)
            deadline = time.monotonic() + seconds + a.phase_timeout
            sender = asyncio.create_task(
                self._send_open_loop(producer, events, rate, scheduled, deadline)
            )
            _, after = await self.wait_delivered(count, progress, deadline)
            behind = await sender
        finally:
            await producer.stop()
        taken = await self.take_arrivals()
        arrivals: dict[str, float] = taken["arrivals"]
        assert self.endpoint is not None
        lat = [
            (arrivals[w] - sent) * 1000.0
            for e, sent in scheduled.items()
            if (w := webhook_id(e, self.endpoint.id)) in arrivals
        ]
        times = sorted(
            arrivals[w] for e in scheduled if (w := webhook_id(e, self.endpoint.id)) in arrivals
        )
        first_sent = min(scheduled.values(), default=math.nan)
        window = (times[-1] - first_sent) if times else math.nan
        out: dict[str, Any] = {
            "offered_rate": round(rate, 1),
            "events": count,
            "sent": len(scheduled),
            "delivered": len(lat),
            "complete": len(lat) == count,
            "duplicates": taken["duplicates"],
            "verified": taken["verified"],
            "verify_failed": taken["verify_failed"],
            "achieved_per_s": round(len(lat) / window, 1) if window > 0 else 0.0,
            "generator_behind_max_ms": round(behind * 1000.0, 1),
            "latency_ms": {
                q: round(percentile(lat, n), 1) for q, n in (("p50", 50), ("p90", 90), ("p99", 99))
            }
            | {"max": round(max(lat), 1) if lat else math.nan},
        }
        return out | self._cpu(before, after)

    async def noisy_neighbour(self, rate: float) -> dict[str, Any]:
        """The healthy endpoint's p99 alone, then beside an endpoint that never answers."""
        a = self.args
        alone = await self.open_loop(rate, a.noisy_seconds, "na", "[noisy: alone] delivered")
        stuck = HangingServer()
        await stuck.start()
        try:
            await self.create_endpoint(stuck.url, role="hanging")
            await asyncio.sleep(1.0)  # the dispatcher's endpoints tail picks it up
            beside = await self.open_loop(
                rate, a.noisy_seconds, "nb", "[noisy: beside a hanging endpoint] delivered"
            )
            counters = await self.dispatcher_counters()
        finally:
            await stuck.stop()
        p99_alone = alone["latency_ms"]["p99"]
        p99_beside = beside["latency_ms"]["p99"]
        bound = max(AIM_NOISY_FLOOR_MS, AIM_NOISY_FACTOR * p99_alone)
        return {
            "rate": round(rate, 1),
            "seconds": a.noisy_seconds,
            "dispatcher_timeout_s": Settings.model_fields["webhook_timeout_s"].default,
            "alone": alone,
            "beside_hanging": beside,
            "p99_alone_ms": p99_alone,
            "p99_beside_hanging_ms": p99_beside,
            "ratio": round(p99_beside / p99_alone, 2) if p99_alone > 0 else math.nan,
            "bound_ms": round(bound, 1),
            "within_bound": p99_beside <= bound,
            "hanging_endpoint": {
                "connections": stuck.connections,
                "max_open_connections": stuck.max_open,
            },
            "dispatcher": counters,
        }

    async def dispatcher_counters(self) -> dict[str, float]:
        """The dispatcher's isolation counters, from its /metrics."""
        answer = await self.client.get(f"http://127.0.0.1:{self.dispatcher_port}/metrics")
        wanted = (
            "passkey_webhook_attempts_deferred_total",
            "passkey_webhook_endpoints_backing_off",
            "passkey_webhook_attempts_total",
            "passkey_webhook_inflight_work",
        )
        return {
            name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else ""): value
            for (name, labels), value in samples_of(answer.text).items()
            if name.startswith(wanted)
        }

    async def _send_open_loop(
        self,
        producer: AIOKafkaProducer,
        events: Events,
        rate: float,
        scheduled: dict[str, float],
        deadline: float,
    ) -> float:
        """Send event ``i`` at ``start + i / rate`` with that time as its ``occurred_at``;
        returns how far behind its schedule the generator got at worst (seconds)."""
        pending: list[asyncio.Future[Any]] = []
        start = time.time() + 0.05
        behind = 0.0
        for i in range(events.count):
            if time.monotonic() > deadline:
                break
            when = start + i / rate
            delay = when - time.time()
            if delay > 0.001:
                await asyncio.sleep(delay)
            behind = max(behind, time.time() - when)
            ev, key, value = events.at(i, when)
            scheduled[ev] = when
            pending.append(await producer.send(self.settings.topics.status, value, key=key))
            if len(pending) >= 500:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return behind

    def _webhook_ids(self, events: Events) -> list[str]:
        assert self.endpoint is not None
        return [webhook_id(e, self.endpoint.id) for e in events.ids()]

    def _cpu(self, first: Snapshot | None, last: Snapshot) -> dict[str, Any]:
        """CPU per delivery of the dispatcher (user, system) and cores of every process over
        the window between two snapshots."""
        if first is None or last.delivered <= first.delivered or last.wall <= first.wall:
            return {"cpu_window_deliveries": 0, "cpu_us_per_delivery": None, "cpu_cores": None}
        n = last.delivered - first.delivered
        wall = last.wall - first.wall
        user = last.user - first.user
        system = last.system - first.system
        return {
            "cpu_window_deliveries": n,
            "cpu_window_s": round(wall, 3),
            "cpu_window_from": "start" if first.delivered == 0 else "first delivery",
            "cpu_us_per_delivery": {
                "user": round(user / n * 1e6, 1),
                "system": round(system / n * 1e6, 1),
                "total": round((user + system) / n * 1e6, 1),
            },
            "cpu_cores": {
                "dispatcher": round((user + system) / wall, 2),
                "receiver": round((last.receiver - first.receiver) / wall, 2),
                "broker": round((last.broker - first.broker) / wall, 2),
                "bench": round((last.bench - first.bench) / wall, 2),
                # everything else on the machine (other users of the shared cores)
                "others": round(
                    (
                        (last.host - first.host)
                        - (user + system)
                        - (last.receiver - first.receiver)
                        - (last.broker - first.broker)
                        - (last.bench - first.bench)
                    )
                    / wall,
                    2,
                ),
            },
        }


async def run_all(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    tag = datetime.now(UTC).strftime("%H%M%S")
    results: dict[str, Any] = {
        "meta": run_meta(
            "python -m bench.webhooks",
            args.argv,
            {
                "events": args.events,
                "versions": args.versions,
                "fractions": args.fractions,
                "seconds": args.seconds,
                "partitions": args.partitions,
                "max_in_flight": args.max_in_flight
                or Settings.model_fields["webhook_max_in_flight"].default,
                "take_in_hold_s": Settings.model_fields["webhook_take_in_hold_s"].default
                if args.take_in_hold_s is None
                else args.take_in_hold_s,
                "verify": args.verify,
                "endpoints": 1,
                "noisy_rate": args.noisy_rate,
                "noisy_seconds": args.noisy_seconds,
            },
        ),
        "floor": None,
        "max_rate": None,
        "latency_curve": [],
        "noisy_neighbour": None,
        "failures": {},
    }
    with EmbeddedBroker() as broker:
        prefix = f"hooks-{tag}"
        settings = Settings(
            kafka_bootstrap_servers=broker.bootstrap,
            kafka_fetch_max_wait_ms=EMBEDDED_FETCH_MAX_WAIT_MS,
            kafka_offset_gap_hold_s=EMBEDDED_OFFSET_GAP_HOLD_S,
            commands_partitions=args.partitions,
            other_partitions=args.partitions,
            webhook_secrets_key=generate_key(),
            webhook_consumer_group=f"{prefix}.dispatchers",
            topics=topics_named(prefix),
        )
        bench = HookBench(
            args,
            settings,
            broker._proc.pid if broker._proc is not None else None,
            log_dir,
            http=httpx.AsyncClient(timeout=30),
        )
        try:
            await ensure_topics(settings.kafka_config(), settings.topic_plan())
            port = free_port()
            await bench.create_endpoint(f"http://127.0.0.1:{port}/hooks")
            await asyncio.to_thread(bench.start_receiver, port)
            floors: list[dict[str, Any]] = []

            async def floor_round(when: str) -> None:
                try:
                    floors.append(await bench.floor_rate(tag, when))
                except PhaseFailed as exc:
                    print(f"\n[floor, {when}] FAILED: {exc}", file=sys.stderr)
                    results["failures"][f"floor-{when}"] = str(exc)
                await bench.take_arrivals()  # the floor's arrivals are not the dispatcher's

            if not args.no_floor:
                await floor_round("before")
            max_rate = args.max_rate
            if max_rate is None:
                try:
                    results["max_rate"] = await bench.max_rate()
                    max_rate = results["max_rate"]["deliveries_per_s"]
                except PhaseFailed as exc:
                    print(f"\n[max rate] FAILED: {exc}", file=sys.stderr)
                    results["failures"]["max_rate"] = str(exc)
                if not args.no_floor:
                    # The floor again after the dispatcher (which idles now, its input
                    # drained): neither one always runs first.
                    await floor_round("after")
            else:
                bench.start_dispatcher()
            results["floor"] = combine_floors(floors)
            if max_rate and bench.dispatcher is not None:
                await bench.wait_dispatcher_ready()
                for i, fraction in enumerate(args.fractions):
                    try:
                        point = await bench.curve_point(fraction, max_rate, i)
                    except PhaseFailed as exc:
                        print(f"\n[{fraction:.0%}] FAILED: {exc}", file=sys.stderr)
                        results["failures"][f"curve-{round(fraction * 100)}"] = str(exc)
                        break
                    results["latency_curve"].append(point)
            if args.noisy_seconds > 0 and bench.dispatcher is not None:
                await bench.wait_dispatcher_ready()
                rate = args.noisy_rate or (0.25 * max_rate if max_rate else 200.0)
                try:
                    results["noisy_neighbour"] = await bench.noisy_neighbour(rate)
                except PhaseFailed as exc:
                    print(f"\n[noisy neighbour] FAILED: {exc}", file=sys.stderr)
                    results["failures"]["noisy_neighbour"] = str(exc)
        finally:
            procs = [p for p in (bench.dispatcher, bench.floor, bench.receiver) if p is not None]
            await asyncio.to_thread(stop_procs, procs)
            await bench.client.aclose()
    results["aims"] = aims(results)
    results["by_floor"] = by_floor(results)
    results["meta"]["seconds"] = round(time.monotonic() - args.t0, 1)
    return results


def combine_floors(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The floor's figure from its runs before and after the dispatcher's: the first run's
    record with the means of their rates and CPU per delivery, each run under ``runs``."""
    if len(runs) <= 1:
        return runs[0] if runs else None
    out = dict(runs[0], complete=all(r["complete"] for r in runs))
    out["deliveries_per_s"] = round(statistics.mean(r["deliveries_per_s"] for r in runs), 1)
    cpus = [r["cpu_us_per_delivery"] for r in runs if r.get("cpu_us_per_delivery")]
    if cpus:
        out["cpu_us_per_delivery"] = {
            k: round(statistics.mean(c[k] for c in cpus), 1) for k in ("user", "system", "total")
        }
    out["runs"] = [
        {
            "when": r["when"],
            "deliveries_per_s": r["deliveries_per_s"],
            "cpu_us_per_delivery": (r.get("cpu_us_per_delivery") or {}).get("total"),
            "complete": r["complete"],
        }
        for r in runs
    ]
    return out


def by_floor(results: dict[str, Any]) -> dict[str, Any] | None:
    """The dispatcher's CPU per delivery and rate against its floor's, same run."""
    floor, disp = results.get("floor"), results.get("max_rate")
    if not floor or not disp:
        return None
    f = (floor.get("cpu_us_per_delivery") or {}).get("total")
    d = (disp.get("cpu_us_per_delivery") or {}).get("total")
    return {
        "dispatcher_us": d,
        "floor_us": f,
        "cpu_ratio": round(d / f, 2) if d and f else None,
        "floor_per_s": floor["deliveries_per_s"],
        "dispatcher_per_s": disp["deliveries_per_s"],
    }


def baseline_figures(results: dict[str, Any]) -> dict[str, float]:
    """What ``--baseline`` compares: rate and CPU per delivery of the max-rate run and of the
    floor (when the tree has one), each curve point's p99, the noisy neighbour's p99s."""
    out: dict[str, float] = {}
    for name in ("max_rate", "floor"):
        phase = results.get(name)
        if phase:
            label = "dispatcher" if name == "max_rate" else "floor"
            out[f"{label} deliveries/s"] = float(phase["deliveries_per_s"])
            cpu = phase.get("cpu_us_per_delivery") or {}
            out[f"{label} CPU µs/delivery"] = float(cpu.get("total") or math.nan)
    ratio = (results.get("by_floor") or {}).get("cpu_ratio")
    if ratio is not None:
        out["dispatcher ÷ floor"] = float(ratio)
    for p in results.get("latency_curve", []):
        out[f"p99 ms at {p['fraction_of_max']:.0%}"] = float(p["latency_ms"]["p99"])
    noisy = results.get("noisy_neighbour")
    if noisy:
        out["noisy: p99 ms alone"] = float(noisy["p99_alone_ms"])
        out["noisy: p99 ms beside hanging"] = float(noisy["p99_beside_hanging_ms"])
    return out


def aims(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The aims next to what was measured (None: not measured in this run)."""
    rate = (results["max_rate"] or {}).get("deliveries_per_s")
    half = [p for p in results["latency_curve"] if p["fraction_of_max"] == 0.5]
    p99 = half[0]["latency_ms"]["p99"] if half else None
    noisy = results.get("noisy_neighbour")
    return [
        {
            "aim": "signed deliveries/s per dispatcher process",
            "wanted": f"≥ {AIM_RATE:,.0f}/s",
            "measured": rate,
            "met": None if rate is None else rate >= AIM_RATE,
        },
        {
            "aim": "p99 latency at 50 % of the max rate",
            "wanted": f"≤ {AIM_P99_MS:g} ms",
            "measured": p99,
            "met": None if p99 is None else p99 <= AIM_P99_MS,
        },
        {
            "aim": "healthy endpoint's p99 beside a hanging one (ms)",
            "wanted": f"≤ max({AIM_NOISY_FLOOR_MS:g} ms, {AIM_NOISY_FACTOR:g}x p99 alone)"
            + (f" = {noisy['bound_ms']:,.0f} ms" if noisy else ""),
            "measured": noisy["p99_beside_hanging_ms"] if noisy else None,
            "met": noisy["within_bound"] if noisy else None,
        },
    ]


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    rows = [
        "| phase | events | delivered | deliveries/s | p50 ms | p99 ms "
        "| CPU µs/delivery user+sys | cores: dispatcher/receiver/broker/bench/others |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    phases: list[tuple[str, dict[str, Any]]] = []
    if results.get("floor"):
        phases.append(("floor, max rate (pre-loaded)", results["floor"]))
    if results["max_rate"]:
        phases.append(("max rate (pre-loaded)", results["max_rate"]))
    for p in results["latency_curve"]:
        phases.append((f"{p['fraction_of_max']:.0%} of max ({p['offered_rate']:,.0f}/s)", p))
    noisy = results.get("noisy_neighbour")
    if noisy:
        phases.append((f"healthy alone ({noisy['rate']:,.0f}/s)", noisy["alone"]))
        phases.append((f"healthy beside hanging ({noisy['rate']:,.0f}/s)", noisy["beside_hanging"]))
    for name, p in phases:
        lat = p.get("latency_ms", {})
        rate = p.get("deliveries_per_s", p.get("achieved_per_s"))
        cpu = p.get("cpu_us_per_delivery")
        cores = p.get("cpu_cores")
        rows.append(
            f"| {name} | {p['events']:,} | {p['delivered']:,} | {fmt(rate)} "
            f"| {fmt(lat.get('p50'), ',.1f')} | {fmt(lat.get('p99'), ',.1f')} "
            + (
                f"| {cpu['user']:,.0f}+{cpu['system']:,.0f} = {cpu['total']:,.0f} "
                if cpu
                else "| - "
            )
            + (
                f"| {cores['dispatcher']:.2f}/{cores['receiver']:.2f}/{cores['broker']:.2f}"
                f"/{cores['bench']:.2f}/{cores['others']:.2f} |"
                if cores
                else "| - |"
            )
        )
    out = ["\n".join(rows)]
    floor_runs = (results.get("floor") or {}).get("runs", [])
    if floor_runs:
        each = ", ".join(
            f"{r['when']} the dispatcher {fmt(r['cpu_us_per_delivery'])}" for r in floor_runs
        )
        out.append(f"floor CPU µs per delivery, {each} (the floor row: their mean)")
    ratio = results.get("by_floor")
    if ratio and ratio["cpu_ratio"] is not None:
        out.append(
            f"dispatcher ÷ floor, CPU per delivery: {ratio['cpu_ratio']:.2f}x "
            f"({ratio['dispatcher_us']:,.0f} ÷ {ratio['floor_us']:,.0f} µs; "
            f"{ratio['dispatcher_per_s']:,.0f} against {ratio['floor_per_s']:,.0f} deliveries/s)"
            f"  target ≤ 1.5x"
        )
    aim_rows = ["| aim | wanted | measured | met |", "|---|---|---:|---|"]
    for a in results["aims"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[a["met"]]
        aim_rows.append(f"| {a['aim']} | {a['wanted']} | {fmt(a['measured'], ',.1f')} | {met} |")
    out.append("\n".join(aim_rows))
    if noisy:
        out.append(
            f"noisy neighbour: healthy p99 {noisy['p99_alone_ms']:,.1f} ms alone, "
            f"{noisy['p99_beside_hanging_ms']:,.1f} ms beside a hanging endpoint "
            f"(ratio {noisy['ratio']:g}, bound {noisy['bound_ms']:,.0f} ms: "
            f"{'within' if noisy['within_bound'] else 'NOT within'}); the hanging endpoint "
            f"had at most {noisy['hanging_endpoint']['max_open_connections']} connections open"
        )
    for name, why in results["failures"].items():
        out.append(f"{name} FAILED: {why.strip().splitlines()[-1] if why.strip() else ''}")
    return "\n\n".join(out)


def main(argv: Sequence[str]) -> int:
    """Entry point; returns the exit status (1 when a phase failed or lost deliveries)."""
    parser = build_parser()
    args = parser.parse_args([a for a in argv if a != "--"])
    if args.baseline:
        return baseline.run(
            module="bench.webhooks",
            argv=[a for a in argv if a != "--"],
            parser=parser,
            ref=args.baseline,
            rounds=args.baseline_rounds,
            out_args=lambda d: ["--out", str(d / "webhooks.json")],
            results_file=lambda d: d / "webhooks.json",
            figures=baseline_figures,
            summary=args.baseline_json,
        )
    args.argv = list(argv)
    args.t0 = time.monotonic()
    log_dir = Path(tempfile.mkdtemp(prefix="webhook-bench-"))
    try:
        results = eventloop.run(run_all(args, log_dir), "uvloop")
    except KeyboardInterrupt:
        print(f"\ninterrupted; logs in {log_dir}", file=sys.stderr)
        return 130
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(clean(results), indent=2) + "\n")
    print(table(results))
    print(f"\nwrote {args.out}")
    noisy = results["noisy_neighbour"]
    phases = [
        *([results["floor"]] if results["floor"] else []),
        *([results["max_rate"]] if results["max_rate"] else []),
        *results["latency_curve"],
        *([noisy["alone"], noisy["beside_hanging"]] if noisy else []),
    ]
    failed = bool(results["failures"]) or not all(p["complete"] for p in phases)
    if failed or args.keep_logs:
        print(f"process logs: {log_dir}", file=sys.stderr)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
