"""The completion watermark: a commit never passes an unfinished record; lanes per partition
and key."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st

from worker.consumer import LoopConfig, OffsetTracker, Worker


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


def _record(partition: int, offset: int, key: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", partition, offset, 0, 0, key, b"{}", None, len(key), 2, [])


async def test_a_key_on_two_partitions_has_a_lane_on_each() -> None:
    """A key's record on another partition (the worker forwards those home) neither waits for
    nor holds up its records on this one, and is revoked with its own partition only."""
    handler = _HoldPartitionOne()
    worker = Worker(
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
