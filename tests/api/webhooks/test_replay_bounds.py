"""The replay scan reads from ``since``, not from the beginning (issue 31, row 7): each
partition starts where the broker's timestamp index puts ``since`` and ends at the high-water
mark of the scan's start. Against the session's real broker (the embedded Tansu, or the
cluster ``KAFKA_BOOTSTRAP_SERVERS`` names)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.api.support import produce, wait_until
from tests.api.webhooks.test_routes import read_all, status_event
from tests.webhooks.support import replay_scan
from worker.api.webhooks.replay import new_replay_id
from worker.contract.delivery_log import decode_replay
from worker.contract.webhook_endpoints import EndpointRecord
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.range_read import start_at
from worker.settings import Settings

pytestmark = pytest.mark.integration

OLD = 3000
NEW = 5
MARGIN_S = 0.5


def endpoint(workspace: str = "ws_a") -> EndpointRecord:
    stamp = datetime.now(UTC).isoformat()
    return EndpointRecord(
        id="ep_replay_bounds",
        workspace_id=workspace,
        url="https://example.com/hook",
        created_at=stamp,
        updated_at=stamp,
        revision=1,
    )


def events(workspace: str, occurred: datetime, n: int, tag: str) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(n):
        e = status_event(f"acc_{tag}_{i % 7}", workspace, occurred, version=i + 1)
        out.append((e.account_id.encode(), e.model_dump_json().encode()))
    return out


async def test_a_replay_since_now_reads_only_the_records_after_it(
    make_settings: Callable[..., Settings],
) -> None:
    """3000 old events (an hour old, and stamped by the broker before ``since``), then 5 new
    ones: the replay fetches the 5, not the 3000 (before: every record of both topics was
    fetched from offset 0 and the old events dropped one by one after decoding), and re-sends
    exactly the 5."""
    settings = make_settings(partitions=3)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    await produce(settings, settings.topics.status, events("ws_a", an_hour_ago, OLD, "old"))
    await asyncio.sleep(MARGIN_S + 0.7)  # the old records' timestamps are before since - margin
    since = datetime.now(UTC)
    await asyncio.sleep(0.05)
    new = events("ws_a", datetime.now(UTC), NEW, "new")
    await produce(settings, settings.topics.status, new)

    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        scan = replay_scan(settings, producer, seek_margin_s=MARGIN_S)
        counts = [0, 0, 0]  # replayed, scanned, found
        started = time.monotonic()
        async with asyncio.timeout(60):
            assert await scan.run(new_replay_id(), endpoint(), since, counts) == {}  # to the end
        seconds = time.monotonic() - started
    finally:
        await producer.stop()
    print(f"\nreplay since now after {OLD} old events: fetched {scan.records_read}, {seconds:.2f}s")
    assert counts[0] == NEW
    assert scan.records_read == counts[1]
    assert scan.records_read <= NEW, f"fetched {scan.records_read} records, not only the new"
    sent = [
        decode_replay(m.value) for m in await read_all(settings, settings.topics.webhook_replays)
    ]
    assert sorted(r.event for r in sent) == sorted(v.decode() for _, v in new)


async def test_records_arriving_after_the_start_are_not_read(
    make_settings: Callable[..., Settings],
) -> None:
    """The end is the high-water mark of the scan's start: a flood produced while the replay
    runs does not keep it reading."""
    settings = make_settings(partitions=1)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    since = datetime.now(UTC) - timedelta(minutes=5)
    await produce(settings, settings.topics.status, events("ws_a", datetime.now(UTC), 3, "a"))

    producer = build_producer(settings.kafka_config())
    await producer.start()
    held = HeldProducer(producer)
    try:
        scan = replay_scan(settings, held, seek_margin_s=MARGIN_S)
        counts = [0, 0, 0]  # replayed, scanned, found
        running = asyncio.create_task(scan.run(new_replay_id(), endpoint(), since, counts))
        await wait_until(lambda: held.waiting == 1, what="the replay's first send")
        late = events("ws_a", datetime.now(UTC), 500, "late")
        await produce(settings, settings.topics.status, late)
        held.release.set()
        async with asyncio.timeout(60):
            assert await running == {}  # read to the end
    finally:
        held.release.set()
        await producer.stop()
    assert counts[:2] == [3, 3]


class HeldProducer:
    """The producer, with every send held until ``release``: the replay stops mid-scan."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.release = asyncio.Event()
        self.waiting = 0

    async def send(self, topic: str, value: bytes | None, **kwargs: Any) -> Any:
        self.waiting += 1
        await self.release.wait()
        return await self._producer.send(topic, value, **kwargs)


async def test_the_embedded_broker_finds_offsets_by_time_and_says_none_its_own_way(
    make_settings: Callable[..., Settings],
) -> None:
    """What ``start_at`` relies on: ListOffsets by time finds the first record stamped at or
    after a time within the log; after the last record the answer is "none", which Kafka
    says with offset -1 (``None``) and Tansu with offset 0 and timestamp -1, both read as
    the end. Tansu stamps by append time, so the test separates the two groups in time."""
    settings = make_settings(partitions=1)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    topic = settings.topics.status
    await produce(settings, topic, [(b"k", b"old")] * 20)
    await asyncio.sleep(0.3)
    between = int(time.time() * 1000)
    await asyncio.sleep(0.3)
    await produce(settings, topic, [(b"k", b"new")] * 4)
    await asyncio.sleep(0.3)
    after = int(time.time() * 1000)
    consumer: AIOKafkaConsumer = build_consumer(settings.kafka_config(), fetch_max_wait_ms=50)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        found = await consumer.offsets_for_times({tp: between})
        assert found[tp] is not None and found[tp].offset == 20, found
        assert start_at(found[tp], 24) == 20
        none = (await consumer.offsets_for_times({tp: after}))[tp]
        assert none is None or none.timestamp < 0, none
        assert start_at(none, 24) == 24
    finally:
        await consumer.stop()
