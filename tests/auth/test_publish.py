"""The worker's outputs (``worker.auth.publish``): a reply is never handed to the producer
before its state record is acknowledged (read-your-writes, docs/architecture.md "Guarantees"),
a command returns only once all its outputs are acknowledged, and a record that cannot be sent
fails only its own command. A producer that holds every acknowledgement until the test
releases it (the Kafka side is covered by tests/auth/test_worker.py and
tests/api/test_read_your_writes.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from worker.auth.flow import Decision, reply
from worker.auth.publish import Publisher
from worker.contract.messages import AccountRecord, AuthData
from worker.contract.topics import Topics
from worker.engine.faults import RecordRejected
from worker.engine.writes import MAX_RECORD_BYTES


class HeldProducer:
    """Notes every hand-over; each acknowledgement waits for ``ack``."""

    def __init__(self) -> None:
        self.handed: list[tuple[str, bytes | None]] = []
        self.pending: list[asyncio.Future[Any]] = []
        self.partitions: list[int | None] = []

    async def send(
        self, topic: str, value: bytes | None, *, partition: int | None = None, **_: Any
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.handed.append((topic, value))
        self.partitions.append(partition)
        self.pending.append(future)
        return future

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2}

    def ack(self) -> int:
        """Acknowledge everything handed over so far; how many."""
        n = len(self.pending)
        for future in self.pending:
            if not future.done():  # a waiter's cancellation may have cancelled it
                future.set_result("ack")
        self.pending = []
        return n

    def topics(self) -> list[str]:
        return [topic for topic, _ in self.handed]


def decision(account_id: str, *, answered: bool = True, extra: int = 0) -> Decision:
    """A changed record (``extra`` bytes more of it) and, if ``answered``, the reply."""
    record = AccountRecord(
        account_id=account_id,
        workspace_id="ws_a" + "x" * extra,
        status="verified",
        auth_status="verified",
        version=2,
        updated_at=1.0,
    )
    answer = reply(
        AuthData(account_id=account_id, status="verified", auth_status="verified"),
        command_id=f"cmd-{account_id}",
        request_id=f"req-{account_id}",
        account_id=account_id,
        http_status=200,
    )
    return Decision(verdict="ok", record=record, reply=answer if answered else None)


async def settle() -> None:
    """Let every task run until it waits on the producer."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_states_are_acknowledged_before_replies_are_sent() -> None:
    producer = HeldProducer()
    publisher = Publisher(producer, Topics())
    first, second = (
        asyncio.create_task(publisher.publish(0, decision(a), state_changed=True, reply_to=1))
        for a in ("acc_1", "acc_2")
    )
    await settle()
    assert producer.topics() == ["auth.state", "auth.state"], "no reply before its state's ack"
    assert producer.ack() == 2
    await settle()
    assert producer.topics()[2:] == ["auth.replies", "auth.replies"]
    assert not first.done() and not second.done(), "a command returns once all is acknowledged"
    assert producer.ack() == 2
    await asyncio.wait_for(asyncio.gather(first, second), 5)


async def test_a_record_too_large_fails_its_own_command_only() -> None:
    producer = HeldProducer()
    publisher = Publisher(producer, Topics())
    big = asyncio.create_task(
        publisher.publish(0, decision("acc_1", extra=MAX_RECORD_BYTES), state_changed=True)
    )
    fine = asyncio.create_task(publisher.publish(0, decision("acc_2"), state_changed=True))
    await settle()
    with pytest.raises(RecordRejected):
        await asyncio.wait_for(big, 5)
    assert producer.topics() == ["auth.state"], "the other command's state is sent"
    producer.ack()
    await settle()
    assert producer.topics() == ["auth.state", "auth.replies"]
    producer.ack()
    await asyncio.wait_for(fine, 5)


async def test_a_cancelled_command_sends_nothing_more() -> None:
    producer = HeldProducer()
    publisher = Publisher(producer, Topics())
    task = asyncio.create_task(publisher.publish(0, decision("acc_1"), state_changed=True))
    await settle()
    task.cancel()
    producer.ack()
    await settle()
    assert producer.topics() == ["auth.state"], "its reply is not sent for a caller gone"
    assert task.cancelled()


async def test_answers_are_all_handed_over_before_one_acknowledgement_wait() -> None:
    """A slot's time-out answers (``Publisher.answer``): every reply handed to the producer at
    once, each to its reply partition (a partition auth.replies lacks: by key), and the call
    returns only once all are acknowledged."""
    producer = HeldProducer()
    publisher = Publisher(producer, Topics())
    answers = [(decision(f"acc_{n}"), n) for n in (0, 1, 2, 7)]
    sent = asyncio.create_task(publisher.answer(answers))
    await settle()
    assert producer.topics() == ["auth.replies"] * 4, "all handed over before any ack"
    assert producer.partitions == [0, 1, 2, None]
    assert not sent.done()
    assert producer.ack() == 4
    await asyncio.wait_for(sent, 5)
