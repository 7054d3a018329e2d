"""A hot key holds its share of the in-flight bound, not the whole bound: one key flooded with
records whose handling is slow pauses its own partition only, and the other partitions' keys
keep flowing (issue 31, row 4)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from tests.conftest import SettingsFactory
from tests.harness import stop_loop
from worker.auth.metrics import WorkerMetrics
from worker.auth.store import StateStore
from worker.engine.consume_loop import ConsumeLoop, LoopConfig
from worker.engine.faults import Fault
from worker.engine.kafka import build_producer, ensure_topics
from worker.engine.runner import consume_loop, group_consumer

MAX_IN_FLIGHT = 40
KEY_SHARE = 8


class _Flood:
    """Records of ``hot`` wait until released (slow without bound); every other key is quick.
    Keeps what it handled, per key, in order."""

    def __init__(self) -> None:
        self.store = StateStore()
        self.release = asyncio.Event()
        self.done: dict[str, list[int]] = defaultdict(list)
        self.loop: ConsumeLoop | None = None
        self.peak = 0

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        assert msg.key is not None and msg.value is not None
        key = msg.key.decode()
        if self.loop is not None:  # the count, and the gauge an operator reads
            exported = self.loop.metrics.registry.get_sample_value("passkey_auth_inflight_commands")
            self.peak = max(self.peak, self.loop.pressure.in_flight, int(exported or 0))
        if key == "hot":
            await asyncio.wait_for(self.release.wait(), 90)
        self.done[key].append(int(msg.value))

    async def follow_up(self, partition: int, key: str) -> None:
        pass

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")


async def _wait(condition: Any, timeout: float, what: str) -> None:
    """Until ``condition``; ``timeout`` only ends a wait that would fail anyway."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.integration
async def test_a_flooded_key_pauses_its_partition_only(make_settings: SettingsFactory) -> None:
    """``hot`` (partition 0) gets 120 records that do not finish until released; ``same``
    follows it on partition 0, ``cool`` comes on partition 1 once the flood is under way.
    Every ``cool`` record is handled while no ``hot`` one has finished; the loop never has
    more than its bound in flight, nor ``hot`` more than its share; once released, nothing is
    lost, each key in order, and partition 0 is resumed. ``same`` waits behind the flood: the
    partition, Kafka's ordering unit, is what pauses (the documented trade-off).

    On the previous loop the flood (fetched 130 at once, past the bound of 40) paused every
    partition, and no ``cool`` record was fetched until ``hot`` drained."""
    settings = make_settings(partitions=2)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    topic = settings.topics.commands
    hot, same, cool = 120, 10, 40
    producer = build_producer(kafka)
    await producer.start()
    handler = _Flood()
    metrics = WorkerMetrics(CollectorRegistry())
    config = replace(
        settings.loop_config("worker"),
        max_in_flight=MAX_IN_FLIGHT,
        max_in_flight_per_key=KEY_SHARE,
    )
    loop = consume_loop(
        kafka,
        config,
        consumer=group_consumer(kafka, config, settings.kafka_consumer_group),
        handler=handler,
        metrics=metrics,
    )
    handler.loop = loop
    running: asyncio.Task[None] | None = None
    try:
        for i in range(hot):
            await producer.send(topic, str(i).encode(), key=b"hot", partition=0)
        for i in range(same):
            await producer.send(topic, str(i).encode(), key=b"same", partition=0)
        await producer.flush()
        await loop.consumer.start()
        running = asyncio.create_task(loop.run())
        await _wait(lambda: loop.ready and loop.pressure.in_flight >= KEY_SHARE, 30, "the flood")
        for i in range(cool):
            await producer.send(topic, str(i).encode(), key=b"cool", partition=1)
        await producer.flush()

        await _wait(lambda: len(handler.done["cool"]) == cool or running.done(), 60, "the cool key")
        assert not handler.release.is_set()
        assert handler.done["hot"] == [], "the flood is still in progress"
        assert handler.done["cool"] == list(range(cool)), "all of cool, in order, meanwhile"
        assert handler.done["same"] == [], "same waits behind hot: its partition is paused"
        # cool, quick but 40 at once, may have met its own share: its pause ends at a poll
        await _wait(lambda: loop.pressure.key_paused == {0}, 30, "partition 1 to flow")
        paused = loop.consumer.paused()
        assert TopicPartition(topic, 0) in paused
        assert TopicPartition(topic, 1) not in paused
        hot_lane = loop.lanes[(0, "hot")]
        assert len(hot_lane.items) == KEY_SHARE, "hot holds its share, no more"

        handler.release.set()
        await _wait(
            lambda: (len(handler.done["hot"]), len(handler.done["same"])) == (hot, same),
            30,
            "the flood to drain",
        )
        assert handler.done["hot"] == list(range(hot))
        assert handler.done["same"] == list(range(same))
        assert handler.done["cool"] == list(range(cool))
        await _wait(lambda: not loop.pressure.key_paused, 30, "partition 0 to resume")
        await _wait(lambda: not loop.consumer.paused(), 30, "the consumer to resume")
        ends = {TopicPartition(topic, 0): hot + same, TopicPartition(topic, 1): cool}
        await _wait(
            lambda: {tp: loop.trackers[tp].committed for tp in ends} == ends,
            30,
            "the watermark to be committed",
        )
        assert handler.peak <= MAX_IN_FLIGHT
    finally:
        handler.release.set()
        await stop_loop(loop, running, loop.consumer)
        await producer.stop()


