"""How long another front-end replica takes to show a confirmed account's new status.

``GET /auth`` is a query the account's owner answers, behind the confirm in its partition, so
every replica shows the confirm's outcome in its first poll after the 200 (the lag is one
round trip); before, each replica read auth.state into a view and another replica converged
once that view had read the state record. This measures it: an embedded broker, the
simulator, one worker and two front-ends in this process; each account is confirmed on
replica A, then replica B is polled until it shows the new status. Bounded in count and time.

    .venv/bin/python -m bench.replica_lag --accounts 200
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from bench.load import percentile
from devstack.broker import EmbeddedBroker
from devstack.keys import DEV_KEY, DEV_WORKSPACE, dev_keys_file
from devstack.settings import EMBEDDED_FETCH_MAX_WAIT_MS, EMBEDDED_OFFSET_GAP_HOLD_S
from devstack.simulator import ProviderSimulator, running_simulator
from worker.api.app import serve_api
from worker.api.server import ApiRuntime
from worker.auth.app import run_worker
from worker.contract.messages import RegisterAccount
from worker.documents.openapi.document import document_routes
from worker.engine.kafka import build_producer, ensure_topics
from worker.settings import Settings
from worker.startup import RootOptions

SENT = "passkey_confirmation_sent"


@contextlib.asynccontextmanager
async def front_end(settings: Settings) -> AsyncIterator[ApiRuntime]:
    stop = asyncio.Event()
    started: list[ApiRuntime] = []
    task = asyncio.create_task(
        serve_api(
            settings,
            install_signals=False,
            stop=stop,
            on_started=started.append,
            documents=document_routes,
        )
    )
    while not started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield started[0]
    finally:
        stop.set()
        await task


async def until_known(http: httpx.AsyncClient, name: str, headers: dict[str, str]) -> None:
    """Until the worker knows the registered account (bounded by the caller)."""
    for _ in range(3000):
        if (await http.get(f"/v1/accounts/{name}/auth", headers=headers)).status_code == 200:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{name} never appeared")


async def register(settings: Settings, accounts: list[str]) -> None:
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        for account in accounts:
            cmd = RegisterAccount(
                command_id=f"reg-{account}",
                workspace_id=DEV_WORKSPACE,
                account_id=account,
                provider="simulator",
                provider_account_ref=f"ok-{account}",
                status="passkey_confirmation",
            )
            await producer.send_and_wait(
                settings.topics.commands, cmd.model_dump_json().encode(), key=account.encode()
            )
    finally:
        await producer.stop()


async def measure(accounts: int, timeout_s: float, keys_dir: str) -> list[float]:
    with EmbeddedBroker() as broker:
        async with running_simulator(ProviderSimulator(latency_ms=5, jitter_ms=1)) as sim:
            settings = Settings(
                kafka_bootstrap_servers=broker.bootstrap,
                kafka_fetch_max_wait_ms=EMBEDDED_FETCH_MAX_WAIT_MS,
                kafka_offset_gap_hold_s=EMBEDDED_OFFSET_GAP_HOLD_S,
                provider_urls={"simulator": sim},
                api_port=0,
                api_metrics_port=0,
                api_rate_limit_per_s=0,  # one workspace's confirms and polls, as fast as they go
                api_keys_file=dev_keys_file(Path(keys_dir) / "keys.json"),
                commands_partitions=6,
                other_partitions=6,
                log_level="WARNING",
            )
            await ensure_topics(settings.kafka_config(), settings.topic_plan())
            stop = asyncio.Event()
            worker = asyncio.create_task(
                run_worker(
                    settings, RootOptions(stop=stop, install_signals=False, serve_probes=False)
                )
            )
            names = [f"acc_lag_{uuid.uuid4().hex[:8]}" for _ in range(accounts)]
            await register(settings, names)
            lags: list[float] = []
            headers = {"X-Api-Key": DEV_KEY}
            async with (
                front_end(settings) as a,
                front_end(settings) as b,
                httpx.AsyncClient(base_url=a.url, timeout=15) as http_a,
                httpx.AsyncClient(base_url=b.url, timeout=15) as http_b,
            ):
                deadline = time.monotonic() + timeout_s
                for name in names:
                    await until_known(http_a, name, headers)
                for name in names:
                    if time.monotonic() > deadline:
                        break
                    answer = await http_a.post(
                        f"/v1/accounts/{name}/auth/passkey-confirm", headers=headers
                    )
                    answered = time.perf_counter()
                    if answer.status_code != 200:
                        continue
                    while time.monotonic() < deadline:
                        poll = await http_b.get(f"/v1/accounts/{name}/auth", headers=headers)
                        if poll.json()["data"]["status"] != "passkey_confirmation":
                            lags.append(time.perf_counter() - answered)
                            break
                        await asyncio.sleep(0.001)
            stop.set()
            await worker
            return lags


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replica_lag", description=__doc__)
    parser.add_argument("--accounts", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as keys_dir:
        lags = asyncio.run(measure(args.accounts, args.timeout, keys_dir))
    ms = sorted(lag * 1000 for lag in lags)
    if not ms:
        raise SystemExit("nothing measured")
    print(
        f"other replica converged after: n={len(ms)} p50={percentile(ms, 50):.1f} ms "
        f"p90={percentile(ms, 90):.1f} ms p99={percentile(ms, 99):.1f} ms max={ms[-1]:.1f} ms"
    )


if __name__ == "__main__":
    main()
