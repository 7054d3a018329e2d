"""An endpoint that heals, through ``make run`` (issue 49; docs/architecture.md, "Endpoints that
heal"): a loopback receiver answers 410 until the dispatcher disables its endpoint, accounts
change while it is disabled, then it answers 204; the script waits for the probe, the
re-enable and the recovery replay, and checks that every event since the disable arrived once,
in per-account order, under the webhook-id it would have had, with a valid signature.

    python -m bench.endpoint_recovery [--accounts 3] [--probe-first-s 3] [--timeout-s 120]

Starts ``make run`` itself (its default ports must be free) with a shortened probe schedule
(``WEBHOOK_PROBE_FIRST_S``, ``WEBHOOK_PROBE_MAX_S``) and stops it at the end. Loopback only;
every wait is bounded by ``--timeout-s``. Exits non-zero when a check fails."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from typing import Any

import httpx
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from bench.common import REPO_ROOT
from devstack.demo import register_accounts
from devstack.keys import DEV_KEY, DEV_WORKSPACE
from worker.contract.delivery_log import webhook_id
from worker.settings import Settings

API = "http://127.0.0.1:8080"
HEADERS = {"X-Api-Key": DEV_KEY}


class Receiver:
    """Answers ``status`` to every delivery; once it answers 2xx, keeps what it verified."""

    def __init__(self) -> None:
        self.status = 410
        self.secret: str | None = None
        self.got: list[dict[str, Any]] = []
        self.refused = 0

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if self.status >= 300:
            self.refused += 1
            return web.Response(status=self.status)
        assert self.secret is not None
        body = Webhook(self.secret).verify(raw, dict(request.headers))  # raises if forged
        self.got.append({"id": request.headers["webhook-id"], "at": time.time(), "body": body})
        return web.Response(status=204)


async def until(what: str, check: Any, timeout_s: float, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := await check():
            return result
        await asyncio.sleep(every_s)
    raise SystemExit(f"timed out waiting for {what}")


async def run(args: argparse.Namespace, receiver: Receiver, port: int) -> int:
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    t0 = time.time()
    try:
        async with httpx.AsyncClient(base_url=API, headers=HEADERS, timeout=15) as http:

            async def ready() -> bool:
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.HTTPError:
                    return False

            await until("make run", ready, args.timeout_s)
            created = (
                await http.post(
                    "/v1/webhook-endpoints",
                    json={
                        "url": f"http://127.0.0.1:{port}/hook",
                        "event_types": ["account.auth_status_changed"],
                    },
                )
            ).json()["data"]
            endpoint_id, receiver.secret = created["id"], created["secret"]
            one = f"/v1/webhook-endpoints/{endpoint_id}"
            settings = Settings(kafka_bootstrap_servers="127.0.0.1:9092")
            run_id = uuid.uuid4().hex[:6]
            accounts = [f"acc_heal_{run_id}_{n}" for n in range(args.accounts)]
            await register_accounts(settings, DEV_WORKSPACE, [(a, a) for a in accounts])

            async def disabled() -> dict[str, Any] | None:
                record = (await http.get(one)).json()["data"]
                return record if record["status"] == "disabled" else None

            record = await until("the disable", disabled, args.timeout_s)
            disabled_at = time.time()
            print(f"disabled after {receiver.refused} refused deliveries: {record['recovery']}")
            for account in accounts:  # missed: each account's confirm and its authorisation
                confirm = await http.post(f"/v1/accounts/{account}/auth/passkey-confirm")
                assert confirm.status_code == 200, confirm.text

            async def authorized() -> bool:
                states = [
                    (await http.get(f"/v1/accounts/{a}/auth")).json()["data"]["status"]
                    for a in accounts
                ]
                return all(s == "authorized" for s in states)

            await until("every account authorized", authorized, args.timeout_s)
            receiver.status = 204
            healed_at = time.time()

            async def active() -> dict[str, Any] | None:
                record = (await http.get(one)).json()["data"]
                return record if record["status"] == "active" else None

            record = await until("the re-enable", active, args.timeout_s)
            enabled_at = time.time()
            replay_id = record["recovery"]["replay_id"]
            # Missed for certain: each account's confirm (v2) and authorisation (v3), both after
            # the disable; a registration (v1) failed at the disable itself may come too.
            expected = {(a, v) for a in accounts for v in (2, 3)}

            def seen() -> set[tuple[str, int]]:
                return {
                    (g["body"]["data"]["account_id"], g["body"]["data"]["version"])
                    for g in receiver.got
                    if g["body"]["type"] != "endpoint.probe"
                }

            async def replayed() -> bool:
                return expected <= seen()

            await until("the missed events", replayed, args.timeout_s)
            await asyncio.sleep(2)  # anything sent twice would arrive now
            status = (await http.get(f"{one}/replays/{replay_id}")).json()
    finally:
        await runner.cleanup()
    events = [g for g in receiver.got if g["body"]["type"] != "endpoint.probe"]
    probes = [g for g in receiver.got if g["body"]["type"] == "endpoint.probe"]
    versions: dict[str, list[int]] = defaultdict(list)
    wrong_ids = 0
    for g in events:
        data = g["body"]["data"]
        versions[data["account_id"]].append(data["version"])
        wrong_ids += g["id"] != webhook_id(data.get("event_id", ""), endpoint_id)
    in_order = all(v == sorted(v) for v in versions.values())
    once = len({g["id"] for g in events}) == len(events)
    summary = {
        "accounts": len(accounts),
        "refused_before_disable": receiver.refused,
        "probes_answered_2xx": len(probes),
        "seconds_disable_to_healed": round(healed_at - disabled_at, 1),
        "seconds_healed_to_enabled": round(enabled_at - healed_at, 1),
        "seconds_enabled_to_last_event": round(max(g["at"] for g in events) - enabled_at, 1),
        "events_received": len(events),
        "missed_events_expected": len(expected),
        "versions_per_account": dict(versions),
        "per_account_order": in_order,
        "each_once": once,
        "webhook_ids_not_the_expected": wrong_ids,
        "replay_status": status.get("data", status),
        "run_s": round(time.time() - t0, 1),
    }
    print(json.dumps(summary, indent=2, default=str))
    ok = expected <= seen() and in_order and once and wrong_ids == 0 and bool(probes)
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.endpoint_recovery", description=__doc__)
    parser.add_argument("--accounts", type=int, default=3)
    parser.add_argument("--probe-first-s", type=float, default=3.0)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--log", default="/tmp/endpoint-recovery-stack.log")
    parser.add_argument("--receiver-port", type=int, default=18071)
    args = parser.parse_args()
    env = os.environ | {
        "WEBHOOK_PROBE_FIRST_S": str(args.probe_first_s),
        "WEBHOOK_PROBE_MAX_S": str(args.probe_first_s * 4),
    }
    with open(args.log, "w") as log:  # the stack's output, kept for the reader
        stack = subprocess.Popen(
            ["make", "run"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C as at a terminal: to make and the stack
        )
        try:
            return asyncio.run(run(args, Receiver(), args.receiver_port))
        finally:
            os.killpg(stack.pid, signal.SIGINT)
            stack.wait(60)


if __name__ == "__main__":
    sys.exit(main())
