"""A partition holds its share of the in-flight bound, taken through the one admission rule
(``worker.runtime.admission.Share``), not the whole bound: many keys of one partition, each
just under its key share, fill their partition's share and pause that partition alone; the
other partitions keep flowing, and a partition holding none still finds room (issue "Tenant
budgets", row 8). Before, 21 such keys took all 1,000 slots and every partition paused."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from tests.conftest import SettingsFactory
from tests.engine.test_hot_key import _Consumer, _Gates, _loop, _record, _settle
from tests.harness import stop_loop
from worker.auth.metrics import WorkerMetrics
from worker.auth.store import StateStore
from worker.engine.consume_loop import ConsumeLoop
from worker.engine.faults import Fault
from worker.engine.kafka import build_producer, ensure_topics
from worker.engine.pressure import partition_shares
from worker.engine.runner import consume_loop, group_consumer


def test_a_partitions_share_is_the_bound_split_for_two_with_a_quarter_kept() -> None:
    take, resume = partition_shares(1000)
    assert (take.capacity, take.per_owner, take.reserve) == (1000, 375, 250)
    assert (resume.per_owner, resume.reserve) == (188, 437)
    assert not resume.admits(188, 0), "resumes at half its share"
    assert resume.admits(187, 562) and not resume.admits(187, 563)
    assert resume.admits(0, 999), "a partition holding none resumes while the bound has room"
    for bound in (1, 2, 3, 10, 40):
        partition_shares(bound)  # valid shares for small bounds too


async def test_21_keys_under_their_share_take_their_partitions_share_not_the_bound() -> None:
    """21 keys of 49 records on partition 0 (each key under its share of 50; 1,029 in all):
    partition 0 takes its share (375) and is paused alone; a record of partition 1 is still
    dispatched and partition 1 is not paused."""
    consumer = _Consumer()
    handler = _Gates()
    loop = _loop(handler, consumer)  # the defaults: a bound of 1,000, a key share of 50
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    offset = 0
    taken = 0
    for key in range(21):
        for _ in range(49):
            taken += loop._dispatch(tp0, _record(0, offset, f"acc_{key}".encode()))
            offset += 1
    assert taken == loop.pressure.partition_share.per_owner == 375
    assert loop.pressure.in_flight == 375
    gauge = "passkey_auth_inflight_commands"
    assert loop.metrics.registry.get_sample_value(gauge) == 375, "the gauge reads the count"
    assert loop.pressure.hot == {}, "no key reached its own share"
    loop.pressure.apply()
    assert consumer.paused() == {tp0}
    assert loop.pressure.key_paused == {0}

    assert loop._dispatch(tp1, _record(1, 0, b"acc_fresh")), "another partition has room"
    loop.pressure.apply()
    assert consumer.paused() == {tp0}
    handler.let("acc_fresh")
    await _settle(lambda: ("acc_fresh", 0) in handler.done)
    handler.let_all()
    await _settle(lambda: loop.pressure.in_flight == 0)
    loop.pressure.apply()
    assert consumer.paused() == set()
    assert loop.pressure.held == {}, "nothing is remembered of a partition holding nothing"
    assert loop.metrics.registry.get_sample_value(gauge) == 0


async def test_the_reserve_keeps_room_for_a_partition_holding_none() -> None:
    """Partitions 0 and 1 at their share (375 each), partition 2 holding one: the rest of
    the bound (250) is kept for partitions holding none, so partition 2 is refused a second
    record and paused alone, while partition 3 takes its first."""
    consumer = _Consumer()
    handler = _Gates()
    loop = _loop(handler, consumer)
    loop.pressure.active = {0, 1, 2, 3}
    tps = [TopicPartition("t", p) for p in range(4)]
    for p in (0, 1):
        for i in range(400):
            loop._dispatch(tps[p], _record(p, i, f"k{p}_{i % 20}".encode()))
    assert loop.pressure.held == {0: 375, 1: 375}
    assert loop._dispatch(tps[2], _record(2, 0, b"two"))
    assert not loop._dispatch(tps[2], _record(2, 1, b"two_b")), "the reserve is not its"
    assert loop._dispatch(tps[3], _record(3, 0, b"three")), "a partition holding none"
    loop.pressure.apply()
    assert consumer.paused() == {tps[0], tps[1], tps[2]}
    await asyncio.sleep(0.01)  # every lane waits for its permit
    handler.let_all()
    await _settle(lambda: loop.pressure.in_flight == 0)
    loop.pressure.apply()
    assert consumer.paused() == set()


async def test_a_crowded_partition_resumes_at_half_its_share() -> None:
    consumer = _Consumer()
    handler = _Gates()
    loop = _loop(handler, consumer, max_in_flight=40, max_in_flight_per_key=40)
    tp0 = TopicPartition("t", 0)
    share = loop.pressure.partition_share.per_owner
    assert share == 15
    keys = [f"k{i}" for i in range(share + 1)]
    taken = [loop._dispatch(tp0, _record(0, i, key.encode())) for i, key in enumerate(keys)]
    assert taken == [True] * share + [False]
    loop.pressure.apply()
    assert consumer.paused() == {tp0}
    for n, key in enumerate(keys[: share - share // 2 - 1], start=1):
        handler.let(key)
        await _settle(lambda: loop.pressure.in_flight == share - n)  # noqa: B023
        loop.pressure.apply()
        assert consumer.paused() == {tp0}, f"{share - n} of {share}: still paused"
    handler.let(keys[share - share // 2 - 1])
    await _settle(lambda: loop.pressure.in_flight == share // 2)
    loop.pressure.apply()
    assert consumer.paused() == set(), "half its share: resumed"
    handler.let_all()
    await _settle(lambda: loop.pressure.in_flight == 0)


async def test_due_keys_of_a_crowded_partition_wait_for_the_next_sweep() -> None:
    """Follow-ups are in flight too: the timer sweep enqueues none for a partition at its
    share (the timer is re-armed one interval later), and does for another partition."""
    consumer = _Consumer()
    handler = _Gates()
    loop = _loop(handler, consumer, max_in_flight=40, max_in_flight_per_key=40)
    store = StateStore()
    loop.store = store
    tp0 = TopicPartition("t", 0)
    for i in range(15):
        assert loop._dispatch(tp0, _record(0, i, f"k{i}".encode()))
    store.timers.arm("due_0", 0, 0.0)
    store.timers.arm("due_1", 1, 0.0)
    await loop._sweep_timers()
    assert (0, "due_0") not in loop.lanes
    assert (1, "due_1") in loop.lanes
    assert "due_0" in store.timers.live, "re-armed for the next sweep"
    await asyncio.sleep(0.01)  # every lane waits for its permit
    handler.let_all()
    await _settle(lambda: loop.pressure.in_flight == 0)


# --- through the consume loop, on a real broker ----------------------------------------------

MAX_IN_FLIGHT = 40
KEY_SHARE = 8
HOT_KEYS = 6
PER_HOT_KEY = KEY_SHARE - 1


class _Crowd:
    """Records of the ``hot*`` keys wait until released; every other key is quick."""

    def __init__(self) -> None:
        self.store = StateStore()
        self.release = asyncio.Event()
        self.done: dict[str, list[int]] = defaultdict(list)

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        assert msg.key is not None and msg.value is not None
        key = msg.key.decode()
        if key.startswith("hot"):
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
async def test_many_keys_of_one_partition_cannot_take_every_slot(
    make_settings: SettingsFactory,
) -> None:
    """Six keys of partition 0, seven slow records each (each key under its share of 8, 42
    records for a bound of 40): partition 0 holds its share (15) and is paused alone, and
    every record of partition 1, produced while the crowd waits, is handled. Before, the
    crowd took the whole bound, every partition paused, and partition 1 waited for it."""
    settings = make_settings(partitions=2)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    topic = settings.topics.commands
    cool = 20
    producer = build_producer(kafka)
    await producer.start()
    handler = _Crowd()
    config = replace(
        settings.loop_config("worker"),
        max_in_flight=MAX_IN_FLIGHT,
        max_in_flight_per_key=KEY_SHARE,
    )
    loop: ConsumeLoop = consume_loop(
        kafka,
        config,
        consumer=group_consumer(kafka, config, settings.kafka_consumer_group),
        handler=handler,
        metrics=WorkerMetrics(CollectorRegistry()),
    )
    share = loop.pressure.partition_share.per_owner
    running: asyncio.Task[None] | None = None
    try:
        for i in range(PER_HOT_KEY):
            for k in range(HOT_KEYS):
                await producer.send(topic, str(i).encode(), key=f"hot{k}".encode(), partition=0)
        await producer.flush()
        await loop.consumer.start()
        running = asyncio.create_task(loop.run())
        await _wait(lambda: loop.ready and loop.pressure.in_flight >= share, 30, "the crowd")
        for i in range(cool):
            await producer.send(topic, str(i).encode(), key=b"cool", partition=1)
        await producer.flush()

        await _wait(lambda: len(handler.done["cool"]) == cool or running.done(), 60, "cool")
        assert handler.done["cool"] == list(range(cool)), "partition 1 flows meanwhile"
        assert not any(handler.done[f"hot{k}"] for k in range(HOT_KEYS))
        assert loop.pressure.held.get(0) == share, "partition 0 holds its share, no more"
        assert loop.pressure.hot == {}, "no key is at its own share"
        await _wait(lambda: loop.pressure.key_paused == {0}, 30, "partition 0 alone to be paused")
        assert TopicPartition(topic, 0) in loop.consumer.paused()
        assert TopicPartition(topic, 1) not in loop.consumer.paused()

        handler.release.set()
        total = HOT_KEYS * PER_HOT_KEY
        await _wait(
            lambda: sum(len(handler.done[f"hot{k}"]) for k in range(HOT_KEYS)) == total,
            30,
            "the crowd to drain",
        )
        for k in range(HOT_KEYS):
            assert handler.done[f"hot{k}"] == list(range(PER_HOT_KEY))
        await _wait(lambda: not loop.pressure.key_paused, 30, "partition 0 to resume")
    finally:
        handler.release.set()
        await stop_loop(loop, running, loop.consumer)
        await producer.stop()


class _Asking(AIOKafkaConsumer):  # type: ignore[misc]
    """A consumer that notes each fetch's ``max_records`` with what was in flight then."""

    loop: ConsumeLoop | None = None

    def __init__(self, *topics: str, **options: Any) -> None:
        super().__init__(*topics, **options)
        self.asked: list[tuple[int, int]] = []

    async def getmany(self, *tps: TopicPartition, **options: Any) -> Any:
        if self.loop is not None:
            self.asked.append((options["max_records"], self.loop.pressure.in_flight))
        return await super().getmany(*tps, **options)


