"""``PairWrites``: the holds of one partition that come due in one commit tick are written
together (worker/dispatcher/pair_writes.py, docs/architecture.md "Resource bounds"): one write,
each pair once, every hold released once it is acknowledged."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Sequence

from aiokafka import TopicPartition

from worker.dispatcher.delivery_store import DeliveryStore
from worker.dispatcher.holds import EventHold
from worker.dispatcher.pair_writes import PairWrites
from worker.engine.offsets import HANDLING, Handling, Hold, OffsetTracker

PARTITION = 3
TP = TopicPartition("auth.status", PARTITION)


class NotingPublisher:
    """The Kafka boundary: notes each ``send_states`` and acknowledges it at once."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    async def send_states(
        self, partition: int, keys: Sequence[str], *, store: DeliveryStore
    ) -> Awaitable[None]:
        assert partition == PARTITION
        self.sent.append(list(keys))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def held_events(
    writes: PairWrites, tracker: OffsetTracker, count: int
) -> tuple[list[EventHold], deque[Hold]]:
    """``count`` events taken in at offsets 0.., each holding its offset as the loop does."""
    watched: deque[Hold] = deque()
    holds = []
    for offset in range(count):
        tracker.dispatched(offset)
        token = HANDLING.set(Handling(watched, TP, tracker, offset))
        try:
            hold = writes.hold(PARTITION)
        finally:
            HANDLING.reset(token)
        assert hold is not None
        holds.append(hold)
        tracker.finished(offset)
    return holds, watched


async def test_the_holds_come_due_in_one_tick_are_written_once_each_pair_once() -> None:
    store = DeliveryStore()
    store.load(PARTITION, {})
    publisher = NotingPublisher()
    writes = PairWrites(store, publisher)  # type: ignore[arg-type]
    tracker = OffsetTracker()
    holds, watched = held_events(writes, tracker, 4)
    # Four events, three pairs: the first two events share a pair (an account's two versions).
    pairs = ["ep_1/acc_a", "ep_1/acc_a", "ep_1/acc_b", "ep_2/acc_c"]
    for offset, (hold, key) in enumerate(zip(holds, pairs, strict=True)):
        store.unsaved.keep(PARTITION, key, f"msg_{offset}", hold)
    assert tracker.watermark() == 0, "every event's offset held"

    for due in list(watched)[:3]:  # the commit tick: three of the four came due
        assert due.on_overdue is not None
        due.on_overdue()
    assert publisher.sent == [], "written by a task, not inside the tick"
    for _ in range(5):
        await asyncio.sleep(0)

    assert publisher.sent == [["ep_1/acc_a", "ep_1/acc_b"]]
    assert [h.released for h in holds] == [True, True, True, False]
    assert store.unsaved.has(PARTITION, "ep_2/acc_c")
    assert tracker.watermark() == 3

    last = watched[3].on_overdue
    assert last is not None
    last()
    for _ in range(5):
        await asyncio.sleep(0)
    assert publisher.sent == [["ep_1/acc_a", "ep_1/acc_b"], ["ep_2/acc_c"]]
    assert all(h.released for h in holds)
    assert tracker.watermark() == 4
