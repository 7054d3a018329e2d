"""Long-polls parked by the owner (worker.auth.waits; docs/architecture.md, "Long-polls"): the
handler parks and returns, the decision that stores the next version answers, the wait's timer
answers with the state as it is, and the caps, a revocation and the stop answer at once. The
executor over an in-memory store and a publisher that records what it sends (the Kafka side
is tests/api/test_long_poll.py)."""

from __future__ import annotations

import asyncio
import itertools
import math
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from worker.auth.execute import Executor
from worker.auth.flow import Decision, Policy
from worker.auth.metrics import WorkerMetrics
from worker.auth.provider import ProviderRegistry
from worker.auth.publish import Output
from worker.auth.store import StateStore
from worker.auth.waits import WaitLimits
from worker.contract.messages import AccountRecord, GetAuthState
from worker.engine.home_partition import REPLY_PARTITION, Router, home_partition

PARTITIONS = 3


class Recorder:
    """Records each reply published; a changed record's send waits for ``release`` while
    ``hold`` is set."""

    def __init__(self) -> None:
        self.replies: list[tuple[Any, int | None]] = []
        self.batches: list[int] = []
        self.hold = False
        self.release = asyncio.Event()
        self.sending = asyncio.Event()
        self.answered = asyncio.Event()

    async def publish(
        self, partition: int, decision: Decision, *, state_changed: bool, reply_to: int | None
    ) -> None:
        if state_changed and self.hold:
            self.sending.set()
            await self.release.wait()
        if decision.reply is not None:
            self.replies.append((decision.reply, reply_to))
            self.answered.set()

    async def answer(self, answers: Sequence[tuple[Decision, int | None]]) -> None:
        """The parked waits' answers: each call is one batch."""
        self.batches.append(len(answers))
        self.replies.extend((decision.reply, to) for decision, to in answers)
        self.answered.set()

    async def publish_all(self, partition: int, outputs: Sequence[Output]) -> None:
        for out in outputs:
            await self.publish(
                partition, out.decision, state_changed=out.state_changed, reply_to=out.reply_to
            )


def record(status: str, version: int, *, account: str = "acc_1", ws: str = "ws_a") -> AccountRecord:
    return AccountRecord(
        account_id=account,
        workspace_id=ws,
        status=status,
        auth_status=status,
        version=version,
        updated_at=1.0,
    )


def query(
    *,
    account: str = "acc_1",
    ws: str = "ws_a",
    after: int | None = None,
    wait_ms: int | None = 30_000,
) -> ConsumerRecord[bytes, bytes]:
    cid = str(uuid.uuid4())
    value = GetAuthState(
        command_id=cid,
        request_id=f"req-{cid}",
        workspace_id=ws,
        account_id=account,
        after_version=after,
        wait_ms=wait_ms,
    ).model_dump_json()
    partition = home_partition(account.encode(), PARTITIONS)
    headers = [(REPLY_PARTITION, b"2")]
    return ConsumerRecord(
        "auth.commands", partition, 7, 0, 0, account.encode(), value.encode(), None, 5, 0, headers
    )


def setup(
    *records: AccountRecord, limits: WaitLimits | None = None
) -> tuple[Executor, StateStore, Recorder, WorkerMetrics]:
    store = StateStore()
    by_partition: dict[int, dict[str, AccountRecord]] = {}
    for r in records:
        by_partition.setdefault(home_partition(r.account_id.encode(), PARTITIONS), {})[
            r.account_id
        ] = r
    for partition, held in by_partition.items():
        store.load(partition, held)
    recorder = Recorder()
    metrics = WorkerMetrics(CollectorRegistry())
    executor = Executor(
        store=store,
        publisher=recorder,  # type: ignore[arg-type]
        providers=ProviderRegistry(),
        policy=Policy(providers=()),
        metrics=metrics,
        router=Router("auth.commands", partitions_for_topic=lambda _: None, fallback=PARTITIONS),
        wait_limits=limits,
    )
    return executor, store, recorder, metrics


