"""A fault about one record stays with it (docs/architecture.md, "Failure handling"): the
consume engine retries it, dead-letters it, and goes on; only a process fault ends the loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import ConsumerRecord

from tests.conftest import SettingsFactory
from tests.harness import bus, confirm_cmd, engine_loop, loop_until, register_cmd, running_worker
from tests.unparsable import produce_unparsable
from worker.auth import flow
from worker.auth.store import StateStore
from worker.engine.broker_health import BrokerOutageExceeded
from worker.engine.consume_loop import ConsumeLoop
from worker.engine.dead_letter import letter_parts
from worker.engine.faults import (
    Fault,
    ProcessFault,
    RecordRejected,
    fingerprint,
    is_permanent,
    is_process_fault,
)
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.tail import TopicTail
from worker.engine.writes import MAX_RECORD_BYTES, enqueue

# --- the rule -------------------------------------------------------------------------------


def test_process_faults_end_the_process_and_record_faults_do_not() -> None:
    assert is_process_fault(BrokerOutageExceeded("gone"))
    assert is_process_fault(ProcessFault("misconfigured"))
    assert is_process_fault(MemoryError())
    assert is_process_fault(KeyboardInterrupt())
    for exc in (KeyError("x"), RecursionError(), OverflowError(), ValueError(), TypeError()):
        assert not is_process_fault(exc)
    assert is_permanent(RecordRejected("too_large", "big"))
    assert is_permanent(RecursionError())
    assert not is_permanent(KeyError("x"))


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_one_bug_one_fingerprint_whatever_the_message() -> None:
    def boom(message: str) -> None:
        raise KeyError(message)

    def caught(message: str) -> BaseException:
        try:
            boom(message)
        except KeyError as exc:
            return exc
        raise AssertionError("not raised")

    assert fingerprint(caught("a")) == fingerprint(caught("b" * 1000))
    assert fingerprint(caught("a")) != fingerprint(_raised(KeyError("a")))
    assert len(fingerprint(caught("a"))) == 16


def test_a_fault_is_short_and_says_why() -> None:
    fault = Fault.of(_raised(ValueError("x" * 5000 + "\n" + "y")), attempts=3)
    assert fault.reason == "handler_failed"
    assert fault.exception == "ValueError"
    assert len(fault.detail) <= 300 and "\n" not in fault.detail
    rejected = Fault.of(_raised(RecordRejected("too_large", "a record of 2 MB")), attempts=1)
    assert rejected.reason == "output_too_large"
    assert rejected.detail == "a record of 2 MB"


def test_dead_letter_headers_keep_the_originals_and_drop_an_earlier_dead_letters() -> None:
    original = [("traceparent", b"tp"), ("dlq.reason", b"old"), ("reply.partition", b"2")]
    _, _, headers = letter_parts(
        b"k", b"v", original, Fault("invalid", "why"), ("auth.commands", 1, 9)
    )
    names = [k for k, _ in headers]
    assert names[:2] == ["traceparent", "reply.partition"]
    assert dict(headers)["dlq.reason"] == b"invalid"
    assert dict(headers)["dlq.source"] == b"auth.commands:1:9"
    assert names.count("dlq.reason") == 1
    # Original headers that would not fit beside the fault's are dropped, the fault's kept.
    huge = [("h", b"x" * 900_000)]
    _, _, squeezed = letter_parts(
        b"k", b"v", huge, Fault("invalid", "why"), ("t", 0, 0), room=100_000
    )
    assert squeezed[0][0] == "dlq.reason"


# --- the tails ----------------------------------------------------------------------------


class _PickyTail(TopicTail):
    """A read model that cannot apply records whose value is b"bad"."""

    def __init__(self) -> None:
        super().__init__(consumer=None, topic="t", name="picky")
        self.applied: list[bytes] = []

    def handle(self, records: list[Any]) -> None:
        for msg in records:
            if msg.value == b"bad":
                raise RecursionError("maximum recursion depth exceeded")
            self.applied.append(msg.value)


def test_a_read_model_skips_the_record_it_cannot_apply_and_keeps_the_rest() -> None:
    tail = _PickyTail()
    batch = [_record("k", b"a", 0), _record("k", b"bad", 1), _record("k", b"c", 2)]
    tail._take(TopicPartition("t", 0), batch)
    assert tail.skipped == 1
    assert tail.applied[-2:] == [b"a", b"c"]  # "a" may be applied twice: last write wins


class _Collecting(TopicTail):
    def __init__(self, consumer: Any, topic: str) -> None:
        super().__init__(consumer, topic, name="collecting")
        self.values: list[bytes] = []

    def handle(self, records: list[Any]) -> None:
        self.values += [r.value for r in records]


@pytest.mark.integration
async def test_a_tail_reads_past_a_record_the_client_cannot_parse(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(partitions=1)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    topic = settings.topics.status
    producer = build_producer(kafka)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"before", key=b"k", partition=0)
        await produce_unparsable(settings.bootstrap, topic, 0, "k")
        await producer.send_and_wait(topic, b"caught-up", key=b"k", partition=0)
        tail = _Collecting(build_consumer(kafka), topic)
        await tail.start()
        try:
            assert await tail.wait_caught_up(20)
            await produce_unparsable(settings.bootstrap, topic, 0, "k")  # while tailing
            await producer.send_and_wait(topic, b"after", key=b"k", partition=0)
            for _ in range(200):
                if b"after" in tail.values:
                    break
                await asyncio.sleep(0.05)
            assert tail.values == [b"before", b"caught-up", b"after"]
            assert tail.running
            assert tail.skipped == 2  # one met catching up, one while tailing
        finally:
            await tail.stop()
    finally:
        await producer.stop()


def _record(key: str, value: bytes | None, offset: int, partition: int = 0) -> Any:
    return ConsumerRecord(
        "t", partition, offset, 0, 0, key.encode(), value, None, len(key), len(value or b""), []
    )


# --- the engine over a real broker ----------------------------------------------------------


class _Flaky:
    """A handler that raises for keys it was told to, and records what it saw."""

    def __init__(self, raise_for: dict[str, BaseException]) -> None:
        self.store = StateStore()
        self.raise_for = raise_for
        self.attempts: dict[int, int] = {}
        self.handled: list[tuple[str, bytes]] = []
        self.recovered: list[tuple[str, int, Fault]] = []

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        key = msg.key.decode()
        self.attempts[msg.offset] = self.attempts.get(msg.offset, 0) + 1
        if key in self.raise_for and msg.value == b"poison":
            raise self.raise_for[key]
        self.handled.append((key, msg.value or b""))

    async def follow_up(self, partition: int, key: str) -> None:
        pass

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        self.recovered.append(((msg.key or b"").decode(), msg.offset, fault))

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        pass


#: In ``_loop``'s records: a record the Kafka client cannot parse (tests/unparsable.py).
UNPARSABLE = b"<unparsable>"


@contextlib.asynccontextmanager
async def _loop(
    make_settings: SettingsFactory, handler: _Flaky, records: list[tuple[str, bytes]]
) -> AsyncIterator[tuple[ConsumeLoop, asyncio.Task[None], Callable[[], int]]]:
    """A consume loop over a fresh one-partition topic holding ``records``; yields the loop,
    its task and a function reading the committed offset."""
    settings = make_settings(partitions=1)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    producer = build_producer(kafka)
    await producer.start()
    try:
        for key, value in records:
            if value is UNPARSABLE:
                topic = settings.topics.commands
                await produce_unparsable(settings.bootstrap, topic, 0, key)
            else:
                await producer.send_and_wait(settings.topics.commands, value, key=key.encode())
    finally:
        await producer.stop()
    tp = TopicPartition(settings.topics.commands, 0)
    async with engine_loop(kafka, settings, handler) as (loop, task):

        def offset() -> int:
            tracker = loop.trackers.get(tp)
            return -1 if tracker is None or tracker.committed is None else tracker.committed

        yield loop, task, offset


@pytest.mark.integration
async def test_a_record_that_raises_is_retried_then_dead_lettered_and_its_key_goes_on(
    make_settings: SettingsFactory,
) -> None:
    handler = _Flaky({"bad": RuntimeError("a bug that one record triggers")})
    records = [
        ("good", b"1"),
        ("bad", b"poison"),
        ("good", b"2"),
        ("bad", b"after"),  # the bad key's later record goes on, in order
        ("good", b"3"),
    ]
    async with _loop(make_settings, handler, records) as (loop, task, committed):
        await loop_until(lambda: committed() == 5, task, 30)
        assert not task.done()
        assert [v for k, v in handler.handled if k == "good"] == [b"1", b"2", b"3"]
        assert [v for k, v in handler.handled if k == "bad"] == [b"after"]
        [(key, offset, fault)] = handler.recovered
        assert (key, offset) == ("bad", 1)
        assert handler.attempts[1] == loop.config.record_attempts == fault.attempts
        assert fault.reason == "handler_failed"
        assert fault.exception == "RuntimeError"
        assert "a bug that one record triggers" in fault.detail
        failures = loop.metrics.unit_failures
        assert failures.labels("record", "retried")._value.get() == loop.config.record_attempts - 1
        assert failures.labels("record", "dead_lettered")._value.get() == 1


@pytest.mark.integration
async def test_a_record_the_client_cannot_parse_is_dead_lettered_by_offset(
    make_settings: SettingsFactory,
) -> None:
    """aiokafka raises on every fetch that covers a record whose header key is not UTF-8:
    the loop reads past it, dead-letters it by offset, and its neighbours are handled."""
    handler = _Flaky({})
    records = [("a", b"1"), ("b", UNPARSABLE), ("a", b"2"), ("c", b"3")]
    async with _loop(make_settings, handler, records) as (_, task, committed):
        await loop_until(lambda: committed() == 4, task, 30)
        assert [v for _, v in handler.handled] == [b"1", b"2", b"3"]
        [(key, offset, fault)] = handler.recovered
        assert (key, offset) == ("", 1)  # its key could not be read either
        assert fault.reason == "unreadable"
        assert "UnicodeDecodeError" in fault.detail


@pytest.mark.integration
async def test_a_rejected_output_is_not_retried(make_settings: SettingsFactory) -> None:
    handler = _Flaky({"big": RecordRejected("too_large", "a record of 2000000 bytes")})
    async with _loop(make_settings, handler, [("big", b"poison"), ("ok", b"1")]) as (
        _,
        task,
        committed,
    ):
        await loop_until(lambda: committed() == 2, task, 30)
        [(_, _, fault)] = handler.recovered
        assert handler.attempts[0] == 1
        assert fault.reason == "output_too_large"


@pytest.mark.integration
async def test_a_process_fault_still_ends_the_loop(make_settings: SettingsFactory) -> None:
    handler = _Flaky({"k": BrokerOutageExceeded("the cluster is gone")})
    async with _loop(make_settings, handler, [("k", b"poison")]) as (_, task, committed):
        with pytest.raises(RuntimeError, match="consume loop failed"):
            await asyncio.wait_for(task, 30)
        assert isinstance(task.exception().__cause__, BrokerOutageExceeded)  # type: ignore[union-attr]
        assert committed() <= 0  # never committed past the record
        assert handler.recovered == []


@pytest.mark.integration
async def test_an_oversized_record_is_refused_before_it_reaches_the_broker(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(partitions=1)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    producer = build_producer(kafka)
    await producer.start()
    try:
        with pytest.raises(RecordRejected) as refused:
            await enqueue(producer, settings.topics.status, b"x" * (MAX_RECORD_BYTES + 1), key=b"k")
        assert refused.value.reason == "too_large"
        # The producer's own refusal (over its max_request_size) becomes the same fault.
        small = build_producer(kafka, max_request_size=1000)
        await small.start()
        try:
            with pytest.raises(RecordRejected) as rejected:
                await enqueue(small, settings.topics.status, b"x" * 5000, key=b"k")
            assert isinstance(rejected.value.__cause__, MessageSizeTooLargeError)
        finally:
            await small.stop()
    finally:
        await producer.stop()


# --- the worker: a command whose handling raises ----------------------------------------


@pytest.mark.integration
async def test_a_command_whose_handling_raises_is_answered_500_and_dead_lettered(
    make_settings: SettingsFactory, simulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug that one account's command triggers: that command's caller gets a catalogued
    500 (no timeout), the command lands in auth.dlq with the exception and fingerprint, and
    the other accounts of the same partition are served."""
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=1)

    def decide(record: Any, command: Any, **kw: Any) -> Any:
        if command.account_id == "acc_cursed" and command.type == "passkey_confirm":
            raise ZeroDivisionError("a decision bug")
        return flow.decide(record, command, **kw)

    monkeypatch.setattr("worker.auth.execute.decide", decide)
    async with bus(settings) as b, running_worker(settings) as running:
        for acc in ("acc_cursed", "acc_fine"):
            await b.send(register_cmd(acc, f"sim-ok-{acc}"))
        cursed, fine = confirm_cmd("acc_cursed"), confirm_cmd("acc_fine")
        await b.send(cursed)
        await b.send(fine)
        assert (await b.reply_to(fine.command_id))["http_status"] == 200
        reply = await b.reply_to(cursed.command_id)
        assert reply["http_status"] == 500
        assert reply["body"]["error"]["code"] == "run_auth_action_failed"
        assert reply["body"]["request_id"] == cursed.request_id
        await b.wait_for(lambda: bool(b.raw.get(settings.topics.dlq)))
        [(key, value, headers)] = b.raw[settings.topics.dlq]
        named = dict(headers)
        assert key == b"acc_cursed"
        assert value == cursed.model_dump_json().encode()
        assert named["dlq.reason"] == b"handler_failed"
        assert named["dlq.exception"] == b"ZeroDivisionError"
        assert named["dlq.attempts"] == b"3"
        assert len(named["dlq.fingerprint"]) == 16
        await b.wait_for(lambda: bool(b.errors(command_id=cursed.command_id)))
        # The account is not stuck: its next command is decided as usual.
        monkeypatch.setattr("worker.auth.execute.decide", flow.decide)
        again = confirm_cmd("acc_cursed")
        await b.send(again)
        assert (await b.reply_to(again.command_id))["http_status"] == 200
        assert not running.task.done()
