"""``partitions_of`` and ``assign_all`` on the real (embedded) broker: a group-less consumer, or
one share of a ``SharedConsumer``, learns the partitions of a topic it has no metadata for,
also of a topic created while it waits, and gives up empty at its deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import TopicPartition

from tests.conftest import SettingsFactory
from worker.engine.kafka import build_consumer, build_producer, create_topics, ensure_topics
from worker.engine.tail import SharedConsumer, TopicTail, assign_all, partitions_of
from worker.settings import Settings

pytestmark = pytest.mark.integration

OUTER_S = 30.0
"""A bound on every wait of this module, far above the deadlines the calls get."""


@pytest.fixture
async def settings(make_settings: SettingsFactory) -> Settings:
    settings = make_settings(partitions=3)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    return settings


async def started(settings: Settings, shared: bool) -> tuple[Any, Any]:
    """A started group-less consumer, or a share of a started ``SharedConsumer``; and what
    stops it."""
    if not shared:
        consumer = build_consumer(settings.kafka_config())
        await consumer.start()
        return consumer, consumer
    hub = SharedConsumer(build_consumer(settings.kafka_config()))
    share = hub.share()
    await share.start()
    return share, share


@pytest.mark.parametrize("shared", [False, True], ids=["consumer", "share"])
async def test_the_partitions_of_a_topic_missing_from_the_metadata_are_learnt(
    settings: Settings, shared: bool
) -> None:
    """An assigned consumer's metadata covers its assigned topics only: another topic is
    unknown to it until ``partitions_of`` asks."""
    consumer, stopper = await started(settings, shared)
    other = settings.topics.status
    try:
        async with asyncio.timeout(OUTER_S):
            await assign_all(consumer, settings.topics.commands, timeout_s=20)
            for _ in range(200):  # until the metadata is narrowed to the assignment
                if not consumer.partitions_for_topic(other):
                    break
                await asyncio.sleep(0.05)
            assert not consumer.partitions_for_topic(other)
            parts = await partitions_of(consumer, other, deadline=time.monotonic() + 20)
        assert parts == {0, 1, 2}
    finally:
        await stopper.stop()


@pytest.mark.parametrize("shared", [False, True], ids=["consumer", "share"])
async def test_a_topic_created_while_waiting_is_found(settings: Settings, shared: bool) -> None:
    late = f"{settings.topics.commands}.late"
    consumer, stopper = await started(settings, shared)
    try:
        waiting = asyncio.create_task(
            partitions_of(consumer, late, deadline=time.monotonic() + 20, pause_s=0.05)
        )
        await asyncio.sleep(0.5)  # the lookup has asked for the missing topic by now
        assert not waiting.done()
        await create_topics(
            settings.kafka_config(), {late: 2}, replication_factor=settings.kafka_replication_factor
        )
        async with asyncio.timeout(OUTER_S):
            assert await waiting == {0, 1}
        # And the assignment built on it reads the late topic's records.
        producer = build_producer(settings.kafka_config())
        await producer.start()
        try:
            await producer.send_and_wait(late, b"v", key=b"k", partition=1)
        finally:
            await producer.stop()
        async with asyncio.timeout(OUTER_S):
            tps = await assign_all(consumer, late, timeout_s=20)
            assert tps == [TopicPartition(late, 0), TopicPartition(late, 1)]
            got: list[Any] = []
            while not got:
                batch = await consumer.getmany(timeout_ms=200)
                got.extend(r for rs in batch.values() for r in rs)
        assert [(r.partition, r.value) for r in got] == [(1, b"v")]
    finally:
        await stopper.stop()


async def test_a_topic_that_never_appears_gives_nothing_at_the_deadline(
    settings: Settings,
) -> None:
    """Bounded, and looking for a topic does not create it (a broker that creates topics
    named in a metadata request would give it its default partition count)."""
    never = f"{settings.topics.commands}.never"
    consumer = build_consumer(settings.kafka_config())
    await consumer.start()
    try:
        async with asyncio.timeout(OUTER_S):
            assert await partitions_of(consumer, never, deadline=time.monotonic() + 1.0) == set()
            with pytest.raises(RuntimeError, match="has no partitions"):
                await assign_all(consumer, never, timeout_s=1.0)
            assert never not in await consumer.topics()
    finally:
        await consumer.stop()


class Recording(TopicTail):
    """A tail that keeps the values it handled."""

    def __init__(self, consumer: Any, topic: str) -> None:
        super().__init__(consumer, topic, name="recording")
        self.values: list[bytes] = []

    def handle(self, records: list[Any]) -> None:
        self.values.extend(r.value for r in records)


@contextlib.asynccontextmanager
async def recording(settings: Settings, fetch_wait_ms: int) -> AsyncIterator[tuple[Recording, Any]]:
    """A started ``Recording`` tail of webhook.endpoints, caught up, and a producer."""
    topic = settings.topics.webhook_endpoints
    tail = Recording(
        build_consumer(settings.kafka_config(), fetch_max_wait_ms=fetch_wait_ms), topic
    )
    producer = build_producer(settings.kafka_config())
    await producer.start()
    await tail.start()
    try:
        async with asyncio.timeout(OUTER_S):
            assert await tail.wait_caught_up(20)
            yield tail, producer
    finally:
        await tail.stop()
        await producer.stop()


async def test_read_to_end_returns_once_a_record_written_before_it_is_handled(
    settings: Settings,
) -> None:
    """A reader that meets a key the tail has not applied yet (another consumer ran ahead)
    reads the tail to the topic's end: a record written before the call is handled when it
    returns, however long the tail's fetches are held (3 s here, on the embedded broker)."""
    async with recording(settings, 3000) as (tail, producer):
        await asyncio.sleep(0.2)  # the tail's next fetch is held now
        for n in range(3):
            await producer.send_and_wait(tail.topic, f"v{n}".encode(), key=b"k", partition=n)
        # Its held fetch comes back up to 3 s later; without the wait these are missing.
        assert await tail.read_to_end(timeout=20)
        assert sorted(tail.values) == [b"v0", b"v1", b"v2"]


async def test_read_to_end_of_a_stopped_tail_is_false_at_its_time_out(
    settings: Settings,
) -> None:
    async with recording(settings, 50) as (tail, producer):
        tail.task.cancel()  # the loop is gone; the consumer still answers
        with contextlib.suppress(asyncio.CancelledError):
            await tail.task
        await producer.send_and_wait(tail.topic, b"late", key=b"k", partition=0)
        assert not await tail.read_to_end(timeout=1)
        assert tail.values == []