# --- the bookkeeping, without a broker ------------------------------------------------------


class _Consumer:
    """What the loop asks of a consumer when pausing, resuming and seeking."""

    def __init__(self) -> None:
        self.paused_tps: set[TopicPartition] = set()
        self.seeks: list[tuple[TopicPartition, int]] = []

    def pause(self, *tps: TopicPartition) -> None:
        self.paused_tps |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused_tps -= set(tps)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))


class _Gates:
    """Every record waits for a permit of its key (``let``); ``done`` in handling order."""

    store: Any = None

    def __init__(self) -> None:
        self.permits: dict[str, asyncio.Semaphore] = defaultdict(lambda: asyncio.Semaphore(0))
        self.done: list[tuple[str, int]] = []

    def let(self, key: str, n: int = 1000) -> None:
        for _ in range(n):
            self.permits[key].release()

    def let_all(self) -> None:
        for key in list(self.permits):
            self.let(key)

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        assert msg.key is not None
        key = msg.key.decode()
        await self.permits[key].acquire()
        self.done.append((key, msg.offset))

    async def follow_up(self, partition: int, key: str) -> None:
        pass

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")


def _record(partition: int, offset: int, key: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", partition, offset, 0, 0, key, b"{}", None, len(key), 2, [])


def _loop(handler: Any, consumer: _Consumer, **config: Any) -> ConsumeLoop:
    loop = ConsumeLoop(
        consumer=cast(Any, consumer),
        restore_consumer=cast(Any, None),
        executor=handler,
        metrics=WorkerMetrics(CollectorRegistry()),
        config=LoopConfig(topics=("t",), state_topic="s", **config),
    )
    loop.pressure.active = {0, 1}
    return loop


def test_the_default_share_is_a_twentieth_of_the_bound_at_least_16() -> None:
    assert LoopConfig(topics=("t",), state_topic="s").key_share == 50
    assert LoopConfig(topics=("t",), state_topic="s", max_in_flight=100).key_share == 16
    assert LoopConfig(topics=("t",), state_topic="s", max_in_flight=10).key_share == 10
    assert (
        LoopConfig(
            topics=("t",), state_topic="s", max_in_flight=10, max_in_flight_per_key=50
        ).key_share
        == 10
    )


async def test_a_key_at_its_share_is_refused_and_its_partition_alone_paused() -> None:
    consumer = _Consumer()
    handler = _Gates()
    loop = _loop(handler, consumer, max_in_flight=20, max_in_flight_per_key=4)
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    taken = [loop._dispatch(tp0, _record(0, i, b"hot")) for i in range(5)]
    assert taken == [True] * 4 + [False], "the fifth record of hot has no room"
    assert loop._dispatch(tp0, _record(0, 5, b"other")), "other keys are not refused"
    assert loop._dispatch(tp1, _record(1, 0, b"cool"))
    loop.pressure.apply()
    assert consumer.paused() == {tp0}
    assert loop.pressure.key_paused == {0}
    assert loop.trackers[tp0].watermark() == 0 and loop.trackers[tp0].pending == 5

    handler.let("hot")
    await _settle(lambda: (0, "hot") not in loop.lanes)
    loop.pressure.apply()
    assert consumer.paused() == set()
    assert loop.pressure.key_paused == set()
    assert [o for k, o in handler.done if k == "hot"] == [0, 1, 2, 3]
    handler.let_all()
    await _settle(lambda: loop.pressure.in_flight == 0)


async def test_hot_partition_resumes_at_half_the_share() -> None:
    consumer = _Consumer()
    handler = _Gates()
    loop = _loop(handler, consumer, max_in_flight=100, max_in_flight_per_key=6)
    tp0 = TopicPartition("t", 0)
    for i in range(6):
        assert loop._dispatch(tp0, _record(0, i, b"hot"))
    loop.pressure.apply()
    assert consumer.paused() == {tp0}
    lane = loop.lanes[(0, "hot")]
    for left in (5, 4):  # one record at a time
        handler.let("hot", 1)
        await _settle(lambda: len(lane.items) == left)  # noqa: B023
        loop.pressure.apply()
        assert consumer.paused() == {tp0}, f"{left} of 6: still hot"
    handler.let("hot", 1)
    await _settle(lambda: len(lane.items) == 3)
    loop.pressure.apply()
    assert consumer.paused() == set(), "3 of 6, half the share: resumed"
    handler.let_all()
    await _settle(lambda: not loop.lanes)


async def test_the_total_bound_is_hard_within_one_batch() -> None:
    """Twelve partitions holding nothing (each admitted by its partition's share): the
    eleventh and twelfth records meet the bound itself, and every partition pauses."""
    consumer = _Consumer()
    handler = _Gates()
    loop = _loop(handler, consumer, max_in_flight=10, max_in_flight_per_key=10)
    loop.pressure.active = set(range(12))
    tps = [TopicPartition("t", p) for p in range(12)]
    taken = [loop._dispatch(tps[i], _record(i, 0, f"k{i}".encode())) for i in range(12)]
    assert taken == [True] * 10 + [False] * 2
    assert loop.pressure.in_flight == 10
    loop.pressure.apply()
    assert consumer.paused() == set(tps)
    for i in range(10):
        handler.let(f"k{i}")
    await _settle(lambda: loop.pressure.in_flight == 0)
    loop.pressure.apply()
    assert consumer.paused() == set()


async def test_revocation_forgets_a_hot_partition_and_assignment_resumes_it() -> None:
    consumer = _Consumer()
    handler = _Gates()
    loop = _loop(
        handler, consumer, max_in_flight=100, max_in_flight_per_key=2, rebalance_budget_s=0.05
    )
    loop.store = cast(Any, _NoStore())
    loop.consumer.commit = _no_commit
    loop.consumer.highwater = lambda tp: None
    tp0 = TopicPartition("t", 0)
    for i in range(3):
        loop._dispatch(tp0, _record(0, i, b"hot"))
    loop.pressure.apply()
    assert loop.pressure.key_paused == {0}
    assert consumer.paused() == {tp0}
    await loop.on_partitions_revoked({tp0})
    assert loop.pressure.key_paused == set()
    assert loop.pressure.hot == {}
    assert loop.pressure.in_flight == 0 and not loop.lanes
    # aiokafka forgets the pause with the assignment; the loop must not carry it over.
    consumer.paused_tps.clear()
    loop.active.add(0)
    loop.pressure.apply()
    assert consumer.paused() == set()
    handler.let_all()


class _NoStore:
    def drop(self, partition: int) -> None:
        pass

    def __len__(self) -> int:
        return 0


async def _no_commit(offsets: Any) -> None:
    pass


async def _settle(condition: Any) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never settled")
