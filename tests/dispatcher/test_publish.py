"""``DeliveryPublisher.log_success`` (worker/dispatcher/publish.py): the entry of a delivery
settled in memory only goes in its endpoint's log window with its event's hold, which its
record's acknowledgement releases, never before; nobody waits for it but ``flush`` (what the
consume loop waits for before it commits) and, past ``LOG_UNACKED_MAX`` such entries under
way, the writer itself; a record not written keeps its holds, and a fault of the process is
raised by the next write (docs/architecture.md, "Webhook fan-out"). The log's windows and
records are the real publisher's; the Kafka boundary acknowledges when the test says."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError

from worker.contract.delivery_log import LOG_UNACKED_MAX, decode_log
from worker.dispatcher.delivery import DeliveryState, Finished, Pending
from worker.dispatcher.holds import EventHold
from worker.dispatcher.publish import DeliveryPublisher
from worker.engine.faults import ProcessFault
from worker.engine.offsets import HANDLING, Handling, Hold, OffsetTracker, hold_record

PARTITION = 2
TP = TopicPartition("auth.status", PARTITION)
WINDOW_S = 0.05


class Producer:
    """Each record's future is left for the test to settle (``ack``, ``refuse``)."""

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.futures: list[asyncio.Future[Any]] = []

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[Any]:
        self.values.append(value)
        self.futures.append(asyncio.get_running_loop().create_future())
        return self.futures[-1]

    def ack(self) -> None:
        for future in self.futures:
            if not future.done():
                future.set_result(None)

    def refuse(self, exc: BaseException) -> None:
        for future in self.futures:
            if not future.done():
                future.set_exception(exc)

    async def sent(self, count: int) -> None:
        for _ in range(100):
            if len(self.values) >= count:
                return
            await asyncio.sleep(WINDOW_S / 5)
        raise AssertionError(f"{len(self.values)} records sent, not {count}")


def held(tracker: OffsetTracker, offset: int) -> EventHold:
    """The hold of the event at ``offset``, taken as the consume loop's handler takes it."""
    tracker.dispatched(offset)
    token = HANDLING.set(Handling(deque(), TP, tracker, offset))
    try:
        hold: Hold | None = hold_record()
    finally:
        HANDLING.reset(token)
    assert hold is not None
    tracker.finished(offset)
    event = EventHold(hold, PARTITION)
    event.add("ep_1/acc_a")
    return event


def delivered(version: int) -> tuple[DeliveryState, Pending, Finished]:
    head = Pending(
        webhook_id=f"msg_{version}",
        event_type="auth.confirmed",
        event_id=f"evt_{version}",
        version=version,
        body="{}",
        occurred_at="2026-12-01T00:00:00.000Z",
        enqueued_at=1.0,
        next_attempt_at=1.0,
    )
    state = DeliveryState(endpoint_id="ep_1", account_id="acc_a", workspace_id="ws_a")
    done = Finished(
        webhook_id=head.webhook_id,
        event_type=head.event_type,
        version=version,
        attempts=1,
        state="delivered",
        last_status=204,
        finished_at=2.0,
    )
    return state, head, done


def publisher_of(producer: Producer, window_s: float = WINDOW_S) -> DeliveryPublisher:
    return DeliveryPublisher(
        producer,
        state_topic="webhook.delivery-state",
        log_topic="webhook.deliveries",
        dlq_topic="webhook.dlq",
        log_flush_s=window_s,
    )


def succeed(
    publisher: DeliveryPublisher, tracker: OffsetTracker, versions: range
) -> list[EventHold]:
    """Successes of one pair settled one after the other, none waited for."""
    holds = []
    for version in versions:
        holds.append(held(tracker, version))
        state, head, done = delivered(version)
        assert publisher.log_success(state, head, done, holds[-1]) is None
    return holds


async def test_a_success_releases_its_hold_once_its_record_is_acknowledged_not_before() -> None:
    producer = Producer()
    tracker = OffsetTracker()
    publisher = publisher_of(producer)
    holds = succeed(publisher, tracker, range(3))
    await producer.sent(1)

    assert len(producer.values) == 1, "the pair's three entries went out in one record"
    assert [e.webhook_id for e in decode_log(producer.values[0])] == ["msg_0", "msg_1", "msg_2"]
    assert not any(h.released for h in holds), "the record is not acknowledged yet"
    assert tracker.watermark() == 0, "so no offset of theirs may be committed"

    producer.ack()
    await publisher.flush()
    assert all(h.released for h in holds)
    assert tracker.watermark() == 3


async def test_flush_sends_the_open_windows_at_once_and_waits_for_their_acks() -> None:
    producer = Producer()
    tracker = OffsetTracker()
    publisher = publisher_of(producer, window_s=30.0)
    holds = succeed(publisher, tracker, range(2))
    flushing = asyncio.ensure_future(publisher.flush())
    await producer.sent(1)  # not 30 s later
    await asyncio.sleep(WINDOW_S)
    assert not flushing.done(), "it waits for the acknowledgement"
    producer.ack()
    await flushing
    assert all(h.released for h in holds)


async def test_a_record_not_written_keeps_its_holds_and_fails_nothing_else() -> None:
    """Its events stay uncommitted (read again, delivered again under the same webhook-id);
    a record refused for itself is no fault of the process: the next success goes on."""
    producer = Producer()
    tracker = OffsetTracker()
    publisher = publisher_of(producer)
    holds = succeed(publisher, tracker, range(2))
    await producer.sent(1)
    producer.refuse(MessageSizeTooLargeError())
    await publisher.flush()
    assert not any(h.released for h in holds)
    assert tracker.watermark() == 0

    later = succeed(publisher, tracker, range(2, 3))
    await producer.sent(2)
    producer.ack()
    await publisher.flush()
    assert later[0].released


async def test_a_fault_of_the_process_is_raised_by_the_next_success_and_by_flush() -> None:
    """Nobody waited for the failed record: the next writer (a pair's follow-up, which then
    ends the consume loop) and the loop's flush see the fault."""
    producer = Producer()
    tracker = OffsetTracker()
    publisher = publisher_of(producer)
    succeed(publisher, tracker, range(1))
    await producer.sent(1)
    producer.refuse(ProcessFault("fenced"))
    with pytest.raises(ProcessFault):
        await publisher.flush()
    state, head, done = delivered(1)
    with pytest.raises(ProcessFault):
        publisher.log_success(state, head, done, held(tracker, 1))


async def test_past_its_bound_of_entries_under_way_a_success_waits_for_its_record() -> None:
    producer = Producer()
    tracker = OffsetTracker()
    publisher = publisher_of(producer, window_s=30.0)
    succeed(publisher, tracker, range(LOG_UNACKED_MAX))  # each returned None: not waited for

    state, head, done = delivered(LOG_UNACKED_MAX)
    wait = publisher.log_success(state, head, done, held(tracker, LOG_UNACKED_MAX))
    assert wait is not None, "past the bound the writer waits"
    waiting = asyncio.ensure_future(wait)
    await producer.sent(LOG_UNACKED_MAX // 200)  # the full windows went out
    await asyncio.sleep(WINDOW_S)
    assert not waiting.done()
    flushing = asyncio.ensure_future(publisher.flush())
    await producer.sent(LOG_UNACKED_MAX // 200 + 1)
    producer.ack()
    await waiting
    await flushing
    assert tracker.watermark() == LOG_UNACKED_MAX + 1
