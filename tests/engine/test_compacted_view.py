"""``worker.engine.compacted_view`` on the real (embedded) broker: a view reads its own write
back and tells the writer what it made of it, waits for a record another writes, hands the
records under a taker's prefix to that part, and a fresh view reads the same (tombstones too);
a part's sweep runs on its interval and tombstones; a failed background write is logged, never
raised; a stop ends its tasks, and does not wait past its bound for one that will not end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest

from tests.conftest import SettingsFactory
from worker.engine import compacted_view
from worker.engine.compacted_view import Chores, CompactedView, ViewPart
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.settings import Settings

pytestmark = pytest.mark.integration

OUTER_S = 30.0
"""A bound on every wait of this module."""


class Keyed(CompactedView):
    """The latest value per key; a writer waiting on a key is told the value kept."""

    def __init__(self, settings: Settings, producer: Any) -> None:
        consumer = build_consumer(settings.kafka_config(), fetch_max_wait_ms=50)
        super().__init__(consumer, settings.topics.api_presence, producer, name="test-view")
        self.kept: dict[bytes, bytes] = {}

    def take(self, msg: Any) -> None:
        if msg.value is None:
            self.kept.pop(msg.key, None)
            return
        self.kept[msg.key] = msg.value
        self.read_back(msg.key, lambda: self.kept[msg.key])


class Expiring(ViewPart):
    """The ``x_`` keys, each swept (tombstoned) once marked expired."""

    def __init__(self, view: CompactedView, sweep_every_s: float = 60.0) -> None:
        super().__init__(
            view, b"x_", name="test-part", sweep_every_s=sweep_every_s, write_timeout_s=5.0
        )
        self.kept: dict[bytes, bytes] = {}
        self.expired: list[bytes] = []

    def take(self, msg: Any) -> None:
        if msg.value is None:
            self.kept.pop(msg.key, None)
        else:
            self.kept[msg.key] = msg.value

    async def sweep(self) -> None:
        gone, self.expired = self.expired, []
        await self.tombstone(gone)


async def until(check: Any) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never came true")


@pytest.fixture
async def settings(make_settings: SettingsFactory) -> Settings:
    settings = make_settings(partitions=1)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    return settings


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[Any]:
    made = build_producer(settings.kafka_config())
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


async def test_a_write_is_read_back_a_prefix_goes_to_its_part_and_a_fresh_view_agrees(
    settings: Settings, producer: Any
) -> None:
    view = Keyed(settings, producer)
    part = Expiring(view)
    await view.start()
    try:
        async with asyncio.timeout(OUTER_S):
            assert await view.wait_caught_up(OUTER_S)
            assert await view.send_read_back(b"k1", b"k1", b"one", OUTER_S) == b"one"
            await view.send("k2", b"two")
            await part.send("x_1", b"theirs")
            await view.send(b"k2", None)
            await until(lambda: b"x_1" in part.kept and b"k2" not in view.kept)
            assert view.kept == {b"k1": b"one"}, "the part's record is not the view's"
            assert not view._reading, "a write read back leaves no waiter"
            waiting = asyncio.create_task(view.until(lambda: b"k3" in view.kept, OUTER_S))
            await view.send(b"k3", b"three")
            assert await waiting, "woken by the record read after it began to wait"
            assert not await view.until(lambda: b"never" in view.kept, 0.2)
            await view.send(b"k3", None)
            fresh = Keyed(settings, producer)
            fresh_part = Expiring(fresh)
            await fresh.start()
            try:
                assert await fresh.wait_caught_up(OUTER_S)
                await until(lambda: b"x_1" in fresh_part.kept)
                assert fresh.kept == view.kept and fresh_part.kept == part.kept
            finally:
                await fresh.stop()
            assert not await fresh.until(lambda: False, OUTER_S), "stopped: no wait"
    finally:
        await view.stop()


async def test_a_write_not_read_back_in_time_raises_and_leaves_no_waiter(
    settings: Settings, producer: Any
) -> None:
    view = Keyed(settings, producer)
    await view.start()
    try:
        async with asyncio.timeout(OUTER_S):
            assert await view.wait_caught_up(OUTER_S)
            with pytest.raises(TimeoutError):  # acknowledged, but read back under another token
                await view.send_read_back(b"never", b"k1", b"one", 0.5)
            assert not view._reading
    finally:
        await view.stop()


async def test_a_part_sweeps_on_its_interval_until_stopped(
    settings: Settings, producer: Any
) -> None:
    view = Keyed(settings, producer)
    part = Expiring(view, sweep_every_s=0.05)
    await view.start()
    await part.start()
    try:
        async with asyncio.timeout(OUTER_S):
            await part.send(b"x_old", b"old")
            await until(lambda: b"x_old" in part.kept)
            part.expired.append(b"x_old")
            await until(lambda: b"x_old" not in part.kept)  # its tombstone, read back
            assert len(part.chores) == 1  # the sweep loop, still running
    finally:
        await part.stop()
        await view.stop()
    assert len(part.chores) == 0 and len(view.chores) == 0


async def test_a_failed_background_write_is_logged_and_stop_is_bounded(
    logged: list[MutableMapping[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    chores = Chores("test-chores")

    async def fails() -> None:
        raise ConnectionError("broker gone")

    released = asyncio.Event()

    async def stubborn() -> None:  # swallows its cancellation, as a careless job might
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                continue

    chores.quietly(fails())
    await until(lambda: len(chores) == 0)
    (line,) = [e for e in logged if e.get("event") == "background_write_failed"]
    assert line["owner"] == "test-chores" and line["error"] == "ConnectionError"
    monkeypatch.setattr(compacted_view, "STOP_TIMEOUT_S", 0.1)
    chores.quietly(stubborn())
    await asyncio.sleep(0)  # it runs, and so sees its cancellation
    async with asyncio.timeout(OUTER_S):
        await chores.stop()  # returns although the task is still there
    assert len(chores) == 1
    released.set()
    await until(lambda: len(chores) == 0)


async def test_settled_waits_for_the_writes_so_far_however_they_end_not_for_later_ones() -> None:
    """What a consume loop's flush stands on: the writes under way when it asks, failed ones
    included; a busy owner's later writes do not keep it waiting."""
    chores = Chores("test-chores")
    first, later = asyncio.Event(), asyncio.Event()
    ended: list[str] = []

    async def write(done: asyncio.Event, name: str, fail: bool = False) -> None:
        await done.wait()
        ended.append(name)
        if fail:
            raise ConnectionError("broker gone")

    chores.quietly(write(first, "ok"))
    chores.quietly(write(first, "failed", fail=True))
    settling = asyncio.ensure_future(chores.settled())
    await asyncio.sleep(0)  # it asked
    chores.quietly(write(later, "later"))  # started after the ask
    await asyncio.sleep(0.01)
    assert not settling.done(), "the writes so far are still under way"
    first.set()
    async with asyncio.timeout(OUTER_S):
        await settling
    assert sorted(ended) == ["failed", "ok"]
    later.set()
    await until(lambda: len(chores) == 0)


async def test_a_settled_wait_cut_short_leaves_the_writes_running() -> None:
    """A consume loop's flush past its budget is cancelled: the writes it waited for go on
    (their holds are released when they end), they are not cancelled with it."""
    chores = Chores("test-chores")
    done = asyncio.Event()
    ended: list[str] = []

    async def write() -> None:
        await done.wait()
        ended.append("written")

    chores.quietly(write())
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(chores.settled(), 0.05)
    done.set()
    await until(lambda: len(chores) == 0)
    assert ended == ["written"]


async def test_a_quiet_send_of_a_view_not_running_is_not_made(
    settings: Settings, producer: Any
) -> None:
    view = CompactedView(None, settings.topics.api_presence, producer, name="test-view")
    view.send_quietly(b"k", b"v")  # not started: nothing written, no task, no warning
    assert len(view.chores) == 0
