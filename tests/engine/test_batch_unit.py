"""A handler's batch entry (``Handler.handle_batch``): the records of a fetched partition whose
keys have nothing in flight run as one unit of work, which holds their keys' lanes; a record it
leaves goes through ``Handler.handle`` (retried, dead-lettered) and the key's later records
wait behind it; a revocation mid-unit commits what it finished and nothing else
(docs/architecture.md, "Per-account lanes")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from tests.conftest import SettingsFactory
from tests.harness import engine_loop, loop_until
from worker.auth.store import StateStore
from worker.engine.consume_loop import ConsumeLoop
from worker.engine.faults import Fault
from worker.engine.kafka import build_producer, ensure_topics

pytestmark = pytest.mark.integration

Records = list[ConsumerRecord[bytes, bytes]]


class _Batches:
    """Takes batches: finishes each record at once unless its key is ``held`` (finished once
    the test sets its event) or its value is ``poison`` (let go at once to ``handle``, which
    raises for it)."""

    def __init__(self) -> None:
        self.store = StateStore()
        self.units: list[list[tuple[str, bytes]]] = []
        self.done: list[tuple[str, bytes]] = []
        self.held: dict[str, asyncio.Event] = {}
        self.attempts: dict[int, int] = {}
        self.recovered: list[tuple[str, Fault]] = []

    async def handle_batch(self, msgs: Records, release: Callable[[Records, bool], None]) -> None:
        self.units.append([(_key(m), m.value or b"") for m in msgs])
        release([m for m in msgs if m.value == b"poison"], False)
        ready = [m for m in msgs if _key(m) not in self.held and m.value != b"poison"]
        self._done(ready)
        release(ready, True)
        for msg in msgs:
            if (event := self.held.get(_key(msg))) is not None:
                await event.wait()
                self._done([msg])
                release([msg], True)

    def _done(self, msgs: Records) -> None:
        self.done += [(_key(m), m.value or b"") for m in msgs]

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        self.attempts[msg.offset] = self.attempts.get(msg.offset, 0) + 1
        if msg.value == b"poison":
            raise RuntimeError("a bug that one record triggers")
        self._done([msg])

    async def follow_up(self, partition: int, key: str) -> None:
        pass

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        self.recovered.append((_key(msg), fault))

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        pass


def _key(msg: ConsumerRecord[bytes, bytes]) -> str:
    return (msg.key or b"").decode()


@contextlib.asynccontextmanager
async def _loop(
    make_settings: SettingsFactory, handler: _Batches, records: list[tuple[str, bytes]]
) -> AsyncIterator[tuple[ConsumeLoop, asyncio.Task[None], Callable[..., asyncio.Future[None]]]]:
    """A consume loop over a fresh one-partition topic holding ``records`` (produced in one
    go, so one fetch reads them); yields the loop, its task and ``produce(records)``."""
    settings = make_settings(partitions=1)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    producer = build_producer(kafka)
    await producer.start()

    async def produce(more: list[tuple[str, bytes]]) -> None:
        topic = settings.topics.commands
        sent = [await producer.send(topic, v, key=k.encode(), partition=0) for k, v in more]
        await asyncio.gather(*sent)

    await produce(records)
    try:
        async with engine_loop(kafka, settings, handler, rebalance_budget_s=0.5) as (loop, task):
            yield loop, task, lambda more: asyncio.ensure_future(produce(more))
    finally:
        await producer.stop()


def _committed(loop: ConsumeLoop) -> int:
    tracker = next(iter(loop.trackers.values()), None)
    return -1 if tracker is None or tracker.committed is None else tracker.committed


async def test_a_fetched_partition_runs_as_one_unit_and_each_key_keeps_its_order(
    make_settings: SettingsFactory,
) -> None:
    handler = _Batches()
    records = [("a", b"1"), ("b", b"1"), ("c", b"1"), ("a", b"2"), ("b", b"2")]
    async with _loop(make_settings, handler, records) as (loop, task, _):
        await loop_until(lambda: _committed(loop) == 5, task, 30)
        assert handler.units[0] == [("a", b"1"), ("b", b"1"), ("c", b"1")], "one unit, one a key"
        assert len(handler.units) == 1, "the keys' later records go through their lanes"
        for key in "ab":
            assert [v for k, v in handler.done if k == key] == [b"1", b"2"]
        assert loop.pressure.in_flight == 0 and not loop.lanes


async def test_a_key_held_by_one_unit_keeps_its_order_across_a_second(
    make_settings: SettingsFactory,
) -> None:
    """Two overlapping units: the key the first still holds queues behind it, the second
    unit's other keys go on."""
    handler = _Batches()
    handler.held["a"] = release = asyncio.Event()
    async with _loop(make_settings, handler, [("a", b"1"), ("b", b"1")]) as (loop, task, more):
        await loop_until(lambda: ("b", b"1") in handler.done, task, 30)
        await more([("a", b"2"), ("d", b"1")])
        await loop_until(lambda: ("d", b"1") in handler.done, task, 30)
        assert handler.units[1] == [("d", b"1")], "a's record waits behind a's unit"
        assert not [v for k, v in handler.done if k == "a"]
        assert _committed(loop) <= 0, "a's first record holds the watermark"
        release.set()
        await loop_until(lambda: _committed(loop) == 4, task, 30)
        assert [v for k, v in handler.done if k == "a"] == [b"1", b"2"]


async def test_a_record_the_unit_leaves_is_retried_and_dead_lettered_alone(
    make_settings: SettingsFactory,
) -> None:
    """It is retried while the unit still waits for another key: nothing it leaves waits for
    the rest of the unit."""
    handler = _Batches()
    handler.held["c"] = release = asyncio.Event()
    records = [("a", b"1"), ("bad", b"poison"), ("c", b"1"), ("bad", b"after")]
    async with _loop(make_settings, handler, records) as (loop, task, _):
        await loop_until(lambda: ("bad", b"after") in handler.done, task, 30)
        assert [k for k, _ in handler.done] == ["a", "bad"], "c still held by its unit"
        release.set()
        await loop_until(lambda: _committed(loop) == 4, task, 30)
        assert handler.units == [[("a", b"1"), ("bad", b"poison"), ("c", b"1")]]
        assert handler.attempts[1] == loop.config.record_attempts
        [(key, fault)] = handler.recovered
        assert key == "bad" and fault.reason == "handler_failed"
        assert [v for k, v in handler.done if k == "bad"] == [b"after"], "its key goes on"


async def test_a_revocation_mid_unit_commits_what_it_finished_and_nothing_more(
    make_settings: SettingsFactory,
) -> None:
    handler = _Batches()
    handler.held["b"] = asyncio.Event()  # never released: cancelled past the budget
    records = [("a", b"1"), ("b", b"1"), ("c", b"1"), ("b", b"2")]
    async with _loop(make_settings, handler, records) as (loop, task, _):
        await loop_until(lambda: len(handler.done) == 2, task, 30)
        tp = next(iter(loop.trackers))
        committed: list[int] = []
        commit = loop.consumer.commit

        async def noting(offsets: dict[TopicPartition, int]) -> None:
            committed.append(offsets[tp])
            await commit(offsets)

        loop.consumer.commit = noting
        await loop.on_partitions_revoked({tp})
        assert committed[-1] == 1, "a finished, b unfinished: nothing past b committed"
        assert [k for k, _ in handler.done] == ["a", "c"]
        assert loop.pressure.in_flight == 0 and not loop.lanes
        assert not loop.trackers
