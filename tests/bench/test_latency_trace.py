"""``bench.latency_trace``: the hooks record a command's steps, the collector's pauses and the
loop's lag from outside the worker, and the report cuts the slowest commands into segments."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import latency_trace
from bench.latency_trace import Trace, breakdown
from worker.auth import execute, publish
from worker.auth.provider import http, transport
from worker.engine import consume_loop


def _command(issued: float, reply_after: float) -> dict[str, object]:
    steps = [
        ("start", issued + 0.003),
        ("call", issued + 0.004),
        ("request", issued + 0.004),
        ("answer", issued + 0.024),
        ("called", issued + 0.024),
        ("sent:state", issued + 0.025),
        ("ack:1", issued + 0.025),
        ("acked:1", issued + reply_after - 0.001),
        ("sent:replies", issued + reply_after),
        ("end", issued + reply_after + 0.004),
    ]
    return {
        "partition": 0,
        "offset": 0,
        "issued": issued,
        "produced": issued,
        "fetched": issued + 0.002,
        "steps": steps,
    }


def test_the_slowest_commands_are_cut_into_segments(tmp_path: Path) -> None:
    commands = [_command(100.0 + i, 0.030) for i in range(99)] + [_command(300.0, 0.130)]
    trace = {
        "commands": commands,
        "fetches": [[100.0, 100.002, 1]],
        # a 90 ms pause inside the slow command, another outside every command
        "gcs": [[300.026, 300.116, 0, 0, 0.04], [50.0, 50.1, 1, 0, 0.1]],
        "lags": [[300.116, 0.09, 0.04]],
    }
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    got = breakdown(path)
    slow = got["slowest"]
    assert got["commands"] == 100
    assert slow["total (issued → reply sent)"] == pytest.approx(130.0)
    assert slow["state ack (sent:state → acked)"] == pytest.approx(104.0)
    assert slow["HTTP (request → answer)"] == pytest.approx(20.0)
    assert slow["collector pauses inside"] == pytest.approx(90.0)
    assert slow["loop lag inside"] == pytest.approx(90.0)
    assert got["all"]["collector pauses inside"] == pytest.approx(0.9)
    assert got["gc_ms_by_generation"] == {0: (1, 90.0, 90.0)}
    lines: list[str] = []
    latency_trace.report([path], stream=lines.append)
    assert any(line.startswith("| collector pauses inside | 90.0 | 0.9") for line in lines)


def test_the_hooks_record_collections_and_write_what_they_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every patched name is set to itself first, so the test leaves the worker as it found it.
    monkeypatch.setattr(consume_loop, "fetch_records", vars(consume_loop)["fetch_records"])
    monkeypatch.setattr(execute.Executor, "handle", execute.Executor.handle)
    for name in ("handle_batch", "_decide", "_publish_round"):
        monkeypatch.setattr(execute.Executor, name, vars(execute.Executor)[name])
    monkeypatch.setattr(http.HttpProviderAdapter, "_call", http.HttpProviderAdapter._call)
    monkeypatch.setattr(
        transport.ProviderHttpClient, "request", transport.ProviderHttpClient.request
    )
    monkeypatch.setattr(publish.Publisher, "_send", publish.Publisher._send)
    monkeypatch.setattr(publish, "acknowledged", vars(publish)["acknowledged"])
    trace = Trace()
    trace.install()
    try:
        assert execute.Executor.handle.__name__ == "traced_handle"
        gc.collect(0)
    finally:
        out = tmp_path / "out.json"
        trace.dump(out)
    assert trace.on_gc not in gc.callbacks
    written = json.loads(out.read_text())
    assert written["commands"] == []
    assert [g[2] for g in written["gcs"]] and all(g[1] >= g[0] for g in written["gcs"])


def test_a_batch_units_commands_get_their_own_steps_and_their_rounds_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hooks wrap whatever the class holds at install: here a unit that decides three
    commands, lets the third go unfinished and publishes the first two in one round."""

    def decide(self: Any, msg: Any, command: Any, headcount: Any) -> None:
        return None

    async def publish_round(self: Any, partition: int, steps: Any, *rest: Any) -> None:
        send: Any = getattr(publish.Publisher, "_send")  # noqa: B009 (the hooked one, now)
        acked: Any = getattr(publish, "acknowledged")  # noqa: B009
        await send(None, "passkey.auth.state")
        await acked(None, None, [1, 2])
        await send(None, "passkey.auth.replies")

    async def handle_batch(self: Any, msgs: Any, release: Any) -> None:
        steps = [SimpleNamespace(msg=m) for m in msgs]
        for msg in msgs:
            self._decide(msg, None, None)
        release([msgs[2]], False)
        await self._publish_round(0, steps[:2], release, 0.0)
        release([msgs[0], msgs[1]], True)

    async def send(self: Any, topic: str, *args: Any) -> None:
        return None

    async def acknowledged(producer: Any, health: Any, futures: Any) -> None:
        return None

    monkeypatch.setattr(consume_loop, "fetch_records", vars(consume_loop)["fetch_records"])
    monkeypatch.setattr(execute.Executor, "handle", execute.Executor.handle)
    monkeypatch.setattr(execute.Executor, "handle_batch", handle_batch)
    monkeypatch.setattr(execute.Executor, "_decide", decide)
    monkeypatch.setattr(execute.Executor, "_publish_round", publish_round)
    monkeypatch.setattr(http.HttpProviderAdapter, "_call", http.HttpProviderAdapter._call)
    monkeypatch.setattr(
        transport.ProviderHttpClient, "request", transport.ProviderHttpClient.request
    )
    monkeypatch.setattr(publish.Publisher, "_send", send)
    monkeypatch.setattr(publish, "acknowledged", acknowledged)
    trace = Trace()
    trace.install()
    try:
        msgs = [SimpleNamespace(partition=0, offset=i, timestamp=1, value=b"{}") for i in range(3)]
        released: list[tuple[int, bool]] = []
        executor = object.__new__(execute.Executor)
        asyncio.run(
            execute.Executor.handle_batch(
                executor, msgs, lambda rs, done: released.extend((r.offset, done) for r in rs)
            )
        )
    finally:
        gc.callbacks.remove(trace.on_gc)
    assert released == [(2, False), (0, True), (1, True)]
    assert [c["offset"] for c in trace.commands] == [0, 1]
    for command in trace.commands:
        names = [name for name, _ in command["steps"]]
        assert names == ["start", "sent:state", "ack:2", "acked:2", "sent:replies", "end"]
