"""The benchmark's load side: build commands, produce them (as fast as possible or at a fixed
open-loop rate), read the replies back, and measure; plus /proc readers for CPU and memory.

Latency is the reply record's timestamp on auth.replies (set by the producing process when it
sends the reply) minus the command's ``issued_at``. In open-loop runs ``issued_at`` is the
*scheduled* send time, so a load generator that falls behind shows up as latency instead of
hiding it (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.proc import OUTPUTS_HEADER
from worker.contract.messages import PasskeyConfirm, RegisterAccount
from worker.contract.topics import Topics
from worker.engine.kafka import build_consumer
from worker.settings import Settings

Mix = Literal["fresh", "spread"]
WORKSPACE = "ws_bench"
CHALLENGE = "passkey_confirmation"

# Output roles per command, as the worker produces them (worker.auth.execute, worker.auth.publish):
REGISTER_OUT = b"state,status"  # new record + status event (no reply for register)
FIRST_CONFIRM_OUT = b"state,state,replies,status"  # write-ahead intent, record, reply, event
REPEAT_CONFIRM_OUT = b"state,replies"  # "already sent": record (dedup window), reply


# --------------------------------------------------------------------------------------------
# /proc
# --------------------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def proc_user_sys_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a live process (all its threads), from one read of
    /proc/<pid>/stat (two reads would let the split drift by a tick); zeros when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return 0.0, 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    # after "(comm)": state is field 3, so utime (14) and stime (15) are at 11 and 12
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process; 0 when gone."""
    return sum(proc_user_sys_s(pid))


def host_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores, /proc/stat), to see how much of
    the cores other processes took during a window."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            cpu = f.readline().split()[1:]
    except OSError:
        return math.nan
    ticks = [int(x) for x in cpu]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / _TICK


def proc_peak_rss(pid: int) -> int:
    """Peak resident set size in bytes (VmHWM) of a live process; 0 when gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# --------------------------------------------------------------------------------------------
# progress
# --------------------------------------------------------------------------------------------


class Progress:
    """One updating status line per scenario phase on stderr (a line every few seconds when
    stderr is not a terminal, so CI logs stay readable)."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self._last = 0.0
        self._every = 0.25 if self.tty else 5.0

    def update(self, done: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._every:
            return
        self._last = now
        elapsed = now - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        line = f"{self.label:<34} {done:>7}/{self.total:<7} {rate:>8.0f}/s {elapsed:>6.1f}s"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self, done: int) -> None:
        self.update(done, force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# --------------------------------------------------------------------------------------------
# workload
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    """Who gets which command. ``fresh``: every confirm has its own freshly registered account,
    so every command is one provider call. ``spread``: the confirms go round-robin over
    ``accounts`` accounts; the first confirm of an account calls the provider, the later ones
    answer "already sent" (200, no provider call)."""

    tag: str
    commands: int
    accounts: int
    mix: Mix

    @property
    def registered(self) -> int:
        return self.commands if self.mix == "fresh" else min(self.accounts, self.commands)

    def account(self, i: int) -> str:
        return f"acc-{self.tag}-{i:07d}"

    def register_commands(self) -> Iterator[tuple[bytes, bytes, bytes]]:
        for i in range(self.registered):
            account = self.account(i)
            cmd = RegisterAccount(
                command_id=f"reg-{self.tag}-{i:07d}",
                workspace_id=WORKSPACE,
                account_id=account,
                provider="simulator",
                provider_account_ref=f"ref-{self.tag}-{i:07d}",
                status=CHALLENGE,
            )
            yield account.encode(), cmd.model_dump_json().encode(), REGISTER_OUT

    def confirm(self, i: int, issued_at: float) -> tuple[str, bytes, bytes, bytes]:
        """(command_id, key, value, outputs header) of confirm number ``i``."""
        n = self.registered
        account = self.account(i % n)
        command_id = f"cmd-{self.tag}-{i:07d}"
        cmd = PasskeyConfirm(
            command_id=command_id,
            request_id=f"req-{self.tag}-{i:07d}",
            workspace_id=WORKSPACE,
            account_id=account,
            issued_at=datetime.fromtimestamp(issued_at, UTC),
        )
        outputs = FIRST_CONFIRM_OUT if i < n else REPEAT_CONFIRM_OUT
        return command_id, account.encode(), cmd.model_dump_json().encode(), outputs


# --------------------------------------------------------------------------------------------
# reading outputs
# --------------------------------------------------------------------------------------------


@dataclass
class Outputs:
    """A group-less reader of auth.replies and auth.status from the beginning."""

    consumer: AIOKafkaConsumer
    topics: Topics
    expected: dict[str, float] = field(default_factory=dict)  # command_id → issued epoch s
    latencies_ms: list[float] = field(default_factory=list)
    http_status: Counter[str] = field(default_factory=Counter)
    status_events: int = 0
    replies_seen: int = 0
    first_reply_ms: float = math.inf
    last_reply_ms: float = 0.0

    @classmethod
    async def open(cls, settings: Settings, topics: Topics, partitions: int) -> Outputs:
        consumer = build_consumer(settings.kafka_config())
        await consumer.start()
        tps = [
            TopicPartition(t, p) for t in (topics.replies, topics.status) for p in range(partitions)
        ]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        return cls(consumer, topics)

    async def close(self) -> None:
        await self.consumer.stop()

    @property
    def matched(self) -> int:
        return len(self.latencies_ms)

    async def pump(self, timeout_ms: int = 100) -> None:
        batch = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=20_000)
        replies = self.topics.replies
        for tp, records in batch.items():
            if tp.topic != replies:
                self.status_events += len(records)
                continue
            self.replies_seen += len(records)
            for msg in records:
                self._reply(msg)

    def _reply(self, msg: Any) -> None:
        try:
            obj = json.loads(msg.value)
        except (TypeError, ValueError):
            return
        issued = self.expected.pop(obj.get("command_id"), None)
        if issued is None:
            return  # a registration passed through by the ceiling, or a duplicate
        ts = float(msg.timestamp)
        self.latencies_ms.append(ts - issued * 1000.0)
        self.first_reply_ms = min(self.first_reply_ms, ts)
        self.last_reply_ms = max(self.last_reply_ms, ts)
        self.http_status[str(obj.get("http_status", "pass-through"))] += 1


