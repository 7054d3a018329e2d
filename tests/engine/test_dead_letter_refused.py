"""A dead letter the topic refuses (a dead-letter topic with a small ``max.message.bytes``)
no longer ends the lane and stops the loop (issue "Tenant budgets", row 11): the letter is sent
again in its minimal form (coordinates, reason, exception class, sizes and SHA-256, no copy of
the record), and if even that is refused the loss is counted and logged and the record let go.

The embedded broker (Tansu) accepts a record over a topic's ``max.message.bytes`` (a 5,000-byte
record on a topic created with ``max.message.bytes=1000`` is stored), so the refusal is made
at the broker boundary instead: ``_SmallDeadLetterTopic`` wraps the real producer and fails a
too-large dead letter's delivery future with ``MessageSizeTooLargeError``, which is what
aiokafka's sender sets on a batch the broker answers ``MESSAGE_TOO_LARGE``; every other record,
and every letter that fits, goes to the real broker."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import ConsumerRecord

from tests.conftest import SettingsFactory
from tests.engine.test_faults import _Flaky
from tests.harness import engine_loop, loop_until
from tests.webhooks.support import read_topic
from worker.engine.broker_health import BrokerHealth
from worker.engine.consume_loop import ConsumeLoop
from worker.engine.dead_letter import MINIMAL_DETAIL, DeadLetterLost, dead_letter
from worker.engine.faults import Fault
from worker.engine.kafka import build_producer, ensure_topics
from worker.engine.writes import acknowledged, record_size
from worker.settings import Settings

POISON = b"p" * 5000


class _SmallDeadLetterTopic:
    """The real producer, but ``dlq``'s records over ``limit`` bytes are refused at their
    acknowledgement as the broker refuses them (``refused`` keeps their sizes)."""

    def __init__(self, producer: Any, dlq: str, limit: int) -> None:
        self._producer = producer
        self._dlq = dlq
        self._limit = limit
        self.refused: list[int] = []

    async def send(self, topic: str, value: bytes | None, **kw: Any) -> Any:
        size = record_size(value, kw.get("key"), kw.get("headers"))
        if topic == self._dlq and size > self._limit:
            self.refused.append(size)
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            future.set_exception(MessageSizeTooLargeError())
            return future
        return await self._producer.send(topic, value, **kw)


class _DeadLettering(_Flaky):
    """``_Flaky`` whose ``recover`` is a process's: the record to the DLQ, acknowledged."""

    def __init__(self, producer: Any, dlq: str) -> None:
        super().__init__({})
        self.producer = producer
        self.dlq = dlq

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        if msg.key == b"bad":
            raise RuntimeError("a bug that one record triggers")
        await super().handle(msg)

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        await super().recover(msg, fault)
        sent = await dead_letter(self.producer, self.dlq, msg, fault)
        await acknowledged(self.producer, BrokerHealth(name="test"), [sent])


@contextlib.asynccontextmanager
async def _running(
    make_settings: SettingsFactory, limit: int
) -> AsyncIterator[tuple[Settings, ConsumeLoop, asyncio.Task[None], _DeadLettering]]:
    """A consume loop over a one-partition topic holding a poison record of ``bad`` then a
    good record, whose handler dead-letters through a DLQ that refuses letters over
    ``limit`` bytes."""
    settings = make_settings(partitions=1)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    producer = build_producer(kafka)
    await producer.start()
    topic = settings.topics.commands
    await producer.send_and_wait(topic, POISON, key=b"bad")
    await producer.send_and_wait(topic, b"1", key=b"good")
    small = _SmallDeadLetterTopic(producer, settings.topics.dlq, limit)
    handler = _DeadLettering(small, settings.topics.dlq)
    try:
        async with engine_loop(kafka, settings, handler) as (loop, task):
            yield settings, loop, task, handler
    finally:
        await producer.stop()


def _committed(loop: ConsumeLoop, settings: Settings) -> int:
    tracker = loop.trackers.get(TopicPartition(settings.topics.commands, 0))
    return -1 if tracker is None or tracker.committed is None else tracker.committed


def _failures(loop: ConsumeLoop, outcome: str) -> float:
    value = loop.metrics.registry.get_sample_value(
        "passkey_auth_unit_failures_total", {"stage": "record", "outcome": outcome}
    )
    return value or 0.0


@pytest.mark.integration
async def test_a_refused_dead_letter_is_sent_again_in_its_minimal_form(
    make_settings: SettingsFactory,
) -> None:
    async with _running(make_settings, limit=2000) as (settings, loop, task, handler):
        await loop_until(lambda: _committed(loop, settings) == 2, task, 30)
        assert not task.done(), "the loop goes on"
        assert handler.handled == [("good", b"1")], "the next good record is processed"
        [refused] = handler.producer.refused
        assert refused > len(POISON), "the full letter was refused"
        assert _failures(loop, "dead_lettered") == 1
        assert _failures(loop, "dead_letter_lost") == 0

    [letter] = await read_topic(settings, settings.topics.dlq)
    headers = {k: v for k, v in letter.headers}
    assert (letter.key, letter.value) == (b"", b""), "no copy of the record"
    assert headers["dlq.source"] == f"{settings.topics.commands}:0:0".encode()
    assert headers["dlq.reason"] == b"handler_failed"
    assert headers["dlq.exception"] == b"RuntimeError"
    assert headers["dlq.detail"] == MINIMAL_DETAIL.encode()
    assert headers["dlq.truncated"] == b"key,value"
    assert headers["dlq.key_bytes"] == b"3"
    assert headers["dlq.key_sha256"] == hashlib.sha256(b"bad").hexdigest().encode()
    assert headers["dlq.value_bytes"] == str(len(POISON)).encode()
    assert headers["dlq.value_sha256"] == hashlib.sha256(POISON).hexdigest().encode()
    assert record_size(letter.value, letter.key, letter.headers) <= 2000


@pytest.mark.integration
async def test_a_dead_letter_refused_even_in_its_minimal_form_is_counted_and_let_go(
    make_settings: SettingsFactory,
) -> None:
    async with _running(make_settings, limit=100) as (settings, loop, task, handler):
        await loop_until(lambda: _committed(loop, settings) == 2, task, 30)
        assert not task.done(), "the loop goes on"
        assert handler.handled == [("good", b"1")]
        assert len(handler.producer.refused) == 2, "the full letter, then the minimal one"
        assert _failures(loop, "dead_letter_lost") == 1
        assert _failures(loop, "dead_lettered") == 0
    assert await read_topic(settings, settings.topics.dlq) == []


class _RefusingProducer:
    """A producer that refuses every record at hand-over, as aiokafka's does one over its
    ``max_request_size``."""

    async def send(self, topic: str, value: bytes | None, **kw: Any) -> Any:
        raise MessageSizeTooLargeError("over max_request_size")


async def test_a_letter_refused_at_hand_over_in_both_forms_is_lost_not_a_process_fault() -> None:
    msg: ConsumerRecord[bytes, bytes] = ConsumerRecord("t", 0, 7, 0, 0, b"k", b"v", None, 1, 1, [])
    producer = _RefusingProducer()
    sent = await dead_letter(producer, "dlq", msg, Fault("handler_failed", "boom"))
    with pytest.raises(DeadLetterLost):
        await acknowledged(producer, BrokerHealth(name="test"), [sent])
