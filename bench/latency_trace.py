"""``python -m bench.latency_trace OUT ARGS``: ``python -m worker ARGS`` with a timestamp taken
at each step of every command, the cyclic collector's pauses and the event loop's lag, written
to OUT (JSON) when the process exits; ``python -m bench --latency-trace DIR`` runs its ``python
-m worker run`` contenders this way. ``python -m bench.latency_trace report A.json B.json``
breaks the slowest commands of each trace down by step (bench/README.md, "Where a slow
command's time goes at 50 % of max").

Every hook wraps a function of the worker from outside (as ``bench.traced`` does): nothing in
``worker`` knows of it. The steps of a command, all on the wall clock (``time.time()``, the
clock of record timestamps), keyed by the command record's partition and offset:

=============  ===============================================================================
``issued``     the command's ``issued_at`` (the open-loop schedule)
``produced``   its record's timestamp (the load generator's producer)
``fetched``    the consume loop's fetch returned it
``start``      ``Executor.handle`` began on its lane, or the batch unit holding it began
               (``Executor.handle_batch``)
``call``       the provider adapter's call began (``HttpProviderAdapter._call``)
``request``    the HTTP request began (after the adapter's connection gate)
``answer``     the HTTP answer was read
``called``     the adapter's call returned
``sent:T``     a record to topic T was handed to the producer (the reply's is its timestamp)
``acked:N``    an acknowledgement wait over N records returned (``ack:N`` when it began)
``end``        ``Executor.handle`` returned, or the command's round of its batch was published
               (every output acknowledged)
=============  ===============================================================================

A batch unit's command gets its own steps from its decision on: its provider call's task
inherits them; the sends and acknowledgement waits of its round are noted on every command of
the round. A command the unit lets go unfinished is traced by ``Executor.handle`` instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import json
import math
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

#: The command being handled in this task: its steps.
_current: contextvars.ContextVar[list[tuple[str, float]] | None] = contextvars.ContextVar(
    "latency_trace_command", default=None
)

#: The batch unit being handled in this task: when it began, and its commands' steps by
#: ``id`` of their records.
_batch: contextvars.ContextVar[tuple[float, dict[int, tuple[Any, list[tuple[str, float]]]]] | None]
_batch = contextvars.ContextVar("latency_trace_batch", default=None)
#: The steps of every command of the round being published in this task.
_round: contextvars.ContextVar[list[list[tuple[str, float]]] | None] = contextvars.ContextVar(
    "latency_trace_round", default=None
)

YOUNG_SAMPLES = int(os.environ.get("LATENCY_TRACE_YOUNG", "0"))


def young_census() -> dict[str, Any]:
    """The young generation's size, its commonest types and its largest containers."""
    objs = gc.get_objects(0)
    kinds = Counter(type(o).__name__ for o in objs)
    sized = sorted(
        (
            (len(o), type(o).__name__, repr(o)[:160])
            for o in objs
            if isinstance(o, list | dict | set | deque)
        ),
        reverse=True,
    )[:8]
    return {"t": time.time(), "count": len(objs), "types": kinds.most_common(15), "largest": sized}


#: How often the lag probe wakes up, and the least lateness it records.
LAG_PROBE_S = 0.005
LAG_RECORDED_S = 0.002


