"""A long-poll's query leaves on the front-end's send grid (``SEND_GRID_S``; docs/architecture.md,
"Long-polls"): asks started at different moments within one step are sent together, a plain GET
at once, and a caller gone before the boundary sends nothing."""

from __future__ import annotations

import asyncio
import gc
import math
import warnings

import pytest
from starlette.requests import Request

from worker.api.long_poll import SEND_GRID_S, CallerGone, Wait
from worker.api.replies import CorrelatedReply


def request(gone: bool = False) -> Request:
    """A GET whose caller stays, or is gone at once."""

    async def receive() -> dict[str, str]:
        if not gone:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "GET", "headers": []}, receive)


class Sends:
    """Round trips that note the loop time they were started at."""

    def __init__(self) -> None:
        self.at: list[float] = []

    async def round_trip(self) -> CorrelatedReply | None:
        self.at.append(asyncio.get_running_loop().time())
        return None


async def test_long_polls_started_within_one_step_are_sent_together() -> None:
    loop, sends = asyncio.get_running_loop(), Sends()
    now = loop.time()
    await asyncio.sleep(math.ceil(now / SEND_GRID_S) * SEND_GRID_S - now + 0.002)
    started, calls = [], []
    for _ in range(5):
        started.append(loop.time())
        asking = Wait(wait_s=30).unless_gone(request(), sends.round_trip())
        calls.append(asyncio.ensure_future(asking))
        await asyncio.sleep(0.003)
    await asyncio.gather(*calls)
    steps = [math.ceil(t / SEND_GRID_S) for t in started]
    assert steps.count(steps[0]) >= 2, "the calls fell within one step (a machine that slow fails)"
    for step, began, sent in zip(steps, started, sends.at, strict=True):
        assert sent >= began
        together = [s for s2, s in zip(steps, sends.at, strict=True) if s2 == step]
        assert max(together) - min(together) < 0.001, "one step's asks leave together"


async def test_a_plain_get_is_sent_at_once() -> None:
    sends = Sends()
    call = asyncio.ensure_future(Wait().unless_gone(request(), sends.round_trip()))
    await asyncio.sleep(0)
    assert len(sends.at) == 1
    await call


async def test_a_caller_gone_before_the_boundary_sends_nothing() -> None:
    sends = Sends()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CallerGone):
            await Wait(wait_s=30).unless_gone(request(gone=True), sends.round_trip())
        gc.collect()
    assert sends.at == []
    assert not [w for w in caught if "never awaited" in str(w.message)]