@pytest.mark.integration
async def test_a_fetch_asks_only_for_what_the_rule_still_admits(
    make_settings: SettingsFactory,
) -> None:
    """Six partitions of ten slow records, a bound of 40 (a quarter, 10, kept for partitions
    holding none): a fetch asks for at most what partitions holding some may still take
    (30 - in flight, at least one), so no batch of records is fetched only to be refused and
    read again. Before, a fetch asked for the whole room to the bound (40 - in flight): the
    rule refused the last ten, and their partitions were read again."""
    partitions, each = 6, 10
    settings = make_settings(partitions=partitions)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    topic = settings.topics.commands
    producer = build_producer(kafka)
    await producer.start()
    handler = _Crowd()
    config = replace(
        settings.loop_config("worker"), max_in_flight=MAX_IN_FLIGHT, max_in_flight_per_key=KEY_SHARE
    )
    consumer = group_consumer(kafka, config, settings.kafka_consumer_group, consumer_class=_Asking)
    metrics = WorkerMetrics(CollectorRegistry())
    loop = consume_loop(kafka, config, consumer=consumer, handler=handler, metrics=metrics)
    assert isinstance(consumer, _Asking)
    consumer.loop = loop
    share = loop.pressure.partition_share
    admitted = share.capacity - share.reserve
    assert admitted == 30
    running: asyncio.Task[None] | None = None
    try:
        for p in range(partitions):
            for i in range(each):
                await producer.send(topic, str(i).encode(), key=f"hot{p}_{i}".encode(), partition=p)
        await producer.flush()
        await consumer.start()
        running = asyncio.create_task(loop.run())
        await _wait(lambda: loop.pressure.in_flight >= admitted, 30, "the slow records")
        handler.release.set()
        total = partitions * each
        await _wait(lambda: sum(map(len, handler.done.values())) == total, 30, "every record")
        assert all(handler.done[f"hot{p}_{i}"] == [i] for p in range(partitions) for i in range(10))
        asked = consumer.asked
        assert asked, "the loop fetched"
        assert all(n <= max(1, admitted - held) for n, held in asked), asked
    finally:
        handler.release.set()
        await stop_loop(loop, running, consumer)
        await producer.stop()


async def test_a_fetch_from_one_partition_asks_no_more_than_its_share_admits() -> None:
    """All of a fetch may come from one partition (always, on one): it asks for no more than
    the rule admits of that partition, so none of it is refused and read again. Before, it
    asked for the room above the reserve (750 of 1,000 with nothing in flight) where one
    partition takes 375."""
    handler = _Gates()
    loop = _loop(handler, _Consumer())
    pressure = loop.pressure
    pressure.active = {0}
    tp = TopicPartition("t", 0)
    taken = 0
    for first in (100, None):
        asked = pressure.fetchable()
        assert asked == 375 - taken
        for _ in range(first or asked):  # every record asked for is admitted
            assert loop._dispatch(tp, _record(0, taken, f"acc_{taken}".encode()))
            taken += 1
    assert taken == pressure.held[0] == 375
    assert pressure.fetchable() == 1, "at least one"
    assert not loop._dispatch(tp, _record(0, taken, b"acc_more")), "the share is full"
    pressure.active = {0, 1}
    assert pressure.fetchable() == 375, "partition 1, holding none, may take its share"
    await _settle(lambda: len(handler.permits) == 375)
    handler.let_all()
    await _settle(lambda: pressure.in_flight == 0)
