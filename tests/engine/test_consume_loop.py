"""The completion watermark: a commit never passes an unfinished record; lanes per partition
and key."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tests.conftest import SettingsFactory
from worker.auth.metrics import WorkerMetrics
from worker.auth.store import StateStore
from worker.engine.consume_loop import ConsumeLoop, Hold, LoopConfig, OffsetTracker, hold_record
from worker.engine.faults import Fault
from worker.engine.kafka import build_consumer, ensure_topics
from worker.engine.runner import LoopSpec, consume_loop, group_consumer


def test_watermark_waits_for_the_oldest_unfinished_record() -> None:
    t = OffsetTracker()
    assert t.watermark() is None
    for offset in (10, 11, 12, 13):
        t.dispatched(offset)
    assert t.watermark() == 10
    t.finished(12)
    t.finished(11)
    assert t.watermark() == 10
    t.finished(10)
    assert t.watermark() == 13
    t.finished(13)
    assert t.watermark() == 14
    assert t.pending == 0


@given(st.lists(st.integers(min_value=0, max_value=10_000), unique=True, max_size=60))
def test_watermark_is_always_the_first_unfinished(finish_order: list[int]) -> None:
    offsets = sorted(finish_order)
    t = OffsetTracker()
    for o in offsets:
        t.dispatched(o)
    done: set[int] = set()
    for o in finish_order:
        t.finished(o)
        done.add(o)
        unfinished = [x for x in offsets if x not in done]
        expected = unfinished[0] if unfinished else offsets[-1] + 1
        assert t.watermark() == expected


def test_a_held_offset_stops_the_watermark_until_every_hold_is_released() -> None:
    t = OffsetTracker()
    for offset in (10, 11, 12):
        t.dispatched(offset)
    t.hold(11)
    t.hold(11)
    for offset in (10, 11, 12):
        t.finished(offset)
    assert t.watermark() == 11, "finished but held: not committed"
    t.release(11)
    assert t.watermark() == 11, "one hold left"
    t.release(11)
    assert t.watermark() == 13
    assert t.held == 0


def test_a_hold_released_before_its_record_finishes_does_not_finish_it() -> None:
    t = OffsetTracker()
    t.dispatched(5)
    t.hold(5)
    t.release(5)
    assert t.watermark() == 5, "still running"
    t.finished(5)
    assert t.watermark() == 6


@given(
    st.lists(st.integers(min_value=0, max_value=40), unique=True, min_size=1, max_size=40),
    st.data(),
)
def test_the_watermark_never_passes_a_held_or_unfinished_offset(
    finish_order: list[int], data: st.DataObject
) -> None:
    offsets = sorted(finish_order)
    held = set(data.draw(st.lists(st.sampled_from(offsets), unique=True)))
    t = OffsetTracker()
    for o in offsets:
        t.dispatched(o)
    for o in held:
        t.hold(o)
    done: set[int] = set()
    events = [("finish", o) for o in finish_order] + [("release", o) for o in held]
    for kind, o in data.draw(st.permutations(events)):
        if kind == "finish":
            t.finished(o)
            done.add(o)
        else:
            t.release(o)
            held.discard(o)
        blocked = [x for x in offsets if x not in done or x in held]
        assert t.watermark() == (blocked[0] if blocked else offsets[-1] + 1)


def test_no_hold_outside_the_consume_loop() -> None:
    assert hold_record() is None


# --- lanes ---------------------------------------------------------------------------------


class _Gauge:
    def set(self, value: float) -> None:
        pass


class _Metrics:
    in_flight = _Gauge()

    def beat(self) -> None:
        pass


class _HoldPartitionOne:
    """A handler whose records of partition 1 wait until released."""

    store: Any = None

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.done: list[tuple[int, int]] = []

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        if msg.partition == 1:
            await self.release.wait()
        self.done.append((msg.partition, msg.offset))

    async def follow_up(self, partition: int, key: str) -> None:
        pass

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")


def _record(partition: int, offset: int, key: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", partition, offset, 0, 0, key, b"{}", None, len(key), 2, [])


async def test_a_key_on_two_partitions_has_a_lane_on_each() -> None:
    """A key's record on another partition (the worker forwards those home) neither waits for
    nor holds up its records on this one, and is revoked with its own partition only."""
    handler = _HoldPartitionOne()
    worker = ConsumeLoop(
        consumer=cast(Any, None),
        restore_consumer=cast(Any, None),
        executor=handler,
        metrics=cast(Any, _Metrics()),
        config=LoopConfig(topics=("t",), state_topic="s"),
    )
    worker.active = {0, 1}
    worker._dispatch(TopicPartition("t", 1), _record(1, 5, b"acc"))
    worker._dispatch(TopicPartition("t", 0), _record(0, 7, b"acc"))
    for _ in range(100):
        if handler.done:
            break
        await asyncio.sleep(0.01)
    assert handler.done == [(0, 7)]
    assert worker.trackers[TopicPartition("t", 0)].watermark() == 8
    worker.active.discard(1)  # revoked while its record runs
    handler.release.set()
    await asyncio.gather(*(lane.task for lane in list(worker.lanes.values()) if lane.task))
    assert worker.lanes == {}
    assert worker.in_flight == 0


class _Holding(_HoldPartitionOne):
    """Takes a hold on every record it handles and keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.holds: list[Hold] = []
        self.overdue: list[int] = []

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        hold = hold_record(on_overdue=lambda: self.overdue.append(msg.offset))
        assert hold is not None
        self.holds.append(hold)
        self.done.append((msg.partition, msg.offset))


