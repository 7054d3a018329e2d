"""The delivery log's records on the real broker: entries of one endpoint written within the
flush window share one record (in their order), a lone entry keeps the one-entry form, and the
front-end's reader (``decode_log``, as the deliveries scan reads them) reads both forms alike; a
hostile batch is refused whole."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer
from pydantic import ValidationError

from tests.conftest import SettingsFactory
from tests.engine.test_dead_letter_refused import _SmallDeadLetterTopic
from tests.webhooks.support import read_topic
from worker.contract.delivery_log import (
    LOG_BATCH_BYTES,
    LOG_BATCH_MAX,
    DeliveryLogBatch,
    DeliveryLogEntry,
    decode_log,
)
from worker.dispatcher.delivery import DeliveryState, Finished, Pending
from worker.dispatcher.publish import DeliveryPublisher
from worker.engine.kafka import build_producer, ensure_topics
from worker.settings import Settings

pytestmark = pytest.mark.integration


def pending(n: int) -> Pending:
    return Pending(
        webhook_id=f"msg_{n}",
        event_type="account.auth_status_changed",
        event_id=f"evt_{n}",
        version=n,
        body="{}",
        occurred_at="2026-01-01T00:00:00Z",
        enqueued_at=0.0,
        next_attempt_at=0.0,
    )


@contextlib.asynccontextmanager
async def publishing(
    settings: Settings, log_flush_s: float
) -> AsyncIterator[tuple[AIOKafkaProducer, DeliveryPublisher]]:
    """A publisher batching its log per ``log_flush_s`` on a started producer (stopped after),
    its topics made."""
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        yield (
            producer,
            DeliveryPublisher(
                producer,
                state_topic=settings.topics.webhook_state,
                log_topic=settings.topics.webhook_deliveries,
                dlq_topic=settings.topics.webhook_dlq,
                log_flush_s=log_flush_s,
            ),
        )
    finally:
        await producer.stop()


def delivered(n: int) -> Finished:
    return Finished(
        webhook_id=f"msg_{n}",
        event_type="account.auth_status_changed",
        version=n,
        attempts=1,
        state="delivered",
        last_status=204,
        finished_at=float(n),
    )


async def test_entries_of_one_window_share_a_record_and_the_view_reads_both_forms(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings()
    async with publishing(settings, 0.05) as (_, publisher):
        busy = DeliveryState(endpoint_id="ep_busy", account_id="acc_1", workspace_id="ws_a")
        quiet = DeliveryState(endpoint_id="ep_quiet", account_id="acc_1", workspace_id="ws_a")
        # 5 writers at once to one endpoint, 1 to another: both wait for their record's ack
        await asyncio.gather(
            *(publisher.log_finished(busy, pending(n), delivered(n)) for n in range(5)),
            publisher.log_finished(quiet, pending(9), delivered(9)),
        )
    records = await read_topic(settings, settings.topics.webhook_deliveries)

    by_key = {r.key.decode(): r.value for r in records}
    assert len(records) == 2, "one record per endpoint and window"
    batch = DeliveryLogBatch.model_validate_json(by_key["ep_busy"])
    assert [e.webhook_id for e in batch.entries] == [f"msg_{n}" for n in range(5)], "in order"
    lone = DeliveryLogEntry.model_validate_json(by_key["ep_quiet"])
    assert lone.webhook_id == "msg_9", "a lone entry keeps the one-entry form"

    read = {r.key.decode(): decode_log(r.value) for r in records}
    assert [e.webhook_id for e in read["ep_busy"]] == [f"msg_{n}" for n in range(5)]
    assert [(e.endpoint_id, e.state) for e in read["ep_quiet"]] == [("ep_quiet", "delivered")]


async def test_a_writer_cancelled_in_its_window_leaves_the_others_waiting(
    make_settings: SettingsFactory,
) -> None:
    """Writers of one window wait each on their own: one cancelled (its lane revoked) stops
    waiting alone; the others still wait for the record's ack, and its entry is written."""
    settings = make_settings()
    async with publishing(settings, 0.2) as (_, publisher):
        state = DeliveryState(endpoint_id="ep_1", account_id="acc_1", workspace_id="ws_a")
        writers = [
            asyncio.ensure_future(publisher.log_finished(state, pending(n), delivered(n)))
            for n in range(4)
        ]
        await asyncio.sleep(0)
        writers[0].cancel()
        await asyncio.gather(*writers[1:])
        assert writers[0].cancelled()
        assert not any(w.cancelled() for w in writers[1:])
    records = await read_topic(settings, settings.topics.webhook_deliveries)
    entries = [e for r in records for e in decode_log(r.value)]
    assert [e.webhook_id for e in entries] == [f"msg_{n}" for n in range(4)]


