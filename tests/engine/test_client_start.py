"""``worker.engine.client_start.AsideCloses``: a start cut short by a cancellation or a failure
returns at once to its caller and still ends with the client closed; against a real broker, a
consumer cancelled at any point of its start leaves no connection open."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest

from worker.engine.client_start import AsideCloses
from worker.engine.kafka import build_consumer


class GatedClient:
    """A client whose start waits for ``opened`` (or fails with ``fail``)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.opened = asyncio.Event()
        self.fail = fail
        self.started = False
        self.stops = 0

    async def start(self) -> None:
        await self.opened.wait()
        if self.fail is not None:
            raise self.fail
        self.started = True

    async def stop(self) -> None:
        self.stops += 1


async def test_a_cancelled_start_returns_at_once_and_closes_once_it_has_ended() -> None:
    aside, client = AsideCloses(), GatedClient()
    caller = asyncio.create_task(aside.start(client))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller  # not held until the start ends
    assert len(aside) == 1
    assert client.stops == 0  # stopping now would miss what the start is still opening
    client.opened.set()
    await aside.drain()
    assert client.started and client.stops == 1 and len(aside) == 0


async def test_a_failed_start_is_raised_and_the_client_closed() -> None:
    aside, client = AsideCloses(), GatedClient(fail=OSError("refused"))
    client.opened.set()
    with pytest.raises(OSError, match="refused"):
        await aside.start(client)
    await aside.drain()
    assert client.stops == 1 and len(aside) == 0


async def test_a_started_client_is_the_callers_to_stop() -> None:
    aside, client = AsideCloses(), GatedClient()
    client.opened.set()
    await aside.start(client)
    assert client.started and client.stops == 0 and len(aside) == 0


@pytest.mark.integration
async def test_a_real_consumer_cancelled_anywhere_in_its_start_leaves_no_connection(
    make_settings: Any,
) -> None:
    """aiokafka leaves its bootstrap connection open when cancelled while waiting for the
    metadata answer; cancelling after each number of loop turns walks through every await of
    the start, that one included."""
    kafka = make_settings().kafka_config()
    aside = AsideCloses()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for turns in range(1, 40):  # from 1: a task cancelled before it runs never starts
            consumer = build_consumer(kafka)
            caller = asyncio.create_task(aside.start(consumer))
            for _ in range(turns):
                await asyncio.sleep(0)
            if caller.done():
                await consumer.stop()
                continue
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
        await aside.drain()
        del consumer, caller
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == []
