"""``bench.long_poll_cost``'s own logic: how a caller asks (against a loopback stub of the
route) and how the phases are summed; the stack run itself is the benchmark's, not a test's."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bench.long_poll_cost import (
    Phase,
    Tally,
    caller,
    drain_s,
    elasticity,
    first_ask,
    query_failures,
    summarize,
)
from worker.api.metrics import ApiMetrics

Answer = Callable[[str], Awaitable[int]]


@asynccontextmanager
async def stub(answer: Answer, seen: list[str]) -> AsyncIterator[int]:
    """A keep-alive HTTP/1.1 server on loopback: each GET's target is recorded, and answered
    200 with ``{"data": {"version": await answer(target)}}``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                target = head.split(b" ", 2)[1].decode()
                seen.append(target)
                body = json.dumps({"data": {"version": await answer(target)}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def ask(mode: str, answer: Answer, seconds: float, wait_s: float) -> tuple[list[str], Tally]:
    seen: list[str] = []
    tally = Tally()
    async with stub(answer, seen) as port:
        now = time.monotonic()
        await asyncio.wait_for(
            caller(port, "k", "acc_1", mode, now, now, now + seconds, wait_s, tally), seconds + 5
        )
    return seen, tally


async def test_a_long_poller_asks_again_with_the_version_it_got() -> None:
    async def answer(target: str) -> int:
        if "after_version" in target:
            await asyncio.sleep(0.2)  # held as a long-poll is, then the next version
            return int(target.split("after_version=")[1].split("&")[0]) + 1
        return 7

    seen, tally = await ask("long-poll", answer, seconds=0.5, wait_s=30)
    assert seen[:3] == [
        "/v1/accounts/acc_1/auth",
        "/v1/accounts/acc_1/auth?after_version=7&wait_s=30",
        "/v1/accounts/acc_1/auth?after_version=8&wait_s=30",
    ]
    assert tally.early == 0 and tally.errors == 0


async def test_a_long_poll_answered_at_once_unchanged_is_not_asked_again_at_once() -> None:
    async def answer(target: str) -> int:
        return 3  # past a share: answered at once with the version it asked past

    seen, tally = await ask("long-poll", answer, seconds=1.5, wait_s=30)
    assert len(seen) == 3  # the plain GET, then one ask a second
    assert tally.early == 2


async def test_a_late_poller_drops_the_ticks_it_missed() -> None:
    async def answer(target: str) -> int:
        if not seen_first:
            seen_first.append(target)
            await asyncio.sleep(2.2)  # two ticks missed
        return 1

    seen_first: list[str] = []
    seen, tally = await ask("poll", answer, seconds=3.5, wait_s=30)
    # Asked at 0, answered at 2.2, asked again at once and then at 3.2: no burst of catch-ups.
    assert len(seen) == 3
    assert tally.sent == 3


def test_first_asks_are_spread_over_a_second_or_one_wait() -> None:
    assert [first_ask(i, 4, "poll", 30) for i in range(4)] == [0, 0.25, 0.5, 0.75]
    assert [first_ask(i, 4, "long-poll", 30) for i in range(4)] == [0, 7.5, 15, 22.5]


def phase(
    mode: str, worker_cpu_s: float, sent: int, idle_cpu_s: float, price: float = 1.0
) -> Phase:
    """100 s with its callers, 50 s idle around them; the dispatcher at 0.02 cores idle and
    ``price`` times that with the callers."""
    cpu = {"worker": worker_cpu_s, "front-end": 0.0, "broker": 0.0, "dispatcher": 2.0 * price}
    idle = {"worker": idle_cpu_s, "front-end": 0.0, "broker": 0.0, "dispatcher": 1.0}
    tally = Tally(sent=sent, answered=sent)
    return Phase(mode, 100.0, cpu, tally, load_avg=1.0, idle_s=50.0, idle_cpu_s=idle)


def test_each_phase_is_taken_above_its_own_stack_idle() -> None:
    phases = [
        phase("poll", 14.0, 50_000, 2.0),  # idle 0.04 cores: 10 CPU s above it
        phase("long-poll", 6.5, 1_700, 3.0),  # idle 0.06 cores: 0.5 CPU s above it
        phase("long-poll", 4.6, 1_600, 2.0),  # 0.6 CPU s
        phase("poll", 13.0, 49_000, 2.5),  # 8 CPU s
    ]
    summary = summarize(phases)
    assert summary["modes"]["poll"]["idle_cores"] == pytest.approx(0.045)
    assert summary["poll_above_idle"] == pytest.approx(0.09)
    assert summary["long_poll_above_idle"] == pytest.approx(0.0055)
    assert summary["ratio"] == pytest.approx(0.0055 / 0.09)
    assert summary["round_ratios"] == pytest.approx([0.05, 0.075])
    assert summary["round_ratio_stderr"] == pytest.approx(statistics.stdev([0.05, 0.075]) / 2**0.5)
    assert summary["modes"]["long-poll"]["us_per_answer"] == pytest.approx(1.1 / 3_300 * 1e6)
    assert summary["modes"]["poll"]["offered_per_s"] == pytest.approx(495)
    assert summary["modes"]["long-poll"]["answered_per_s"] == pytest.approx(16.5)
    # Nothing fitted (no idle parts): corrected is raw.
    assert summary["ratio_corrected"] == pytest.approx(summary["ratio"])
    assert summary["round_ratios_corrected"] == pytest.approx([0.05, 0.075])


def parts(
    worker_scale: float, reference: list[float], e: float
) -> list[tuple[float, dict[str, float]]]:
    """Idle parts of 10 s where the worker's cores follow the reference's to the power ``e``."""
    return [(10.0, {"worker": 10 * worker_scale * d**e, "dispatcher": 10 * d}) for d in reference]


def test_the_drift_is_fitted_within_each_phase_as_the_worker_follows_the_reference() -> None:
    a, b = phase("poll", 14.0, 50_000, 2.0), phase("long-poll", 5.2, 1_700, 2.0)
    a.idle_parts = parts(0.5, [0.020, 0.022, 0.025, 0.021], e=0.6)
    b.idle_parts = parts(0.3, [0.030, 0.027, 0.026], e=0.6)  # another stack, another level
    assert elasticity([a, b]) == pytest.approx(0.6)
    b.idle_parts = parts(0.3, [0.030, 0.030], e=0.6)  # nothing moved: no information
    assert elasticity([a, b]) == pytest.approx(0.6)
    a.idle_parts = parts(0.5, [0.020, 0.020, 0.020], e=0.6)
    assert elasticity([a, b]) == 0.0  # and none at all: no correction


def test_the_corrected_cost_takes_each_phases_idle_at_the_references_price() -> None:
    # The machine 21 % dearer for the reference during a long-poll phase: at elasticity 0.5
    # the worker's idle part is taken as 10 % dearer.
    poll = phase("poll", 14.0, 50_000, 2.0, price=0.81)  # idle 4 CPU s over 100 s, x0.9
    long_poll = phase("long-poll", 5.2, 1_700, 2.0, price=1.21)  # idle 4.4 CPU s
    assert long_poll.price() == pytest.approx(1.21)
    assert long_poll.above_idle() == pytest.approx(1.2)
    assert long_poll.above_idle(elasticity=0.5) == pytest.approx(0.8)
    assert long_poll.above_idle(elasticity=1.0) == pytest.approx(5.2 - 4.84)
    poll.idle_parts = parts(1.0, [0.02, 0.0242], e=0.5)
    long_poll.idle_parts = parts(2.0, [0.03, 0.0243], e=0.5)
    summary = summarize([poll, long_poll])
    assert summary["elasticity"] == pytest.approx(0.5)
    assert summary["ratio"] == pytest.approx(1.2 / 10.0)
    assert summary["poll_above_idle_corrected"] == pytest.approx((14.0 - 3.6) / 100)
    assert summary["long_poll_above_idle_corrected"] == pytest.approx(0.008)
    assert summary["ratio_corrected"] == pytest.approx(0.8 / 10.4)
    assert summary["round_ratios_corrected"] == pytest.approx([0.8 / 10.4])


def test_the_idle_after_a_long_poll_phase_starts_once_its_last_waits_ended() -> None:
    # A wait parked just before the callers stopped ends at its time-out, at most a tenth of
    # it late: the idle window after it must not count those answers.
    assert drain_s("long-poll", 30) >= 33
    assert drain_s("long-poll", 3) >= 3.3
    assert drain_s("poll", 30) < 5


def test_the_front_ends_500s_are_read_by_cause_from_its_own_exposition() -> None:
    registry = CollectorRegistry()
    metrics = ApiMetrics(registry)
    metrics.query_failures.labels("deadline").inc(3)
    metrics.query_failures.labels("not_queued").inc()
    exposition = generate_latest(registry)

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(exposition)))
            self.end_headers()
            self.wfile.write(exposition)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        got = query_failures(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert got == {"deadline": 3, "not_queued": 1, "not_ready": 0, "bad_reply": 0}


def test_each_mode_sums_its_phases_500s_by_cause() -> None:
    phases = [phase("poll", 14.0, 50_000, 2.0), phase("long-poll", 6.5, 1_700, 3.0)]
    phases += [phase("long-poll", 4.6, 1_600, 2.0), phase("poll", 13.0, 49_000, 2.5)]
    phases[0].failures = {"deadline": 60, "not_queued": 5}
    phases[3].failures = {"deadline": 4}
    summary = summarize(phases)
    assert summary["modes"]["poll"]["query_failures"] == {"deadline": 64, "not_queued": 5}
    assert summary["modes"]["long-poll"]["query_failures"] == {}
