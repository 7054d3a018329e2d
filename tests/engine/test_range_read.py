"""``read_range`` and ``partitions`` on the real (embedded) broker: a range from an offset (clamped
to what the partition holds), from its last ``n`` records or from a time, to the end the
partition had when the read began, never what arrives afterwards; within a record budget and a
deadline; a handler's awaitable awaited before the next fetch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.conftest import SettingsFactory
from worker.engine.home_partition import home_partition
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.range_read import Span, partitions, read_range
from worker.settings import Settings

pytestmark = pytest.mark.integration

OUTER_S = 30.0
"""A bound on every wait of this module."""


def _skip(tp: TopicPartition, offset: int, exc: BaseException) -> None:
    raise AssertionError(f"unreadable record at {tp}:{offset}: {exc!r}")


async def produce(settings: Settings, topic: str, records: Sequence[tuple[int, bytes]]) -> None:
    """Send (partition, value) records and wait for every acknowledgement."""
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        sent = [await producer.send(topic, v, key=b"k", partition=p) for p, v in records]
        for fut in sent:
            await fut
    finally:
        await producer.stop()


@pytest.fixture
async def settings(make_settings: SettingsFactory) -> Settings:
    settings = make_settings(partitions=2)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    return settings


@pytest.fixture
async def consumer(settings: Settings) -> AsyncIterator[AIOKafkaConsumer]:
    consumer = build_consumer(settings.kafka_config(), fetch_max_wait_ms=50)
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


class Seen:
    """The offsets handed over, per partition."""

    def __init__(self) -> None:
        self.offsets: dict[int, list[int]] = {}

    def __call__(self, tp: TopicPartition, records: list[Any]) -> None:
        assert records, "an empty batch is never handed over"
        self.offsets.setdefault(tp.partition, []).extend(r.offset for r in records)


async def test_from_offsets_to_the_end_at_the_start_never_what_arrives_afterwards(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    """Partition 0 holds 10 records, partition 1 none. A read from offset 4 of partition 0
    (and past the end of partition 1) hands over 4..9; 5 records written while it runs (from
    its first batch's handler) are not read, and the spans say where each stopped."""
    topic = settings.topics.status
    await produce(settings, topic, [(0, b"old")] * 10)
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    seen = Seen()

    async def handle(tp: TopicPartition, records: list[Any]) -> None:
        if not seen.offsets:
            await produce(settings, topic, [(0, b"late")] * 5)
        seen(tp, records)

    async with asyncio.timeout(OUTER_S):
        spans = await read_range(
            consumer, tps, handle, on_unreadable=_skip, offsets={tps[0]: 4, tps[1]: 99}
        )
    assert seen.offsets == {0: [4, 5, 6, 7, 8, 9]}
    assert spans[tps[0]] == Span(
        start=4,
        stop=10,
        end=10,
        next=10,
        records=6,
        last_timestamp_ms=spans[tps[0]].last_timestamp_ms,
    )
    assert spans[tps[0]].complete and spans[tps[0]].last_timestamp_ms is not None
    assert spans[tps[1]] == Span(start=0, stop=0, end=0, next=0)  # clamped to what it holds
    assert spans[tps[1]].complete


async def test_the_last_records_and_a_record_budget(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    """``last=3`` reads the partition's last three records; from offset 0 with a budget of 4,
    offsets 0..3 and a span done but not complete (the page has more)."""
    topic = settings.topics.status
    await produce(settings, topic, [(1, b"r")] * 12)
    tp = TopicPartition(topic, 1)
    async with asyncio.timeout(OUTER_S):
        last = Seen()
        span = (await read_range(consumer, [tp], last, on_unreadable=_skip, last=3))[tp]
        assert last.offsets == {1: [9, 10, 11]} and (span.start, span.next) == (9, 12)
        budget = Seen()
        span = (
            await read_range(
                consumer, [tp], budget, on_unreadable=_skip, offsets={tp: 0}, max_records=4
            )
        )[tp]
    assert budget.offsets == {1: [0, 1, 2, 3]}
    assert span.done and not span.complete and (span.next, span.stop, span.end) == (4, 4, 12)


async def test_from_a_time_reads_what_was_stamped_at_or_after_it(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    """Two groups of records apart in time (the embedded broker stamps by append time): from a
    time between them, the second group alone; from a time after both, nothing (the broker's
    "none" is the end, never offset 0)."""
    topic = settings.topics.status
    await produce(settings, topic, [(0, b"old")] * 6)
    await asyncio.sleep(0.3)
    between = int(time.time() * 1000)
    await asyncio.sleep(0.3)
    await produce(settings, topic, [(0, b"new")] * 3)
    await asyncio.sleep(0.3)
    after = int(time.time() * 1000)
    tp = TopicPartition(topic, 0)
    async with asyncio.timeout(OUTER_S):
        seen = Seen()
        await read_range(consumer, [tp], seen, on_unreadable=_skip, since_ms=between)
        assert seen.offsets == {0: [6, 7, 8]}
        none = Seen()
        span = (await read_range(consumer, [tp], none, on_unreadable=_skip, since_ms=after))[tp]
    assert none.offsets == {} and span.start == span.end == 9 and span.complete


async def test_a_passed_deadline_reads_nothing_and_says_where_it_stopped(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    topic = settings.topics.status
    await produce(settings, topic, [(0, b"r")] * 5)
    tp = TopicPartition(topic, 0)
    seen = Seen()
    async with asyncio.timeout(OUTER_S):
        span = (
            await read_range(
                consumer,
                [tp],
                seen,
                on_unreadable=_skip,
                offsets={tp: 1},
                deadline=time.monotonic() - 1,
            )
        )[tp]
    assert seen.offsets == {} and (span.next, span.end) == (1, 5) and not span.done


async def test_exactly_one_start_is_given(consumer: AIOKafkaConsumer) -> None:
    tp = TopicPartition("t", 0)
    for wanted in ({}, {"last": 1, "since_ms": 0}, {"offsets": {tp: 0}, "last": 1}):
        with pytest.raises(ValueError, match="exactly one"):
            await read_range(consumer, [tp], Seen(), on_unreadable=_skip, **wanted)


async def test_partitions_every_one_or_a_keys_home_or_a_time_out(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    topic = settings.topics.status
    async with asyncio.timeout(OUTER_S):
        every = await partitions(consumer, topic, deadline=time.monotonic() + 20)
        (home,) = await partitions(consumer, topic, deadline=time.monotonic() + 20, key=b"acc")
        assert every == [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        assert home == TopicPartition(topic, home_partition(b"acc", 2))
        with pytest.raises(TimeoutError):
            await partitions(consumer, "no-such-topic-here", deadline=time.monotonic() + 0.3)