async def test_a_record_held_by_its_handler_is_not_committed_until_released() -> None:
    handler = _Holding()
    worker = ConsumeLoop(
        consumer=cast(Any, None),
        restore_consumer=cast(Any, None),
        executor=handler,
        metrics=cast(Any, _Metrics()),
        config=LoopConfig(topics=("t",), state_topic="s", hold_overdue_s=0.05),
    )
    worker.active = {0}
    tp = TopicPartition("t", 0)
    worker._dispatch(tp, _record(0, 3, b"a"))
    worker._dispatch(tp, _record(0, 4, b"b"))
    for _ in range(100):
        if len(handler.done) == 2 and not worker.lanes:
            break
        await asyncio.sleep(0.01)
    assert worker.lanes == {}, "both handled"
    assert worker.trackers[tp].watermark() == 3, "handled, but held"
    handler.holds[0].release()
    handler.holds[0].release()  # idempotent
    assert worker.trackers[tp].watermark() == 4
    worker._overdue_holds(1e18)
    assert handler.overdue == [4], "only the live hold is overdue, once"
    worker._overdue_holds(1e18)
    assert handler.overdue == [4]
    # revoked: the tracker goes, a late release is harmless and the offset was never passed
    del worker.trackers[tp]
    handler.holds[1].release()
    assert not worker.holds


# --- stopping during a rebalance ----------------------------------------------------------


class _Idle:
    """A handler for a loop that is only started and stopped."""

    def __init__(self) -> None:
        self.store = StateStore()

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        pass

    async def follow_up(self, partition: int, key: str) -> None:
        pass

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")


class _RevokeHeld(ConsumerRebalanceListener):  # type: ignore[misc]
    """A group member whose revocation waits until released: the group's rebalance cannot
    complete while it waits, as with a member that drains slowly or died mid-rebalance."""

    def __init__(self) -> None:
        self.assigned = asyncio.Event()
        self.revoking = asyncio.Event()
        self.release = asyncio.Event()

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if self.assigned.is_set():
            self.revoking.set()
            await self.release.wait()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        if assigned:
            self.assigned.set()


@pytest.mark.integration
async def test_stop_does_not_wait_for_a_rebalance_another_member_holds_up(
    make_settings: SettingsFactory,
) -> None:
    """aiokafka's fetch blocks until a rebalance in progress completes; a SIGTERM that
    arrives then must still stop the loop at once, not when the slowest member rejoins (a
    chaos run saw a worker overrun its shutdown hard limit this way)."""
    settings = make_settings(partitions=2)
    await ensure_topics(settings)
    group = settings.kafka_consumer_group
    holder_listener = _RevokeHeld()
    holder = build_consumer(
        settings,
        group_id=group,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=300,
        rebalance_timeout_ms=60_000,
        max_poll_interval_ms=300_000,
    )
    holder.subscribe([settings.topics.commands], listener=holder_listener)
    await holder.start()
    polling = asyncio.create_task(_poll_forever(holder))
    loop = consume_loop(
        settings,
        LoopSpec((settings.topics.commands,), settings.topics.state, max_in_flight=10),
        consumer=group_consumer(settings, group),
        handler=_Idle(),
        metrics=WorkerMetrics(CollectorRegistry()),
    )
    running: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(holder_listener.assigned.wait(), 30)
        await loop.consumer.start()
        running = asyncio.create_task(loop.run())
        # The loop's join starts a rebalance, which the holder's revocation holds up.
        await asyncio.wait_for(holder_listener.revoking.wait(), 30)
        assert not loop.ready
        loop.stop()
        done, _ = await asyncio.wait({running}, timeout=15)
        assert done, "the loop waited for the rebalance to complete"
        assert not holder_listener.release.is_set()  # the rebalance was still held up
        running.result()
    finally:
        holder_listener.release.set()
        if running is not None and not running.done():
            running.cancel()
        polling.cancel()
        await asyncio.gather(*(t for t in (running, polling) if t), return_exceptions=True)
        await asyncio.wait({asyncio.ensure_future(holder.stop())}, timeout=10)
        await asyncio.wait({asyncio.ensure_future(loop.consumer.stop())}, timeout=10)


async def _poll_forever(consumer: AIOKafkaConsumer) -> None:
    while True:
        await consumer.getmany(timeout_ms=100)
