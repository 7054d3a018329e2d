"""``worker.runtime.shutdown``: a close step is abandoned at its time-out even when it absorbs
the cancellation, steps share one budget and each still runs when it is spent, and the
watchdog armed by the first stop signal exits 70 when the stop overruns (130 on a second)."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest

from worker.runtime.shutdown import EX_OVERRAN, CloseBudget, bounded, graceful_then_forced


async def test_a_shutdown_step_that_absorbs_cancellation_is_abandoned() -> None:
    """``bounded`` returns at its time-out even when the step ignores the first cancel
    (``wait_for`` would wait for it: the hang a stop in mid-rebalance can cause)."""
    finished = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)  # clean-up that outlives the time-out
        finished.set()

    await bounded(stubborn(), "stubborn", 0.05)
    assert not finished.is_set(), "the bounded step was waited for past its time-out"
    await asyncio.wait_for(finished.wait(), timeout=5)


async def test_a_failing_step_is_logged_not_raised(
    logged: list[MutableMapping[str, Any]],
) -> None:
    async def broken() -> None:
        raise OSError("socket gone")

    await bounded(broken(), "broken", 1.0)
    (line,) = [e for e in logged if e.get("step") == "broken"]
    assert line["event"] == "shutdown_step_failed" and "socket gone" in line["error"]


async def test_a_hung_step_costs_the_next_ones_their_time_not_their_turn(
    logged: list[MutableMapping[str, Any]],
) -> None:
    budget = CloseBudget(0.1, floor_s=0.05)
    ran: list[str] = []

    async def hang() -> None:
        ran.append("hang")
        await asyncio.Event().wait()

    async def quick(name: str) -> None:
        ran.append(name)
        await asyncio.sleep(0)

    await budget.step(hang(), "hang")
    await budget.step(quick("after"), "after")
    await budget.step(hang(), "hang-again")
    await budget.step(quick("last"), "last")
    assert ran == ["hang", "after", "hang", "last"]
    outcome = {e["step"]: e["event"] for e in logged if "step" in e}
    assert outcome == {
        "hang": "shutdown_step_timed_out",
        "after": "shutdown_step_done",
        "hang-again": "shutdown_step_timed_out",
        "last": "shutdown_step_done",
    }
    # Once the budget is spent, a hung step is given the floor, not the budget again.
    (again,) = [e for e in logged if e.get("step") == "hang-again"]
    assert again["timeout_s"] == 0.05


async def test_a_stop_that_overruns_its_hard_limit_exits_70(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exits: list[int] = []
    exited = asyncio.Event()

    def fake_exit(code: int) -> None:
        exits.append(code)
        exited.set()

    stopped: list[int] = []
    monkeypatch.setattr("worker.runtime.shutdown.os._exit", fake_exit)
    handler = graceful_then_forced(lambda: stopped.append(1), hard_limit_s=0.05)
    handler()  # ... and then the stop never finishes
    assert stopped == [1]
    await asyncio.wait_for(exited.wait(), timeout=5)
    assert exits == [EX_OVERRAN]
    handler()  # a second signal: immediate exit
    assert exits == [EX_OVERRAN, 130]
    assert stopped == [1]
