"""Offset gaps: a reader never hands out a record past one it never saw without waiting for
it, and says so when it gives up (``worker.engine.fetch.GapWatch``); after a failed fetch a
partition is only ever sought back, never forward; and the consume loop's periodic commit
survives a revocation that lands while it is in flight.

The embedded broker produces real gaps: it advances a partition's end before it stores the
batch, so with several producers on one partition a tailing fetch can see a later producer's
batch before an earlier one's (docs/architecture.md, "The embedded broker")."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from devstack.settings import EMBEDDED_OFFSET_GAP_HOLD_S, DevSettings
from tests.conftest import SettingsFactory
from worker.api.replies import ReplyRouter
from worker.auth.metrics import WorkerMetrics
from worker.engine.consume_loop import ConsumeLoop, LoopConfig
from worker.engine.fetch import GapWatch, getmany, skipping
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.offsets import OffsetTracker
from worker.engine.runner import consume_loop
from worker.runtime.logs import get_logger
from worker.settings import Settings

TP = TopicPartition("t", 0)
RECORDS = 30_000  # three writers interleave enough; bounded so the read stays short


def _record(offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", 0, offset, 0, 0, b"k", b"v", None, 1, 1, [])


class _Consumer:
    """Just what ``getmany`` and ``GapWatch`` use: positions, seeks, one scripted answer."""

    def __init__(self, answers: list[Any], position: int = 0) -> None:
        self.answers = answers
        self.positions = {TP: position}
        self.seeks: list[tuple[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def paused(self) -> set[TopicPartition]:
        return set()

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))
        self.positions[tp] = offset

    async def getmany(self, *tps: TopicPartition, **_: Any) -> Any:
        answer = self.answers.pop(0) if self.answers else {}
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(self)
        return answer


def _fetched(offsets: list[int]) -> Any:
    def answer(consumer: _Consumer) -> Any:
        consumer.positions[TP] = offsets[-1] + 1
        return {TP: [_record(o) for o in offsets]}

    return answer


async def test_a_record_past_an_unseen_offset_is_held_back_until_the_offset_arrives() -> None:
    gaps: list[tuple[int, int]] = []
    watch = GapWatch(lambda tp, missing, seen, waited: gaps.append((missing, seen)), hold_s=60)
    consumer = _Consumer([_fetched([0, 1, 2, 5, 6]), _fetched([3, 4, 5, 6])])
    skip = skipping("test", get_logger(__name__))

    first = await getmany(consumer, timeout_ms=10, max_records=None, on_unreadable=skip, gaps=watch)
    assert [r.offset for r in first[TP]] == [0, 1, 2]
    assert consumer.positions[TP] == 3, "read again from the first offset never seen"
    assert watch.waiting == 1

    second = await getmany(
        consumer, timeout_ms=10, max_records=None, on_unreadable=skip, gaps=watch
    )
    assert [r.offset for r in second[TP]] == [3, 4, 5, 6]
    assert (watch.waiting, watch.given_up, gaps) == (0, 0, [])


async def test_a_gap_that_never_closes_is_passed_after_the_hold_and_reported() -> None:
    gaps: list[tuple[int, int]] = []
    watch = GapWatch(lambda tp, missing, seen, waited: gaps.append((missing, seen)), hold_s=0.05)
    consumer = _Consumer([_fetched([0, 3]), _fetched([3]), _fetched([3, 4])])
    skip = skipping("test", get_logger(__name__))
    seen: list[int] = []
    deadline = time.monotonic() + 5
    while 4 not in seen and time.monotonic() < deadline:
        if not consumer.answers:
            consumer.answers.append(_fetched([3, 4]))
        batch = await getmany(
            consumer, timeout_ms=10, max_records=None, on_unreadable=skip, gaps=watch
        )
        seen += [r.offset for r in batch.get(TP, [])]
        await asyncio.sleep(0.01)
    assert seen == [0, 3, 4], "each record once, in order, the gap passed once"
    assert gaps == [(1, 3)]
    assert watch.given_up == 1
    assert watch.waiting == 0


async def test_a_failed_fetch_never_moves_a_partition_forward() -> None:
    """A rebalance during the failed call reset the partition to its committed offset (10),
    below the position taken before the call (40): going to 40 would skip 10..39."""

    def fail_after_reset(consumer: _Consumer) -> Any:
        consumer.positions[TP] = 10
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")

    consumer = _Consumer([fail_after_reset, {}], position=40)
    await getmany(
        consumer,
        timeout_ms=10,
        max_records=None,
        on_unreadable=skipping("test", get_logger(__name__)),
    )
    assert (TP, 40) not in consumer.seeks
    assert consumer.positions[TP] == 10


async def test_three_producers_on_one_partition_are_read_without_a_gap(
    make_settings: SettingsFactory,
) -> None:
    """On the embedded broker, several producers writing one partition while it is tailed:
    the reader with a ``GapWatch`` hands out every offset once, in order."""
    settings = make_settings(partitions=1)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    topic = settings.topics.replies
    producers = [build_producer(kafka) for _ in range(3)]
    for producer in producers:
        await producer.start()
    consumer = build_consumer(kafka, fetch_max_wait_ms=10)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    watch = GapWatch(lambda *gap: None, hold_s=5)
    stop = time.monotonic() + 8
    sent = 0

    async def produce(producer: Any) -> None:
        nonlocal sent
        while time.monotonic() < stop and sent < RECORDS:
            acks = [await producer.send(topic, b"x" * 200, partition=0) for _ in range(20)]
            await asyncio.gather(*acks)
            sent += len(acks)
            await asyncio.sleep(0.001)

    writers = [asyncio.create_task(produce(p)) for p in producers]
    offsets: list[int] = []
    # The read ends when every acknowledged record was handed out; the deadline only bounds a
    # reader that lost one, so a slow machine reads longer rather than failing (CI fell 5 s behind).
    read_until = stop + 120
    try:
        while not all(w.done() for w in writers) or (
            len(offsets) < sent and time.monotonic() < read_until
        ):
            batch = await getmany(
                consumer,
                timeout_ms=50,
                max_records=None,
                on_unreadable=skipping("test", get_logger(__name__)),
                owned=[tp],
                gaps=watch,
            )
            offsets += [r.offset for r in batch.get(tp, [])]
        await asyncio.gather(*writers)
    finally:
        for w in writers:
            w.cancel()
        for producer in producers:
            await producer.stop()
        await consumer.stop()
    assert offsets == list(range(sent))
    assert watch.given_up == 0


class _CommitRevokes:
    """A consumer whose commit completes after the partition was revoked."""

    def __init__(self, loop: ConsumeLoop) -> None:
        self.loop = loop

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        await asyncio.sleep(0)
        self.loop.trackers.clear()

    def highwater(self, tp: TopicPartition) -> int | None:
        return None


async def test_a_revocation_during_a_periodic_commit_does_not_end_periodic_commits() -> None:
    loop = ConsumeLoop(
        consumer=cast(Any, None),
        restore_consumer=cast(Any, None),
        executor=cast(Any, type("H", (), {"store": None})()),
        metrics=WorkerMetrics(CollectorRegistry()),
        config=LoopConfig(topics=("t",), state_topic="s"),
    )
    loop.consumer = loop.commits.consumer = cast(Any, _CommitRevokes(loop))
    tracker = OffsetTracker()
    tracker.dispatched(0)
    tracker.finished(0)
    loop.trackers[TP] = tracker
    await loop.commits.commit()  # must not raise KeyError

    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("a bug")

    ticker = asyncio.create_task(loop._every(0.01, flaky))
    for _ in range(200):
        if calls >= 3:
            break
        await asyncio.sleep(0.01)
    ticker.cancel()
    assert calls >= 3, "the periodic task went on after one call raised"


@pytest.mark.parametrize("hold_s", [0.0, 2.5])
def test_the_gap_hold_is_a_setting_and_zero_turns_the_watch_off(hold_s: float) -> None:
    """``KAFKA_OFFSET_GAP_HOLD_S`` reaches the consume loop and the reply reader; at 0 neither
    carries a watch (Kafka has no gap to wait for)."""
    settings = Settings(kafka_offset_gap_hold_s=hold_s)
    kafka = settings.kafka_config()
    loop = consume_loop(
        kafka,
        settings.loop_config("worker"),
        consumer=cast(Any, None),
        handler=cast(Any, type("H", (), {"store": None})()),
        metrics=WorkerMetrics(CollectorRegistry()),
    )
    router = ReplyRouter(None, "replies", gap_hold_s=kafka.offset_gap_hold_s)
    for gaps in (loop.gaps, router.gaps):
        if hold_s == 0:
            assert gaps is None
        else:
            assert gaps is not None and gaps.hold_s == hold_s


def test_the_dev_tools_turn_the_gap_watch_on() -> None:
    assert DevSettings().kafka_config().offset_gap_hold_s == EMBEDDED_OFFSET_GAP_HOLD_S > 0


def test_the_product_holds_no_gap_by_default() -> None:
    """Kafka has no offset gap, so a product process on a real cluster runs no watch unless
    told to; the dev tools and the fixtures set it for the embedded broker."""
    assert Settings().kafka_config().offset_gap_hold_s == 0