def ended(metrics: WorkerMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "passkey_auth_parked_waits_ended_total", {"reason": reason}
    )
    return value or 0.0


def parked(metrics: WorkerMetrics) -> float:
    return metrics.registry.get_sample_value("passkey_auth_parked_waits") or 0.0


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_parked_query_returns_at_once_and_the_next_version_answers_it() -> None:
    executor, store, recorder, metrics = setup(record("passkey_confirmation", 1))
    msg = query(after=1)
    partition = msg.partition
    await asyncio.wait_for(executor.handle(msg), 5)  # the handler does not wait
    assert recorder.replies == [] and parked(metrics) == 1
    before = store.get(partition, "acc_1")
    sent = record("passkey_confirmation_sent", 2)
    await executor._publish(partition, before, Decision(verdict="ok", record=sent))
    await settle()
    ((reply, reply_to),) = recorder.replies
    assert (reply.http_status, reply.version, reply_to) == (200, 2, 2)
    assert reply.body.data.status == "passkey_confirmation_sent"
    assert parked(metrics) == 0 and ended(metrics, "changed") == 1
    assert executor.waits.waits == {} and executor.waits.admission.in_use == 0


async def test_a_change_that_does_not_pass_the_version_leaves_the_wait_parked() -> None:
    """Asked with a version it has not reached yet (a caller ahead of this owner's view): the
    wait stays until the account passes it."""
    executor, store, recorder, metrics = setup(record("passkey_confirmation", 1))
    msg = query(after=2)
    await executor.handle(msg)
    before = store.get(msg.partition, "acc_1")
    two = record("passkey_confirmation_sent", 2)
    await executor._publish(msg.partition, before, Decision(verdict="ok", record=two))
    await settle()
    assert recorder.replies == [] and parked(metrics) == 1
    three = record("authorized", 3)
    await executor._publish(msg.partition, two, Decision(verdict="ok", record=three))
    await settle()
    ((reply, _),) = recorder.replies
    assert (reply.version, reply.body.data.status) == (3, "authorized")


async def test_nothing_to_wait_for_answers_after_the_wait_with_the_same_version() -> None:
    executor, _, recorder, metrics = setup(record("passkey_confirmation", 4))
    await executor.handle(query(after=4, wait_ms=50))
    assert recorder.replies == []
    await asyncio.wait_for(recorder.answered.wait(), 5)
    ((reply, _),) = recorder.replies
    assert (reply.http_status, reply.version) == (200, 4)
    assert ended(metrics, "timeout") == 1 and parked(metrics) == 0


async def test_without_after_version_it_waits_past_the_version_held_now() -> None:
    executor, store, recorder, _ = setup(record("passkey_confirmation", 3))
    msg = query(after=None)
    await executor.handle(msg)
    assert recorder.replies == []
    four = record("passkey_confirmation_sent", 4)
    await executor._publish(msg.partition, store.get(msg.partition, "acc_1"), Decision("ok", four))
    await settle()
    assert [r.version for r, _ in recorder.replies] == [4]


async def test_a_version_already_passed_a_plain_query_and_an_unknown_account_answer_at_once() -> (
    None
):
    executor, _, recorder, metrics = setup(record("authorized", 5))
    await executor.handle(query(after=4))
    await executor.handle(query(wait_ms=None))
    await executor.handle(query(wait_ms=0))
    await executor.handle(query(account="acc_unknown"))
    await executor.handle(query(ws="ws_b"))  # another workspace's: 404, like an unknown one
    assert [(r.http_status, r.version) for r, _ in recorder.replies] == [
        (200, 5),
        (200, 5),
        (200, 5),
        (404, None),
        (404, None),
    ]
    assert parked(metrics) == 0 and sum(ended(metrics, r) for r in ("cap", "stop")) == 0