class Trace:
    """Everything one traced process records."""

    def __init__(self) -> None:
        self.fetched: dict[tuple[int, int], float] = {}
        self.commands: list[dict[str, Any]] = []
        self.fetches: list[tuple[float, float, int]] = []
        self.gcs: list[tuple[float, float, int, int, float]] = []
        self.lags: list[tuple[float, float, float]] = []
        self._gc_started = 0.0
        self._gc_cpu = 0.0
        self._probe: asyncio.Task[None] | None = None
        #: ``LATENCY_TRACE_YOUNG=N``: what the young generation holds at the first N
        #: collections of it (slow: a diagnosis, not a measurement).
        self.young: list[dict[str, Any]] = []

    # -- the collector and the loop ------------------------------------------------------------

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            if (
                YOUNG_SAMPLES
                and info["generation"] == 0
                and len(self.young) < YOUNG_SAMPLES
                and gc.get_threshold()[0] > 1000
            ):
                self.young.append(young_census())
            self._gc_started = time.time()
            self._gc_cpu = time.thread_time()
        else:
            self.gcs.append(
                (
                    self._gc_started,
                    time.time(),
                    info["generation"],
                    info.get("collected", 0),
                    time.thread_time() - self._gc_cpu,
                )
            )

    async def probe_lag(self) -> None:
        """Sleep ``LAG_PROBE_S`` over and over; a wake-up later than that by
        ``LAG_RECORDED_S`` or more is the loop busy with something else, or the process not
        running (its end, its lag, and the loop thread's CPU seconds in the interval)."""
        while True:
            before, cpu = time.time(), time.thread_time()
            await asyncio.sleep(LAG_PROBE_S)
            now = time.time()
            late = now - before - LAG_PROBE_S
            if late >= LAG_RECORDED_S:
                self.lags.append((now, late, time.thread_time() - cpu))

    # -- the hooks -----------------------------------------------------------------------------

    def install(self) -> None:
        from worker.auth import execute, publish
        from worker.auth.provider import http, transport
        from worker.engine import consume_loop

        gc.callbacks.append(self.on_gc)
        trace = self
        fetch = getattr(consume_loop, "fetch_records")  # noqa: B009 (not exported)

        @functools.wraps(fetch)
        async def fetch_records(*args: Any, **kwargs: Any) -> Any:
            if trace._probe is None:
                trace._probe = asyncio.get_running_loop().create_task(trace.probe_lag())
            began = time.time()
            batch = await fetch(*args, **kwargs)
            now = time.time()
            n = 0
            for tp, records in batch.items():
                n += len(records)
                for record in records:
                    trace.fetched[(tp.partition, record.offset)] = now
            trace.fetches.append((began, now, n))
            return batch

        setattr(consume_loop, "fetch_records", fetch_records)  # noqa: B010

        def note(msg: Any, steps: list[tuple[str, float]]) -> None:
            trace.commands.append(
                {
                    "partition": msg.partition,
                    "offset": msg.offset,
                    "value": msg.value,
                    "produced": msg.timestamp / 1000.0,
                    "fetched": trace.fetched.pop((msg.partition, msg.offset), math.nan),
                    "steps": steps,
                }
            )

        handle = execute.Executor.handle

        async def traced_handle(self: Any, msg: Any) -> None:
            steps: list[tuple[str, float]] = [("start", time.time())]
            token = _current.set(steps)
            try:
                await handle(self, msg)
            finally:
                steps.append(("end", time.time()))
                _current.reset(token)
                note(msg, steps)

        execute.Executor.handle = traced_handle  # type: ignore[method-assign]

        handle_batch = execute.Executor.handle_batch

        async def traced_handle_batch(self: Any, msgs: Any, release: Any) -> None:
            entries: dict[int, tuple[Any, list[tuple[str, float]]]] = {}

            def traced_release(records: list[Any], finished: bool) -> None:
                if not finished:  # ``handle`` traces it
                    for msg in records:
                        entries.pop(id(msg), None)
                release(records, finished)

            token = _batch.set((time.time(), entries))
            try:
                await handle_batch(self, msgs, traced_release)
            finally:
                _batch.reset(token)

        execute.Executor.handle_batch = traced_handle_batch  # type: ignore[method-assign]

        decide = execute.Executor._decide

        def traced_decide(self: Any, msg: Any, command: Any, headcount: Any) -> Any:
            unit = _batch.get()
            if unit is not None:
                steps = [("start", unit[0])]
                unit[1][id(msg)] = (msg, steps)
                _current.set(steps)  # the provider call's task, made next, inherits it
            return decide(self, msg, command, headcount)

        execute.Executor._decide = traced_decide  # type: ignore[method-assign]

        publish_round = execute.Executor._publish_round

        async def traced_publish_round(self: Any, partition: int, steps: Any, *rest: Any) -> None:
            unit = _batch.get()
            chosen = [unit[1][id(s.msg)] for s in steps if unit and id(s.msg) in unit[1]]
            token, round_token = _current.set(None), _round.set([c[1] for c in chosen])
            try:
                await publish_round(self, partition, steps, *rest)
            finally:
                _current.reset(token)
                _round.reset(round_token)
                now = time.time()
                for msg, command_steps in chosen:
                    if unit is not None and unit[1].pop(id(msg), None) is not None:
                        command_steps.append(("end", now))
                        note(msg, command_steps)

        execute.Executor._publish_round = traced_publish_round  # type: ignore[method-assign,assignment]

        def around(owner: Any, name: str, before: str, after: str) -> None:
            inner = getattr(owner, name)

            async def wrapped(*args: Any, **kwargs: Any) -> Any:
                steps = _current.get()
                if steps is not None:
                    steps.append((before, time.time()))
                try:
                    return await inner(*args, **kwargs)
                finally:
                    if steps is not None:
                        steps.append((after, time.time()))

            setattr(owner, name, wrapped)

        around(http.HttpProviderAdapter, "_call", "call", "called")
        around(transport.ProviderHttpClient, "request", "request", "answer")

        send = publish.Publisher._send

        def noted(step: str) -> None:
            steps = _current.get()
            now = time.time()
            for each in [steps] if steps is not None else _round.get() or []:
                each.append((step, now))

        async def traced_send(self: Any, topic: str, *args: Any, **kwargs: Any) -> Any:
            noted(f"sent:{topic.rsplit('.', 1)[-1]}")
            return await send(self, topic, *args, **kwargs)

        publish.Publisher._send = traced_send  # type: ignore[method-assign]

        acknowledged = getattr(publish, "acknowledged")  # noqa: B009 (not exported)

        async def traced_acknowledged(producer: Any, health: Any, futures: Any) -> Any:
            n = len(futures)
            noted(f"ack:{n}")
            try:
                return await acknowledged(producer, health, futures)
            finally:
                noted(f"acked:{n}")

        setattr(publish, "acknowledged", traced_acknowledged)  # noqa: B010

    def dump(self, out: Path) -> None:
        gc.callbacks.remove(self.on_gc)
        commands = []
        for c in self.commands:
            try:
                issued = json.loads(c.pop("value"))["issued_at"]
            except (TypeError, ValueError, KeyError):
                continue
            c["issued"] = datetime.fromisoformat(issued).timestamp()
            commands.append(c)
        out.write_text(
            json.dumps(
                {
                    "commands": commands,
                    "fetches": self.fetches,
                    "gcs": self.gcs,
                    "lags": self.lags,
                    "gc_threshold": gc.get_threshold(),
                    "young": self.young,
                }
            )
        )


