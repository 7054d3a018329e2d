"""``catch_up`` on the real (embedded) broker: every record up to the high-water mark
of each partition, in offset order, nothing of other partitions, positions at the end, and a
consumer that keeps reading afterwards; and the state store's restore built on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.conftest import SettingsFactory
from worker.auth.store import StateStore
from worker.contract.messages import AccountRecord, encode_record
from worker.engine.catch_up import catch_up, high_water_marks
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.store import restore_partitions
from worker.settings import Settings

pytestmark = pytest.mark.integration


async def produce(
    settings: Settings, topic: str, records: Sequence[tuple[int, bytes | None, bytes | None]]
) -> None:
    """Send (partition, key, value) records and wait for every acknowledgement."""
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        sent = [
            await producer.send(topic, value, key=key, partition=partition)
            for partition, key, value in records
        ]
        for fut in sent:
            await fut
    finally:
        await producer.stop()


@pytest.fixture
async def settings(make_settings: SettingsFactory) -> Settings:
    settings = make_settings(partitions=4)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    return settings


@pytest.fixture
async def consumer(settings: Settings) -> AsyncIterator[AIOKafkaConsumer]:
    # A short fetch wait keeps the empty-partition polls quick on the embedded broker.
    consumer = build_consumer(settings.kafka_config(), fetch_max_wait_ms=50)
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


class Collector:
    """The batches handed over, per partition, flattened to (offset, value)."""

    def __init__(self) -> None:
        self.seen: dict[int, list[tuple[int, bytes | None]]] = {}

    def __call__(self, tp: TopicPartition, records: list[Any]) -> None:
        assert records, "an empty batch is never handed over"
        assert all(r.partition == tp.partition for r in records)
        self.seen.setdefault(tp.partition, []).extend((r.offset, r.value) for r in records)


async def test_every_partition_is_read_to_its_high_water_mark(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    topic = settings.topics.state
    sizes = {0: 2500, 1: 1, 2: 0, 3: 40}  # a long one (several batches), a single, an empty
    await produce(
        settings,
        topic,
        [(p, b"k", b"%d-%d" % (p, i)) for p, n in sizes.items() for i in range(n)],
    )
    tps = [TopicPartition(topic, p) for p in (0, 1, 2)]  # partition 3 is not replayed
    seen = Collector()

    done = await catch_up(consumer, tps, seen, max_records=1000)

    assert list(done) == tps
    for tp in tps:
        n = sizes[tp.partition]
        assert done[tp].position == n == done[tp].records
        assert done[tp].seconds >= 0
        assert consumer.highwater(tp) == n
        expected = [(i, b"%d-%d" % (tp.partition, i)) for i in range(n)]
        assert seen.seen.get(tp.partition, []) == expected
    assert 3 not in seen.seen
    assert consumer.assignment() == set(tps)
    assert consumer.paused() == set()


async def test_the_consumer_keeps_reading_after_the_replay(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    """Every partition is resumed where its replay ended, the ones that finished first too."""
    topic = settings.topics.replies
    await produce(settings, topic, [(0, b"k", b"old-0"), (1, b"k", b"old-1")])
    tps = [TopicPartition(topic, p) for p in range(4)]
    done = await catch_up(consumer, tps, Collector())
    assert {tp.partition: r.position for tp, r in done.items()} == {0: 1, 1: 1, 2: 0, 3: 0}

    await produce(settings, topic, [(0, b"k", b"new-0"), (2, b"k", b"new-2")])
    later: dict[int, list[bytes | None]] = {}
    for _ in range(100):
        batch = await consumer.getmany(timeout_ms=100)
        for tp, records in batch.items():
            later.setdefault(tp.partition, []).extend(r.value for r in records)
        if sum(map(len, later.values())) >= 2:
            break
    assert later == {0: [b"new-0"], 2: [b"new-2"]}


async def test_a_replay_always_starts_at_the_beginning(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    topic = settings.topics.status
    await produce(settings, topic, [(1, None, b"%d" % i) for i in range(5)])
    tp = TopicPartition(topic, 1)
    first, second = Collector(), Collector()
    again = await catch_up(consumer, [tp], first)
    assert (again[tp].position, again[tp].records) == (5, 5)
    again = await catch_up(consumer, [tp], second)
    assert (again[tp].position, again[tp].records) == (5, 5)
    assert first.seen == second.seen == {1: [(i, b"%d" % i) for i in range(5)]}


async def test_without_assign_the_callers_assignment_and_positions_are_used(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    """What a tail does: it assigns and rewinds when it starts, and replays in its task."""
    topic = settings.topics.dlq
    await produce(settings, topic, [(0, None, b"%d" % i) for i in range(6)])
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 2)
    seen = Collector()
    done = await catch_up(consumer, [tp], seen, assign=False)
    assert (done[tp].position, done[tp].records) == (6, 4)
    assert seen.seen == {0: [(i, b"%d" % i) for i in range(2, 6)]}


async def test_an_empty_topic_is_complete_at_once(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    tps = [TopicPartition(settings.topics.errors, p) for p in range(4)]
    seen = Collector()
    done = await catch_up(consumer, tps, seen)
    assert [(r.position, r.records) for r in done.values()] == [(0, 0)] * 4
    assert seen.seen == {}


async def test_high_water_marks_are_the_ends_a_fetch_reports(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    """Where each partition ends, past a last batch of many records (the embedded broker's
    ``end_offsets()`` names its first record + 1) and for an empty partition."""
    topic = settings.topics.commands
    await produce(settings, topic, [(0, b"k", b"%d" % i) for i in range(7)])
    await produce(settings, topic, [(1, b"k", b"x")])
    tps = [TopicPartition(topic, p) for p in range(3)]
    assert await high_water_marks(consumer, tps) == dict(zip(tps, [7, 1, 0], strict=True))
    await produce(settings, topic, [(2, b"k", b"y"), (2, b"k", b"z")])
    assert (await high_water_marks(consumer, tps))[tps[2]] == 2


class _FirstResponseLate:
    """The real consumer, as seen while its first fetch response has not arrived (a slow
    broker, a TLS handshake, a loaded host): polls come back empty and no high-water mark is
    known for the first ``polls`` polls."""

    def __init__(self, consumer: AIOKafkaConsumer, polls: int) -> None:
        self._consumer = consumer
        self._late = polls

    async def getmany(self, **kwargs: Any) -> Any:
        if self._late > 0:
            self._late -= 1
            return {}
        return await self._consumer.getmany(**kwargs)

    def highwater(self, tp: TopicPartition) -> int | None:
        return None if self._late > 0 else self._consumer.highwater(tp)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


async def test_empty_polls_before_the_first_fetch_response_do_not_end_the_replay(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    """An empty poll says nothing of a partition whose first response has not come: taking it
    for empty would restore a partition as if it held no accounts."""
    tp = TopicPartition(settings.topics.status, 1)
    await produce(settings, tp.topic, [(1, b"k", b"%d" % i) for i in range(5)])
    seen = Collector()
    late = cast(AIOKafkaConsumer, _FirstResponseLate(consumer, polls=3))
    done = await catch_up(late, [tp], seen, idle_timeout_ms=10)
    assert (done[tp].position, done[tp].records) == (5, 5)
    assert [offset for offset, _ in seen.seen[1]] == [0, 1, 2, 3, 4]


def account(account_id: str, version: int) -> AccountRecord:
    return AccountRecord(
        account_id=account_id,
        workspace_id="ws_a",
        status="passkey_confirmation",
        auth_status="pending",
        version=version,
        updated_at=0.0,
    )


async def test_restore_keeps_the_last_record_per_account(
    settings: Settings, consumer: AIOKafkaConsumer
) -> None:
    topic = settings.topics.state
    await produce(
        settings,
        topic,
        [
            (0, b"a", encode_record(account("a", 1))),
            (0, b"b", encode_record(account("b", 1))),
            (0, b"a", encode_record(account("a", 2))),
            (0, b"c", b"not a record"),
            (0, b"b", None),  # a tombstone
            (2, b"d", encode_record(account("d", 7))),
        ],
    )
    tps = [TopicPartition(topic, p) for p in (0, 1, 2)]
    restored = await restore_partitions(consumer, tps, decode=StateStore.decode)
    records = {p: {k: r.version for k, r in latest.items()} for p, (latest, _) in restored.items()}
    assert records == {0: {"a": 2}, 1: {}, 2: {"d": 7}}
    stats = {p: (s.records, s.accounts, s.undecodable) for p, (_, s) in restored.items()}
    assert stats == {0: (5, 1, 1), 1: (0, 0, 0), 2: (1, 1, 0)}
