"""``python -m bench.webhook_receiver --port P``: the webhook benchmark's endpoint.

A separate process so its CPU is not charged to the dispatcher or the load generator. It
answers every ``POST /hooks`` with 204 and records the wall-clock arrival of each
``webhook-id`` (the first one; repeats are counted as duplicates). ``--verify`` checks every
signature with ``standardwebhooks`` against the secret in ``BENCH_WEBHOOK_SECRET`` (a
correctness spot check; it costs receiver CPU, so the timed runs leave it off).

Control routes for the benchmark process: ``GET /_stats`` (counts) and ``POST /_take`` (the
arrivals so far as ``{webhook_id: epoch seconds}`` plus the counts, then cleared, so each
phase reads only its own deliveries).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from worker.runtime import eventloop

SECRET_ENV = "BENCH_WEBHOOK_SECRET"


@dataclass
class Arrivals:
    """What arrived since the last take."""

    verify_secret: str | None = None
    first_seen: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    duplicates: int = 0
    verified: int = 0
    verify_failed: int = 0

    def counts(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "unique": len(self.first_seen),
            "duplicates": self.duplicates,
            "verified": self.verified,
            "verify_failed": self.verify_failed,
            "verifying": self.verify_secret is not None,
        }

    async def hook(self, request: web.Request) -> web.Response:
        now = time.time()
        raw = await request.read()
        webhook_id = request.headers.get("webhook-id", "")
        if self.verify_secret is not None:
            self._verify(raw, request)
        self.requests += 1
        if webhook_id in self.first_seen:
            self.duplicates += 1
        else:
            self.first_seen[webhook_id] = now
        return web.Response(status=204)

    def _verify(self, raw: bytes, request: web.Request) -> None:
        from standardwebhooks.webhooks import Webhook

        assert self.verify_secret is not None
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            Webhook(self.verify_secret).verify(raw, headers)
        except Exception:
            self.verify_failed += 1
        else:
            self.verified += 1

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(self.counts())

    async def take(self, _: web.Request) -> web.Response:
        out = self.counts() | {"arrivals": self.first_seen}
        self.first_seen = {}
        self.requests = self.duplicates = self.verified = self.verify_failed = 0
        return web.json_response(out)


async def serve(port: int, verify_secret: str | None) -> None:
    """Serve until SIGTERM/SIGINT."""
    arrivals = Arrivals(verify_secret=verify_secret)
    app = web.Application()
    app.router.add_post("/hooks", arrivals.hook)
    app.router.add_get("/_stats", arrivals.stats)
    app.router.add_post("/_take", arrivals.take)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.webhook_receiver")
    p.add_argument("--port", type=int, required=True)
    p.add_argument(
        "--verify",
        action="store_true",
        help=f"verify every signature with standardwebhooks (secret from ${SECRET_ENV})",
    )
    args = p.parse_args()
    secret = os.environ.get(SECRET_ENV) if args.verify else None
    if args.verify and not secret:
        p.error(f"--verify needs ${SECRET_ENV}")
    eventloop.run(serve(args.port, secret), "uvloop")


if __name__ == "__main__":
    main()