async def test_a_timeout_inside_the_accounts_publication_window_answers_once_it_is_stored() -> None:
    """Read-your-writes: the wait's time running out while the account's changed record is
    being sent (its reply may be out already) does not answer with the older state."""
    executor, store, recorder, _ = setup(record("passkey_confirmation", 1))
    msg = query(after=1, wait_ms=20)
    await executor.handle(msg)
    recorder.hold = True
    two = record("passkey_confirmation_sent", 2)
    publishing = asyncio.create_task(
        executor._publish(msg.partition, store.get(msg.partition, "acc_1"), Decision("ok", two))
    )
    await asyncio.wait_for(recorder.sending.wait(), 5)
    await asyncio.sleep(0.1)  # the wait's 20 ms are up while the record is being sent
    assert recorder.replies == []
    recorder.release.set()
    await asyncio.wait_for(publishing, 5)
    await settle()
    ((reply, _),) = recorder.replies
    assert reply.version == 2


async def test_past_the_account_cap_a_long_poll_is_answered_at_once() -> None:
    limits = WaitLimits(process=100, per_workspace=50, per_account=2)
    executor, _, recorder, metrics = setup(record("passkey_confirmation", 1), limits=limits)
    for _ in range(3):
        await executor.handle(query(after=1))
    ((reply, _),) = recorder.replies
    assert (reply.http_status, reply.version) == (200, 1)
    assert parked(metrics) == 2 and ended(metrics, "cap") == 1


async def test_past_the_workspace_cap_answered_at_once_and_another_workspace_still_parks() -> None:
    limits = WaitLimits(process=10, per_workspace=2, per_account=64)
    accounts = [record("passkey_confirmation", 1, account=f"acc_{i}") for i in range(3)]
    theirs = record("passkey_confirmation", 1, account="acc_b", ws="ws_b")
    executor, _, recorder, metrics = setup(*accounts, theirs, limits=limits)
    for i in range(3):
        await executor.handle(query(account=f"acc_{i}", after=1))
    await executor.handle(query(account="acc_b", ws="ws_b", after=1))
    assert [r.account_id for r, _ in recorder.replies] == ["acc_2"]
    assert parked(metrics) == 3 and ended(metrics, "cap") == 1
    assert executor.waits.admission.held("ws_a") == 2
    assert executor.waits.admission.held("ws_b") == 1


async def test_past_the_process_cap_answered_at_once() -> None:
    limits = WaitLimits(process=3, per_workspace=3, per_account=64)
    accounts = [
        record("passkey_confirmation", 1, account=f"acc_{i}", ws=f"ws_{i}") for i in range(4)
    ]
    executor, _, recorder, metrics = setup(*accounts, limits=limits)
    for i in range(4):
        await executor.handle(query(account=f"acc_{i}", ws=f"ws_{i}", after=1))
    assert [r.account_id for r, _ in recorder.replies] == ["acc_3"]
    assert parked(metrics) == 3 and ended(metrics, "cap") == 1


async def test_a_revoked_partition_answers_its_waits_with_the_current_state() -> None:
    mine = record("passkey_confirmation_sent", 2)
    executor, store, recorder, metrics = setup(mine)
    msg = query(after=2)
    await executor.handle(msg)
    await executor.handle(query(after=2))
    other = (msg.partition + 1) % PARTITIONS
    store.drop(other)  # another partition: nothing to answer
    await settle()
    assert recorder.replies == []
    store.drop(msg.partition)  # what the consume loop does with a revoked partition
    await settle()
    assert [(r.http_status, r.version) for r, _ in recorder.replies] == [(200, 2), (200, 2)]
    assert ended(metrics, "revoked") == 2 and parked(metrics) == 0
    assert executor.waits.waits == {} and executor.waits.admission.in_use == 0


async def test_the_stop_answers_every_wait_and_then_parks_none() -> None:
    executor, _, recorder, metrics = setup(
        record("passkey_confirmation", 1), record("authorized", 7, account="acc_2")
    )
    await executor.handle(query(after=1))
    await executor.handle(query(account="acc_2", after=7))
    await asyncio.wait_for(executor.waits.close(), 5)  # returns once the answers are sent
    assert sorted((r.account_id, r.version) for r, _ in recorder.replies) == [
        ("acc_1", 1),
        ("acc_2", 7),
    ]
    assert ended(metrics, "stop") == 2 and parked(metrics) == 0
    await executor.handle(query(after=1))  # after the stop: answered at once
    assert len(recorder.replies) == 3 and ended(metrics, "stop") == 3