async def test_a_window_that_cannot_be_written_fails_each_of_its_writers(
    make_settings: SettingsFactory,
) -> None:
    """The window's record refused (its producer gone): every writer waiting on it gets the
    failure, none waits on for ever."""
    async with publishing(make_settings(), 0.2) as (producer, publisher):
        state = DeliveryState(endpoint_id="ep_1", account_id="acc_1", workspace_id="ws_a")
        writers = [publisher.log_finished(state, pending(n), delivered(n)) for n in range(3)]
        await producer.stop()
        outcomes = await asyncio.wait_for(asyncio.gather(*writers, return_exceptions=True), 30)
    assert all(isinstance(o, Exception) for o in outcomes), outcomes
    assert len({type(o) for o in outcomes}) == 1, "the one failure of their one record"


def _entry(endpoint_id: str, n: int) -> DeliveryLogEntry:
    return DeliveryLogEntry(
        webhook_id=f"msg_{n}",
        endpoint_id=endpoint_id,
        workspace_id="ws_a",
        account_id="acc_1",
        event_type="account.auth_status_changed",
        event_id=f"evt_{n}",
        attempts=1,
        state="delivered",
        updated_at="2026-01-01T00:00:00Z",
    )


def test_a_batch_naming_another_endpoints_entry_is_refused_whole() -> None:
    """A record keyed by one endpoint cannot slip an entry into another endpoint's log."""
    value = (
        '{"type":"webhook_delivery_batch","schema_version":1,"endpoint_id":"ep_a","entries":['
        + _entry("ep_a", 1).model_dump_json()
        + ","
        + _entry("ep_b", 2).model_dump_json()
        + "]}"
    )
    with pytest.raises(ValidationError):
        decode_log(value.encode())


def test_a_batch_is_bounded_and_never_empty() -> None:
    many = tuple(_entry("ep_a", n) for n in range(LOG_BATCH_MAX + 1))
    with pytest.raises(ValidationError):
        DeliveryLogBatch(endpoint_id="ep_a", entries=many)
    with pytest.raises(ValidationError):
        decode_log(b'{"type":"webhook_delivery_batch","endpoint_id":"ep_a","entries":[]}')
    assert decode_log(_entry("ep_a", 1).model_dump_json().encode())[0].webhook_id == "msg_1"


async def test_a_batch_of_large_entries_is_closed_by_its_bytes(
    make_settings: SettingsFactory,
) -> None:
    """Entries carry their body: a window of large ones goes out in several records, each
    under ``LOG_BATCH_BYTES`` and the broker's limit, in order, each entry once."""
    settings = make_settings()
    big = "x" * 60_000  # an event body near the event model's limit
    async with publishing(settings, 0.5) as (_, publisher):
        state = DeliveryState(endpoint_id="ep_big", account_id="acc_1", workspace_id="ws_a")
        await asyncio.gather(
            *(
                publisher.log_finished(
                    state, pending(n).model_copy(update={"body": big}), delivered(n)
                )
                for n in range(20)
            )
        )
    records = await read_topic(settings, settings.topics.webhook_deliveries)
    assert len(records) > 1
    assert all(len(r.value) <= LOG_BATCH_BYTES + 64 * 1024 for r in records)
    entries = [e for r in records for e in decode_log(r.value)]
    assert [e.webhook_id for e in entries] == [f"msg_{n}" for n in range(20)]
    assert all(e.body == big for e in entries)


@pytest.mark.parametrize(("limit", "kept"), [(2000, True), (10, False)])
async def test_a_failed_deliverys_dead_letter_refused_for_its_size_is_sent_without_its_body(
    make_settings: SettingsFactory, limit: int, kept: bool
) -> None:
    """A webhook DLQ topic whose records may not hold the body (a small
    ``max.message.bytes``; the embedded broker does not enforce it, so the refusal is made at
    the producer's boundary as the broker would answer): the letter goes again without its
    body, its size and digest in its place; refused even so, the failure is logged and the
    attempt's path goes on instead of raising out of the lane."""
    settings = make_settings()
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    producer = build_producer(settings.kafka_config())
    await producer.start()
    small = _SmallDeadLetterTopic(producer, settings.topics.webhook_dlq, limit)
    body = json.dumps({"padding": "x" * 5000})
    head = pending(1).model_copy(update={"body": body})
    failed = Finished(
        webhook_id=head.webhook_id,
        event_type=head.event_type,
        attempts=3,
        state="failed",
        last_status=500,
        finished_at=1.0,
    )
    try:
        publisher = DeliveryPublisher(
            small,
            state_topic=settings.topics.webhook_state,
            log_topic=settings.topics.webhook_deliveries,
            dlq_topic=settings.topics.webhook_dlq,
        )
        state = DeliveryState(endpoint_id="ep_1", account_id="acc_1", workspace_id="ws_a")
        await publisher.dead_letter(state, head, failed)
    finally:
        await producer.stop()
    assert small.refused  # the full letter was refused
    letters = await read_topic(settings, settings.topics.webhook_dlq)
    if not kept:
        assert letters == []
        return
    [letter] = letters
    names = dict(letter.headers)
    assert letter.value is None
    assert names["webhook.id"] == head.webhook_id.encode()
    assert names["webhook.body_bytes"] == str(len(body.encode())).encode()
    assert names["webhook.body_sha256"] == hashlib.sha256(body.encode()).hexdigest().encode()