# --------------------------------------------------------------------------------------------
# producing
# --------------------------------------------------------------------------------------------


async def _send(
    producer: AIOKafkaProducer, topic: str, key: bytes, value: bytes, outputs: bytes
) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = await producer.send(
        topic, value, key=key, headers=[(OUTPUTS_HEADER, outputs)]
    )
    return fut


async def produce_registrations(producer: AIOKafkaProducer, topic: str, workload: Workload) -> None:
    pending: list[asyncio.Future[Any]] = []
    for key, value, outputs in workload.register_commands():
        pending.append(await _send(producer, topic, key, value, outputs))
        if len(pending) >= 2000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)


@dataclass
class SendLog:
    sent: int = 0
    first_issued: float = math.inf
    last_issued: float = 0.0
    behind_max_s: float = 0.0  # open loop: how late the generator got against its schedule


async def produce_confirms(
    producer: AIOKafkaProducer,
    topic: str,
    workload: Workload,
    outputs: Outputs,
    *,
    rate: float | None,
    log: SendLog,
    deadline: float,
) -> None:
    """Send ``workload.commands`` confirms: as fast as possible (``rate=None``) or open-loop at
    ``rate`` per second, timestamping each with its scheduled time."""
    pending: list[asyncio.Future[Any]] = []
    start = time.time() + 0.05
    for i in range(workload.commands):
        if time.monotonic() > deadline:
            break
        if rate is None:
            issued = time.time()
        else:
            issued = start + i / rate
            delay = issued - time.time()
            if delay > 0.001:
                await asyncio.sleep(delay)
            log.behind_max_s = max(log.behind_max_s, time.time() - issued)
        command_id, key, value, out = workload.confirm(i, issued)
        outputs.expected[command_id] = issued
        pending.append(await _send(producer, topic, key, value, out))
        log.sent += 1
        log.first_issued = min(log.first_issued, issued)
        log.last_issued = issued
        if len(pending) >= 1000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)


# --------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]