async def test_a_slot_is_held_until_the_answer_is_sent() -> None:
    """The background answers are bounded by the caps: a wait's slot is given back only once
    its answer is acknowledged."""
    executor, store, _, _ = setup(record("passkey_confirmation", 1))
    gate = asyncio.Event()
    sent: list[int] = []

    class Slow:
        async def answer(self, answers: Sequence[tuple[Decision, int | None]]) -> None:
            await gate.wait()
            sent.extend(to or 0 for _, to in answers)

    executor.waits.publisher = Slow()  # type: ignore[assignment]
    msg = query(after=1)
    await executor.handle(msg)
    two = record("passkey_confirmation_sent", 2)
    await executor._publish(msg.partition, store.get(msg.partition, "acc_1"), Decision("ok", two))
    await settle()
    assert executor.waits.waits == {} and executor.waits.admission.in_use == 1
    assert len(executor.waits.sends) == 1
    gate.set()
    await asyncio.wait_for(asyncio.gather(*executor.waits.sends), 5)
    assert sent and executor.waits.admission.in_use == 0 and not executor.waits.sends


async def test_time_outs_due_within_one_slot_are_answered_together_never_early() -> None:
    """Twenty waits of 2 s parked 8 ms apart: their time-outs fall in a few slots (0.2 s
    apart, a tenth of the wait), each slot answered in one pass, each wait no earlier than its
    own 2 s and at most one slot late; the slots go with their waits. One timer per wait
    answered them in twenty passes."""
    accounts = [f"acc_{n}" for n in range(20)]
    executor, _, recorder, metrics = setup(
        *(record("passkey_confirmation", 1, account=a) for a in accounts)
    )
    loop = asyncio.get_running_loop()
    answered_at: list[float] = []
    answer = recorder.answer

    async def stamped(answers: Sequence[tuple[Decision, int | None]]) -> None:
        answered_at.extend(loop.time() for _ in answers)
        await answer(answers)

    recorder.answer = stamped  # type: ignore[method-assign]
    parked_at: list[float] = []
    for account in accounts:
        parked_at.append(loop.time())
        await executor.handle(query(account=account, after=1, wait_ms=2000))
        await asyncio.sleep(0.008)
    slots = len(executor.waits.slots)
    assert 1 <= slots <= 1 + (parked_at[-1] - parked_at[0]) / 0.2 + 1
    for _ in range(500):
        if len(recorder.replies) == len(accounts):
            break
        await asyncio.sleep(0.01)
    assert len(recorder.replies) == len(accounts) and ended(metrics, "timeout") == len(accounts)
    times = sorted(answered_at)
    passes = 1 + sum(b - a > 0.003 for a, b in itertools.pairwise(times))
    assert passes <= slots < len(accounts), "one pass per slot"
    assert len(recorder.batches) <= slots, "a slot's answers sent by one task, one call"
    assert min(answered_at) >= parked_at[0] + 2.0, "never before its wait"
    assert max(answered_at) <= parked_at[-1] + 2.0 + 0.2 + 0.5  # one slot late, and room
    assert executor.waits.slots == {} and parked(metrics) == 0