def run(out: Path, argv: Sequence[str]) -> int:
    from worker import cli

    trace = Trace()
    trace.install()
    try:
        return cli.main(list(argv))
    finally:
        trace.dump(out)


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------

#: The segments a command's latency is cut into: (name, from step, to step).
SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("generator (issued → produced)", "issued", "produced"),
    ("broker + fetch (produced → fetched)", "produced", "fetched"),
    ("to its lane (fetched → start)", "fetched", "start"),
    ("decide (start → call)", "start", "call"),
    ("gate (call → request)", "call", "request"),
    ("HTTP (request → answer)", "request", "answer"),
    ("adapter (answer → called)", "answer", "called"),
    ("to the state send (called → sent:state)", "called", "sent:state"),
    ("state ack (sent:state → acked)", "sent:state", "acked"),
    ("to the reply (acked → sent:replies)", "acked", "sent:replies"),
)


def _points(c: dict[str, Any]) -> dict[str, float]:
    """Each step's first time; ``acked``: the first acknowledgement after the state's send."""
    points = {"issued": c["issued"], "produced": c["produced"], "fetched": c["fetched"]}
    for name, t in c["steps"]:
        points.setdefault(name, t)
        if name.startswith("acked:") and "sent:state" in points:
            points.setdefault("acked", t)
    return points


def _overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


