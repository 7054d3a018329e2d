"""A fetched batch is the dispatcher's unit of attempts (``Dispatcher.follow_up``): the due pairs
of one endpoint in one partition are attempted by one lane, each asking the endpoint gate in
turn, and the outcomes that end together are written with one state write. Over the in-memory
set-up of ``test_instrumentation`` (a sender that answers as told, a publisher that notes its
calls)."""

from __future__ import annotations

import asyncio

from tests.dispatcher.test_instrumentation import PARTITION, AnsweringSender, Setup, event_message
from worker.dispatcher.endpoint_gate import GateConfig
from worker.dispatcher.sender import DeliveryResult


async def test_pairs_of_one_endpoint_taken_in_together_are_attempted_by_one_lane() -> None:
    s = Setup()
    keys = [await s.dispatcher.handle(event_message(f"acc_{i}")[0]) for i in range(3)]
    assert keys == [["ep_1/acc_0"], [], []], "the first opens the batch, the others join it"
    s.publisher.calls.clear()

    await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, "ep_1/acc_0"), 5)

    assert len(s.sender.urls) == 3
    assert s.publisher.what() == ["send_states"] + ["log_finished"] * 3, "one state write"
    assert len(s.store) == 0 and not s.store.batches
    assert not any(s.store.claimed(k) for k in ("ep_1/acc_0", "ep_1/acc_1", "ep_1/acc_2"))
    assert s.value("passkey_webhook_delivery_latency_seconds_count") == 3


async def test_retries_that_end_together_are_written_together() -> None:
    s = Setup(sender=AnsweringSender(500))
    for i in range(3):
        await s.dispatcher.handle(event_message(f"acc_new_{i}")[0])
    s.publisher.calls.clear()
    await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, "ep_1/acc_new_0"), 5)

    assert s.publisher.what() == ["send_states"] + ["log_retry"] * 3
    assert s.value("passkey_webhook_retries_scheduled_total") == 3
    assert all(s.store.timers.live[f"ep_1/acc_new_{i}"][0] > 0 for i in range(3)), "armed"


class HeldSender(AnsweringSender):
    """Answers once let go, noting how many posts are under way at most."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.now = 0
        self.most = 0

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult:
        self.now += 1
        self.most = max(self.most, self.now)
        await self.go.wait()
        self.now -= 1
        return await super().post(url, body, headers)


async def test_a_pair_refused_a_slot_waits_in_its_batch_for_the_one_it_frees() -> None:
    s = Setup()
    sender = HeldSender()
    s.sender = sender
    s.dispatcher._sender = sender
    s.dispatcher.gate.config = GateConfig(max_in_flight=1)
    for i in range(2):
        await s.dispatcher.handle(event_message(f"acc_{i}")[0])

    run = asyncio.create_task(s.dispatcher.follow_up(PARTITION, "ep_1/acc_0"))
    await asyncio.sleep(0.05)
    assert sender.now == 1 and s.dispatcher.gate.waiting("ep_1") == 1, "one in flight, one in line"
    assert not run.done(), "the batch keeps the one in line"
    sender.go.set()
    await asyncio.wait_for(run, 5)

    assert sender.most == 1 and len(sender.urls) == 2
    assert s.value("passkey_webhook_delivery_latency_seconds_count") == 2
    assert s.value("passkey_webhook_attempts_deferred_total", reason="capacity") == 1
    assert s.dispatcher.gate.waiting("ep_1") == 0 and len(s.store) == 0


async def test_a_partition_dropped_drops_its_open_batches() -> None:
    s = Setup()
    assert await s.dispatcher.handle(event_message("acc_1")[0]) == ["ep_1/acc_1"]
    assert set(s.store.batches) == {(PARTITION, "ep_1")}

    s.store.drop(PARTITION)
    assert not s.store.batches and not s.store.claimed("ep_1/acc_1")
    s.store.load(PARTITION, {})
    assert await s.dispatcher.handle(event_message("acc_2")[0]) == ["ep_1/acc_2"]
