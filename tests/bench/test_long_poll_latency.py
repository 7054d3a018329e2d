"""``bench.long_poll_latency``'s own logic against a stub of the routes (one account whose
confirm writes version 2 and then 3, each with its status event): what it asks in which
order, how it times each answer from its event, and what it reports as failed. The stack run
itself is the benchmark's, not a test's."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench.long_poll_latency import one_round, summary

STATUSES = {1: "passkey_confirmation", 2: "passkey_confirmation_sent", 3: "authorized"}


class Account:
    """Version 1 until confirmed; then 2, and 3 ``step_s`` later, each with its event."""

    def __init__(self, step_s: float, early_idle: bool) -> None:
        self.version = 1
        self.changed = asyncio.Condition()
        self.occurred: dict[int, float] = {}
        self.step_s = step_s
        self.early_idle = early_idle
        self.asked: list[str] = []

    async def move_to(self, version: int) -> None:
        async with self.changed:
            self.version = version
            self.occurred[version] = time.time()
            self.changed.notify_all()

    async def confirm(self) -> None:
        await self.move_to(2)
        await asyncio.sleep(self.step_s)
        await self.move_to(3)

    def app(self) -> Starlette:
        tasks: set[asyncio.Task[None]] = set()

        async def auth(request: Request) -> JSONResponse:
            after = request.query_params.get("after_version")
            wait_s = float(request.query_params.get("wait_s", 0))
            self.asked.append(f"GET after={after} wait={wait_s:g}")
            if after is not None and not self.early_idle:
                async with self.changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self.changed.wait_for(lambda: self.version > int(after)), wait_s
                        )
            data = {"status": STATUSES[self.version], "version": self.version}
            return JSONResponse({"data": data})

        async def confirm(request: Request) -> JSONResponse:
            self.asked.append("POST confirm")
            task = asyncio.ensure_future(self.confirm())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            return JSONResponse({"data": {}})

        async def events(request: Request) -> JSONResponse:
            listed = [
                {
                    "event_type": "account.auth_status_changed",
                    "version": v,
                    "occurred_at": datetime.fromtimestamp(at, UTC).isoformat(),
                }
                for v, at in sorted(self.occurred.items())
            ]
            return JSONResponse({"data": listed})

        return Starlette(
            routes=[
                Route("/v1/accounts/acc_1/auth", auth),
                Route("/v1/accounts/acc_1/auth/passkey-confirm", confirm, methods=["POST"]),
                Route("/v1/accounts/acc_1/events", events),
            ]
        )


async def run(account: Account, idle_wait_s: float) -> dict[str, Any]:
    args = argparse.Namespace(wait_s=5.0, idle_wait_s=idle_wait_s, limit_ms=250.0, timeout_s=5.0)
    transport = httpx.ASGITransport(app=account.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://stub") as http:
        return await asyncio.wait_for(one_round(http, "acc_1", args), 20)


async def test_a_long_poll_before_the_confirm_then_again_then_one_with_nothing_to_wait_for() -> (
    None
):
    account = Account(step_s=0.3, early_idle=False)
    got = await run(account, idle_wait_s=0.4)
    assert account.asked == [
        "GET after=None wait=0",
        "GET after=1 wait=5",
        "POST confirm",
        "GET after=2 wait=5",
        "GET after=3 wait=0.4",
    ]
    assert got["versions"] == [1, 2, 3, 3]
    assert got["failed"] == []
    late = got["ms_after_event"]
    assert set(late) == {"passkey_confirmation_sent", "authorized"}
    assert all(0 <= ms < 250 for ms in late.values())
    assert got["idle_wait_s"] >= 0.4
    assert summary([got])["failed"] == []


async def test_an_idle_long_poll_answered_early_is_a_failure() -> None:
    account = Account(step_s=0.0, early_idle=True)  # nothing is held: answered at once
    got = await run(account, idle_wait_s=0.4)
    # The first long-poll was answered at once, before the confirm: not the change's answer.
    assert any("answered 'passkey_confirmation'" in f for f in got["failed"])
    assert any(f.startswith("idle long-poll") for f in got["failed"])
    assert summary([got])["failed"] == got["failed"]