def breakdown(path: Path, share: float = 0.01) -> dict[str, Any]:
    """Mean ms per segment for the slowest ``share`` of commands (by issued → reply sent) and
    for all, and the collector's pauses and the loop's lag inside the slowest ones."""
    data = json.loads(path.read_text())
    rows = []
    for c in data["commands"]:
        p = _points(c)
        if "sent:replies" not in p:
            continue
        rows.append((p["sent:replies"] - p["issued"], p))
    rows.sort(key=lambda r: r[0])
    n = max(1, math.ceil(len(rows) * share))
    slow = rows[-n:]
    gcs = [(a, b) for a, b, *_ in data["gcs"]]
    lags = [(end - late, end) for end, late, _ in data["lags"]]

    def means(chosen: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
        out = {}
        for name, a, b in SEGMENTS:
            vals = [p[b] - p[a] for _, p in chosen if a in p and b in p]
            out[name] = 1000 * sum(vals) / len(vals) if vals else math.nan
        out["total (issued → reply sent)"] = 1000 * sum(t for t, _ in chosen) / len(chosen)
        out["collector pauses inside"] = 1000 * (
            sum(_overlap(gcs, p["issued"], p["sent:replies"]) for _, p in chosen) / len(chosen)
        )
        out["loop lag inside"] = 1000 * (
            sum(_overlap(lags, p["issued"], p["sent:replies"]) for _, p in chosen) / len(chosen)
        )
        return out

    first = min((p["issued"] for _, p in rows), default=0.0)
    last = max((p["sent:replies"] for _, p in rows), default=0.0)
    by_gen: dict[int, list[float]] = {}
    gc_cpu = 0.0
    for a, b, gen, _, cpu in data["gcs"]:
        if first <= a <= last:
            by_gen.setdefault(gen, []).append(1000 * (b - a))
            gc_cpu += cpu
    run_lags = [(late, cpu) for end, late, cpu in data["lags"] if first <= end <= last]
    fetch_sizes = [k for a, b, k in data["fetches"] if first <= b <= last and k]
    return {
        "commands": len(rows),
        "p50_ms": 1000 * rows[len(rows) // 2][0] if rows else math.nan,
        "p99_ms": 1000 * rows[-n][0] if rows else math.nan,
        "slowest": means(slow),
        "all": means(rows),
        "gc_ms_by_generation": {
            g: (len(v), round(max(v), 2), round(sum(v), 1)) for g, v in sorted(by_gen.items())
        },
        "gc_cpu_ms": round(1000 * gc_cpu, 1),
        "lag_over_2ms": (
            len(run_lags),
            round(1000 * max((late for late, _ in run_lags), default=0), 1),
            round(1000 * sum(late for late, _ in run_lags), 1),
            round(1000 * sum(cpu for _, cpu in run_lags), 1),
        ),
        "records_per_fetch": round(sum(fetch_sizes) / len(fetch_sizes), 1) if fetch_sizes else 0.0,
    }


def report(paths: Sequence[Path], stream: Callable[[str], None] = print) -> None:
    results = [(p.name, breakdown(p)) for p in paths]
    head = "| segment, mean ms | " + " | ".join(
        f"{name} slowest 1 % | {name} all" for name, _ in results
    )
    stream(head + " |")
    stream("|---|" + "---:|" * (2 * len(results)))
    for key in results[0][1]["slowest"]:
        cells = []
        for _, r in results:
            cells += [f"{r['slowest'][key]:.1f}", f"{r['all'][key]:.1f}"]
        stream(f"| {key} | " + " | ".join(cells) + " |")
    for name, r in results:
        stream(
            f"{name}: {r['commands']} commands, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} "
            f"ms; collections during the run (count, max ms, total ms) by generation "
            f"{r['gc_ms_by_generation']}, their CPU {r['gc_cpu_ms']} ms; loop lags ≥ 2 ms "
            f"(count, max ms, total ms, the loop thread's CPU ms in them) {r['lag_over_2ms']}; "
            f"records per fetch {r['records_per_fetch']}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "report":
        report([Path(a) for a in args[1:]])
        return 0
    out, *rest = args
    return run(Path(out), rest)


if __name__ == "__main__":
    sys.exit(main())
