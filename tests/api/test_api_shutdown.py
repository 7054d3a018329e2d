"""The front-end's stop is bounded (docs/architecture.md, "Bounded shutdown"): its Kafka clients
close within one budget, in reverse start order, each step logged by name; a close that hangs
is abandoned and the ones after it still run, so the process ends by its own hand."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import running_api
from worker.api.presence import Presence
from worker.api.server import MAX_CLOSE_STEPS
from worker.engine.tail import TopicTail
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration


def _steps(logged: list[MutableMapping[str, Any]]) -> dict[str, str]:
    return {e["step"]: e["event"] for e in logged if str(e.get("event")).startswith("shutdown_")}


async def test_every_client_is_closed_by_name_within_the_step_count(
    api_settings: ApiSettings, logged: list[MutableMapping[str, Any]]
) -> None:
    settings = api_settings(webhook_secrets_key=generate_key())
    async with running_api(settings):
        pass
    steps = _steps(logged)
    assert set(steps.values()) == {"shutdown_step_done"}, steps
    assert {"replays_stop", "presence_stop", "replies_stop", "producer_stop"} <= set(steps)
    # Every step the front-end has is inside the hard limit's count (worker.api.server).
    assert len(steps) <= MAX_CLOSE_STEPS, sorted(steps)
    order = [e["step"] for e in logged if e.get("event") == "shutdown_step_done"]
    assert order[0] == "replays_stop" and order[-1] == "producer_stop", order


async def test_a_close_that_hangs_is_abandoned_and_the_rest_still_close(
    api_settings: ApiSettings,
    logged: list[MutableMapping[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("worker.api.app.CLOSE_BUDGET_S", 0.5)
    stuck, release, closed = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def hang(self: Presence) -> None:
        stuck.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # absorbs the cancellation: outlives the stop
        await TopicTail.stop(self)  # what the real stop ends with, for this test's clean-up
        closed.set()

    monkeypatch.setattr(Presence, "stop", hang)
    async with running_api(api_settings()):
        pass
    assert stuck.is_set()
    steps = _steps(logged)
    assert steps["presence_stop"] == "shutdown_step_timed_out", steps
    # Closed after it, in their turn, once the budget was spent.
    assert steps["replies_stop"] == "shutdown_step_done", steps
    assert steps["producer_stop"] == "shutdown_step_done", steps
    release.set()
    await asyncio.wait_for(closed.wait(), timeout=10)
