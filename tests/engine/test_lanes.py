"""A lane holds a key's records and ``DUE``, its follow-up marker: a due key returned by a
record's handling runs the handler's ``follow_up`` after that record, behind the key's own
records, and never counts in the watermark."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, cast

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from worker.auth.metrics import WorkerMetrics
from worker.auth.store import StateStore
from worker.engine.consume_loop import ConsumeLoop, LoopConfig
from worker.engine.faults import Fault
from worker.engine.lanes import DUE, Due, Lane


class _Handler:
    """Records whose value names keys come back with those keys due; every unit is logged."""

    store: Any = None

    def __init__(self) -> None:
        self.units: list[tuple[str, Any]] = []

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> Iterable[str] | None:
        self.units.append(("record", msg.offset))
        return msg.value.decode().split() if msg.value else None

    async def follow_up(self, partition: int, key: str) -> None:
        self.units.append(("follow_up", (partition, key)))

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")


def _record(offset: int, key: bytes, value: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", 0, offset, 0, 0, key, value, None, len(key), len(value), [])


def _loop(handler: _Handler) -> ConsumeLoop:
    """A loop over ``handler`` that is never run: its lanes and timers are driven by hand."""
    return ConsumeLoop(
        consumer=cast(Any, None),
        restore_consumer=cast(Any, None),
        executor=cast(Any, handler),
        metrics=WorkerMetrics(CollectorRegistry()),
        config=LoopConfig(topics=("t",), state_topic="s"),
    )


async def _settle(done: Callable[[], bool]) -> None:
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("did not settle")


def test_the_due_marker_is_one_value_apart_from_any_record() -> None:
    assert DUE is Due.KEY and list(Due) == [DUE]
    lane = Lane(0)
    lane.items.append(DUE)
    lane.items.append(_record(0, b"a", b""))
    assert [item is DUE for item in lane.items] == [True, False]


async def test_a_due_key_runs_its_follow_up_after_the_record_and_outside_the_watermark() -> None:
    handler = _Handler()
    loop = _loop(handler)
    loop.pressure.active = {0}
    tp = TopicPartition("t", 0)
    assert loop._dispatch(tp, _record(0, b"acc_1", b"acc_2 acc_1"))
    assert loop._dispatch(tp, _record(1, b"acc_1", b""))
    await _settle(lambda: loop.pressure.in_flight == 0 and not loop.lanes)
    acc_1 = [u for u in handler.units if u[0] == "record" or u[1] == (0, "acc_1")]
    assert acc_1 == [("record", 0), ("record", 1), ("follow_up", (0, "acc_1"))], "lane order"
    assert handler.units.index(("follow_up", (0, "acc_2"))) > 0, "after the record naming it"
    assert len(handler.units) == 4
    tracker = loop.trackers[tp]
    assert tracker.watermark() == 2 and tracker.pending == 0


async def test_a_sweep_asked_for_when_the_loop_is_not_running_enqueues_nothing() -> None:
    """``sweep_soon`` (a store's key made due from outside its lane) sweeps at the next turn
    only while the loop runs: a loop not started, or stopped, starts no lane for it."""
    handler = _Handler()
    handler.store = StateStore()
    loop = _loop(handler)
    loop.pressure.active = {0}
    handler.store.timers.arm("acc_1", 0, 0.0)
    loop.sweep_soon()
    await asyncio.sleep(0.01)
    assert not loop.lanes and handler.units == []
    await loop._sweep_timers()  # the tick still finds it
    await _settle(lambda: not loop.lanes)
    assert handler.units == [("follow_up", (0, "acc_1"))]
