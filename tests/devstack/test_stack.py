"""``python -m devstack stack`` (what ``make run`` runs): comes up, serves a flow whose status
changes reach the demo receiver as signed webhooks, every provider call carries the token the
simulator requires, and Ctrl-C stops every component with no process or listening port left
behind."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.devstack.running_stack import running_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_stack_up_flow_and_clean_ctrl_c(tmp_path: Path) -> None:
    async with running_stack("--demo-accounts", "2", TMPDIR=str(tmp_path)) as stack:
        assert list(tmp_path.glob("passkey-stack-*"))  # noqa: ASYNC240 (a directory listing)
        assert "dev-key-ws-demo" in stack.banner
        await stack.until_worker_ready()
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient() as client:
            headers = {"X-Api-Key": "dev-key-ws-demo"}
            confirm = await client.post(
                f"{stack.api}/v1/accounts/acc_demo_1/auth/passkey-confirm",
                headers=headers,
                timeout=30,
            )
            assert confirm.status_code == 200, confirm.text
            assert confirm.json()["data"]["status"] == "passkey_confirmation_sent"
            while True:
                poll = await client.get(f"{stack.api}/v1/accounts/acc_demo_1/auth", headers=headers)
                if poll.json().get("data", {}).get("status") == "authorized":
                    break
                assert time.monotonic() < deadline, poll.text
                await asyncio.sleep(0.3)
            # The simulator requires the stack's generated token: every provider call of the
            # flow (confirm, follow-up polls) carried it.
            sim = f"http://127.0.0.1:{stack.ports['SIMULATOR_PORT']}"
            stats = (await client.get(f"{sim}/_sim/stats")).json()
            assert stats["total_calls"] >= 2 and stats["unauthorized_calls"] == 0, stats
            bare = await client.get(f"{sim}/v1/accounts/demo-1/auth-state")
            assert bare.status_code == 401  # and it does require one
        # The demo receiver verified and printed the account's status changes as webhooks.
        printed = await asyncio.wait_for(stack.read_until("acc_demo_1 v3"), 30)
        lines = [line for line in printed.splitlines() if "acc_demo_1" in line]
        assert all("[signature ok]" in line for line in lines), lines
        assert all("[schema ok]" in line for line in lines), lines  # the published schemas
        assert any("-> passkey_confirmation_sent" in line for line in lines), lines
        stack.proc.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(stack.proc.wait, 40)
        assert code in (0, 130)
        for name, port in stack.ports.items():
            assert not listening(port), f"{name} {port} still listening after Ctrl-C"
        # Its keys and provider credential go with it.
        assert not list(tmp_path.glob("passkey-stack-*"))  # noqa: ASYNC240


def test_an_exited_component_is_restarted_with_a_doubling_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``make run`` supervises like Kubernetes: restart after 1 s, 2 s, 4 s … up to 30 s,
    and from 1 s again after a component ran for a minute."""
    from devstack import stack

    starts: list[float] = []
    now = 100.0

    class Exited:
        returncode = 1

        def poll(self) -> int:
            return 1

    def start(self: stack.Component) -> None:
        starts.append(now)
        self.started_at = now
        self.proc = Exited()  # type: ignore[assignment]

    monkeypatch.setattr(stack.Component, "start", start)
    worker = stack.Component("worker", ["worker", "run"])
    start(worker)
    starts.clear()
    waits = []
    for _ in range(7):
        stack.supervise([worker], now)  # notices the exit
        waits.append(worker.backoff_s)
        now = worker.restart_at or now
        stack.supervise([worker], now)  # restarts
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert len(starts) == 7 and worker.restarts == 7
    now += stack.STABLE_AFTER_S  # it ran for a minute this time
    stack.supervise([worker], now)
    assert worker.backoff_s == 1.0
