"""The publication window: a query handled while its account's changed record is being sent
(its reply may be out already) waits until the store holds that record, then answers from it.
The executor over an in-memory store and a publisher that holds the send (the Kafka side is
covered by tests/auth/test_query.py and tests/api/test_read_your_writes.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from tests.harness import register_cmd
from worker.auth import execute
from worker.auth.execute import Executor
from worker.auth.flow import Decision, Policy
from worker.auth.metrics import WorkerMetrics
from worker.auth.provider import ProviderRegistry
from worker.auth.publish import Output
from worker.auth.store import StateStore
from worker.contract.messages import AccountRecord, GetAuthState, RegisterAccount
from worker.engine.home_partition import Router, home_partition

PARTITIONS = 3


class HeldPublisher:
    """Records what is published; a send of a changed record waits for ``release``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sending = asyncio.Event()
        self.replies: list[Any] = []

    async def publish(
        self, partition: int, decision: Decision, *, state_changed: bool, reply_to: int | None
    ) -> None:
        if state_changed:
            self.sending.set()
            await self.release.wait()
        if decision.reply is not None:
            self.replies.append(decision.reply)

    async def publish_all(self, partition: int, outputs: Sequence[Output]) -> None:
        for out in outputs:
            await self.publish(
                partition, out.decision, state_changed=out.state_changed, reply_to=out.reply_to
            )


def record(status: str, version: int) -> AccountRecord:
    return AccountRecord(
        account_id="acc_1",
        workspace_id="ws_a",
        status=status,
        auth_status=status,
        version=version,
        updated_at=1.0,
    )


def query_record(partition: int) -> ConsumerRecord[bytes, bytes]:
    cid = str(uuid.uuid4())
    value = GetAuthState(
        command_id=cid, request_id=f"req-{cid}", workspace_id="ws_a", account_id="acc_1"
    ).model_dump_json()
    return ConsumerRecord(
        "auth.commands", partition, 7, 0, 0, b"acc_1", value.encode(), None, 5, len(value), []
    )


def executor_over(store: StateStore, publisher: HeldPublisher) -> Executor:
    """An executor with no provider, publishing through ``publisher``."""
    return Executor(
        store=store,
        publisher=publisher,  # type: ignore[arg-type]
        providers=ProviderRegistry(),
        policy=Policy(providers=()),
        metrics=WorkerMetrics(CollectorRegistry()),
        router=Router("auth.commands", partitions_for_topic=lambda _: None, fallback=PARTITIONS),
    )


async def test_a_query_waits_for_the_window_then_reads_the_new_record() -> None:
    partition = home_partition(b"acc_1", PARTITIONS)
    store = StateStore()
    store.load(partition, {"acc_1": record("passkey_confirmation", 1)})
    publisher = HeldPublisher()
    executor = executor_over(store, publisher)
    msg = query_record(partition)
    assert executor.unordered(msg)
    before = store.get(partition, "acc_1")
    sent = record("passkey_confirmation_sent", 2)
    publishing = asyncio.create_task(
        executor._publish(partition, before, Decision(verdict="ok", record=sent))
    )
    await asyncio.wait_for(publisher.sending.wait(), 5)
    answering = asyncio.create_task(executor.handle(msg))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not answering.done() and publisher.replies == [], "answered inside the window"
    publisher.release.set()
    await asyncio.wait_for(asyncio.gather(publishing, answering), 5)
    (reply,) = publisher.replies
    assert reply.version == 2
    assert reply.body.data is not None
    assert reply.body.data.status == "passkey_confirmation_sent"


async def test_a_query_outside_any_window_answers_at_once() -> None:
    partition = home_partition(b"acc_1", PARTITIONS)
    store = StateStore()
    store.load(partition, {"acc_1": record("authorized", 4)})
    publisher = HeldPublisher()
    executor = executor_over(store, publisher)
    off_home = query_record((partition + 1) % PARTITIONS)
    assert not executor.unordered(off_home), "a query off its home partition keeps its lane"
    await asyncio.wait_for(executor.handle(query_record(partition)), 5)
    (reply,) = publisher.replies
    assert (reply.http_status, reply.version) == (200, 4)


async def test_a_query_run_aside_is_decoded_once_and_those_kept_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    partition = home_partition(b"acc_1", PARTITIONS)
    store = StateStore()
    store.load(partition, {"acc_1": record("authorized", 4)})
    publisher = HeldPublisher()
    executor = executor_over(store, publisher)
    msg = query_record(partition)
    assert executor.unordered(msg)
    assert [kept for kept, _ in executor._decoded.values()] == [msg]
    await asyncio.wait_for(executor.handle(msg), 5)
    assert executor._decoded == {}, "handed to handle, not kept"
    (reply,) = publisher.replies
    assert reply.version == 4
    monkeypatch.setattr(execute, "DECODED_KEPT", 2)
    asides = [query_record(partition) for _ in range(5)]
    assert all(executor.unordered(m) for m in asides)  # their asides never run
    assert 0 < len(executor._decoded) <= 2
    await asyncio.wait_for(executor.handle(asides[0]), 5)  # dropped: decoded again
    assert len(publisher.replies) == 2


async def test_a_record_a_batch_leaves_is_decoded_once() -> None:
    """A register goes to the per-record path (its headcount); ``handle`` takes the command
    the batch decoded instead of decoding the record again."""
    partition = home_partition(b"acc_1", PARTITIONS)
    publisher = HeldPublisher()
    publisher.release.set()  # nothing held here
    executor = executor_over(StateStore(), publisher)
    value = register_cmd("acc_1", "ref_1").model_dump_json()
    msg: ConsumerRecord[bytes, bytes] = ConsumerRecord(
        "auth.commands", partition, 8, 0, 0, b"acc_1", value.encode(), None, 5, len(value), []
    )
    left: list[tuple[list[Any], bool]] = []
    await executor.handle_batch([msg], lambda msgs, finished: left.append((msgs, finished)))
    assert left == [([msg], False)]
    [(kept, command)] = executor._decoded.values()
    assert kept is msg and isinstance(command, RegisterAccount)
    await asyncio.wait_for(executor.handle(msg), 5)
    assert executor._decoded == {}, "handed to handle, not kept"
