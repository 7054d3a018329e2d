"""Process-level behaviour of a worker: probes over real HTTP, a fatal lane error ends the
loop with an exception (the CLI then exits non-zero), SIGTERM drains and exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from devstack.broker import free_port
from tests.harness import REPO, bus, confirm_cmd, register_cmd, worker_env
from worker.auth.app import run_worker
from worker.engine.consume_loop import FINAL_COMMIT_TIMEOUT_S, ConsumeLoop
from worker.engine.faults import ProcessFault
from worker.engine.runner import CLOSE_STEP_TIMEOUT_S, shutdown_hard_limit
from worker.runtime.probes import build_probe_app
from worker.runtime.serving import serving
from worker.settings import Settings
from worker.startup import RootOptions

pytestmark = pytest.mark.integration


async def test_probes_follow_heartbeat_and_readiness() -> None:
    beat = [time.monotonic()]
    ready = [False]
    app = build_probe_app(
        CollectorRegistry(), last_beat=lambda: beat[0], ready=lambda: ready[0], stale_after_s=5
    )
    async with (
        serving(app, host="127.0.0.1", port=0, name="probes") as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code == 503
        ready[0] = True
        assert (await client.get("/readyz")).status_code == 200
        beat[0] = time.monotonic() - 60  # the loop stopped beating
        r = await client.get("/healthz")
        assert r.status_code == 503
        assert r.json()["status"] == "stalled"
        assert (await client.get("/metrics")).status_code == 200


async def test_fatal_lane_error_stops_the_worker_with_an_exception(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=1)
    holder: list[ConsumeLoop] = []

    def sabotage(worker: ConsumeLoop) -> None:
        holder.append(worker)

        async def broken(*_: object) -> None:
            # A fault of the process, not of the record (a record's own fault is retried and
            # dead-lettered instead: tests/engine/test_faults.py).
            raise ProcessFault("the state directory is gone")

        worker.executor.handle = broken  # type: ignore[method-assign, assignment]

    async with bus(settings) as b:
        task = asyncio.create_task(
            run_worker(
                settings,
                RootOptions(
                    registry=CollectorRegistry(),
                    stop=asyncio.Event(),
                    install_signals=False,
                    serve_probes=False,
                    on_start=sabotage,
                ),
            )
        )
        await b.send(register_cmd("acc-fatal", "ok-fatal"))
        # Within what the process bounds itself to: its start, then a stop that drains, commits
        # and closes (each step bounded; on a loaded host they take their time).
        limit = 30 + shutdown_hard_limit(settings.worker_shutdown_grace_s)
        with pytest.raises(RuntimeError, match="consume loop failed") as info:
            await asyncio.wait_for(task, timeout=limit)
        assert isinstance(info.value.__cause__, ProcessFault)
        # nothing was committed past the failed record: a new worker sees it again
        assert holder[0].trackers
        for tracker in holder[0].trackers.values():
            assert tracker.committed in (None, 0)


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_sigterm_drains_and_exits_zero(
    make_settings: Any, simulator: str, event_loop: str, tmp_path: Path
) -> None:
    """On either event loop (``EVENT_LOOP``; the start-up log line says which one runs)."""
    settings = make_settings(provider_urls={"simulator": simulator})
    port = free_port()
    log_file = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "run"],
        env=worker_env(settings, port, EVENT_LOOP=event_loop, LOG_LEVEL="INFO"),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log_file,
    )
    try:
        async with bus(settings) as b, httpx.AsyncClient() as client:
            deadline = time.monotonic() + 40
            while True:
                try:
                    if (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "worker never became ready"
                await asyncio.sleep(0.2)
            health = await client.get(f"http://127.0.0.1:{port}/healthz")
            assert health.status_code == 200
            # The simulator outlives the test: one account per parametrization.
            await b.send(register_cmd(f"acc-term-{event_loop}", f"ok-term-{event_loop}"))
            cmd = confirm_cmd(f"acc-term-{event_loop}")
            await b.send(cmd)
            assert (await b.reply_to(cmd.command_id))["http_status"] == 200
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
        assert code == 0
        assert time.monotonic() - started < 15  # left the group promptly, no session wait
        started_lines = [
            json.loads(line)
            for line in (tmp_path / "worker.log").read_text().splitlines()
            if '"worker_started"' in line
        ]
        assert [line["event_loop"] for line in started_lines] == [event_loop]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log_file.close()


def test_the_hard_limit_covers_the_drain_the_final_commit_and_both_close_steps() -> None:
    settings = Settings(worker_shutdown_grace_s=20)
    assert (
        shutdown_hard_limit(settings.worker_shutdown_grace_s)
        > 20 + FINAL_COMMIT_TIMEOUT_S + 2 * CLOSE_STEP_TIMEOUT_S
    )