async def test_the_slots_are_a_tenth_of_the_wait_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A time-out may come a tenth of its wait late: at ``wait_s`` 30 waits due 0.5 s and
    2.5 s after a first share its 3 s slot (one timer, one pass, one send); at 5 s the slots
    are 0.5 s apart, and waits due 0.6 s apart across a boundary do not share one. The clock
    is read as set, so no wait is timed."""
    accounts = [f"acc_{n}" for n in range(5)]
    executor, store, recorder, _ = setup(
        *(record("passkey_confirmation", 1, account=a) for a in accounts)
    )
    loop = asyncio.get_running_loop()
    waits = executor.waits

    def park_at(at: float, account: str, wait_ms: int) -> None:
        msg = query(account=account, after=1, wait_ms=wait_ms)
        parsed = GetAuthState.model_validate_json(msg.value)
        with monkeypatch.context() as patch:
            patch.setattr(loop, "time", lambda: at)
            assert waits.park(msg.partition, parsed, store.get(msg.partition, account), 2)

    async def run_slots() -> None:
        for due in sorted(waits.slots):
            waits.slots[due][1].cancel()
            waits._slot_due(due)  # the slot's timer, run now: one pass
            await settle()

    past_boundary = math.floor(loop.time() / 3) * 3 + 3.25
    for offset, account in zip((0.0, 0.5, 2.5), accounts, strict=False):
        park_at(past_boundary + offset, account, 30_000)
    assert len(waits.slots) == 1, "due within 3 s, one slot at wait_s 30"
    await run_slots()
    assert recorder.batches == [3], "one pass, one send"
    boundary = math.floor(loop.time() / 0.5) * 0.5 + 1.0
    park_at(boundary - 0.3, accounts[3], 5_000)
    park_at(boundary + 0.3, accounts[4], 5_000)
    assert len(waits.slots) == 2, "a slot at wait_s 5 is 0.5 s wide"
    await run_slots()
    assert recorder.batches == [3, 1, 1] and waits.slots == {}


async def test_a_wait_answered_by_its_change_leaves_its_slot_and_the_last_one_frees_it() -> None:
    executor, store, recorder, _ = setup(
        record("passkey_confirmation", 1), record("passkey_confirmation", 1, account="acc_2")
    )
    one, two = query(after=1, wait_ms=30_000), query(account="acc_2", after=1, wait_ms=30_000)
    await executor.handle(one)
    await executor.handle(two)
    ((waits, _),) = executor.waits.slots.values()  # both in the one 3 s slot
    assert len(waits) == 2
    for msg, account in ((one, "acc_1"), (two, "acc_2")):
        before = store.get(msg.partition, account)
        sent = record("passkey_confirmation_sent", 2, account=account)
        await executor._publish(msg.partition, before, Decision(verdict="ok", record=sent))
        await settle()
    assert [r.version for r, _ in recorder.replies] == [2, 2]
    assert executor.waits.slots == {}, "no timer left for waits already answered"


async def test_a_slots_time_outs_leave_in_one_task_and_one_acknowledged_send() -> None:
    """Twelve waits of one slot: one answer task, one ``answer`` call carrying all twelve
    (handed over together, one acknowledgement wait), each slot held until it returns."""
    accounts = [f"acc_{n}" for n in range(12)]
    executor, _, recorder, metrics = setup(
        *(record("passkey_confirmation", 1, account=a) for a in accounts)
    )
    for account in accounts:
        await executor.handle(query(account=account, after=1, wait_ms=30_000))
    ((waits, _),) = executor.waits.slots.values()
    assert len(waits) == len(accounts)
    gate = asyncio.Event()
    answer = recorder.answer

    async def held(answers: Sequence[tuple[Decision, int | None]]) -> None:
        await gate.wait()
        await answer(answers)

    recorder.answer = held  # type: ignore[method-assign]
    (due,) = executor.waits.slots
    executor.waits.slots[due][1].cancel()
    executor.waits._slot_due(due)  # the slot's timer, run now
    await settle()
    assert len(executor.waits.sends) == 1, "one task for the slot's answers"
    assert executor.waits.admission.in_use == len(accounts), "held until acknowledged"
    gate.set()
    await asyncio.wait_for(asyncio.gather(*executor.waits.sends), 5)
    assert recorder.batches == [len(accounts)] and ended(metrics, "timeout") == len(accounts)
    assert sorted(r.account_id for r, _ in recorder.replies) == sorted(accounts)
    assert {to for _, to in recorder.replies} == {2} and executor.waits.admission.in_use == 0
