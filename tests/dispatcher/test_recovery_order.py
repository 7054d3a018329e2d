"""Issue 49, per-account order on recovery (docs/architecture.md, "Endpoints that heal"): a live
head waits while the recovery's replay is queued and until this member has taken webhook.replays
in to where it ended then (``recovery.replays_end``); a recovery replay's delivery goes ahead of
the live ones never attempted. The dispatcher over an in-memory store (the fakes of
tests/dispatcher/test_instrumentation.py); end to end: tests/dispatcher/test_probing_replay.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tests.dispatcher.test_instrumentation import (
    NOW,
    PARTITION,
    URL,
    NotingPublisher,
    Setup,
    message,
)
from tests.webhooks.support import status_event
from worker.contract.delivery_log import Replay
from worker.contract.webhook_endpoints import Recovery
from worker.dispatcher.delivery import DeliveryState, Pending, enqueue

RID = "rp_" + "a" * 32


class Taken:
    """How far webhook.replays is taken in, per partition (the loop's ``completed``)."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.asked: list[int] = []

    async def __call__(self, partition: int) -> int | None:
        self.asked.append(partition)
        return self.at


def recovering(setup: Setup, taken: Taken, **recovery: object) -> None:
    """The endpoint re-enabled by a probe, its recovery as ``recovery`` says."""
    held = Recovery(disabled_at=NOW - 100, interval_s=1.0, replay_id=RID, **recovery)
    setup.endpoints.apply(setup.endpoint.model_copy(update={"revision": 2, "recovery": held}))
    setup.dispatcher.missed_first.replays_taken = taken


async def test_a_live_head_waits_until_webhook_replays_is_taken_in_to_the_replays_end() -> None:
    setup, taken = Setup(), Taken(9)
    recovering(setup, taken, replays_end={PARTITION: 10, PARTITION + 1: 50})
    state = setup.pending("acc_1")
    await setup.dispatcher.follow_up(PARTITION, state.key)
    assert setup.sender.urls == [], "held back: its partition's records not all taken in"
    assert setup.store.pair(PARTITION, state.key) == state, "held in the pair, not failed"
    assert taken.asked == [PARTITION]
    taken.at = None  # the partition not assigned here (revoked): still held back
    await setup.dispatcher.follow_up(PARTITION, state.key)
    assert setup.sender.urls == []
    taken.at = 10  # the other partition's end is not this pair's concern
    await setup.dispatcher.follow_up(PARTITION, state.key)
    assert setup.sender.urls == [URL]


async def test_a_live_head_waits_while_the_replay_is_queued_and_a_replayed_one_does_not() -> None:
    setup, taken = Setup(), Taken(None)
    recovering(setup, taken, replaying=True)
    live = setup.pending("acc_1")
    await setup.dispatcher.follow_up(PARTITION, live.key)
    assert setup.sender.urls == [] and taken.asked == [], "no end stored yet: none asked"
    replayed = live.queue[0].model_copy(update={"replay": RID})
    setup.store.put(PARTITION, live.model_copy(update={"queue": (replayed,)}))
    await setup.dispatcher.follow_up(PARTITION, live.key)
    assert setup.sender.urls == [URL], "what it missed goes out while replaying"


async def test_without_a_stored_end_for_its_partition_a_live_head_goes_out() -> None:
    setup, taken = Setup(), Taken(0)
    recovering(setup, taken, replays_end={PARTITION + 1: 50})
    state = setup.pending("acc_1")
    await setup.dispatcher.follow_up(PARTITION, state.key)
    assert setup.sender.urls == [URL] and taken.asked == []


async def test_a_missed_event_read_goes_ahead_of_the_held_live_head_and_out_first() -> None:
    """The take-in's placement through ``handle``: the replay's record of the account's missed
    event lands ahead of the live head waiting for it, and is attempted; the live head waits."""
    setup, taken = Setup(), Taken(None)
    recovering(setup, taken, replaying=True)
    live = setup.pending("acc_1")
    await setup.dispatcher.follow_up(PARTITION, live.key)
    event = status_event("acc_1", 1)
    replay = Replay(
        replay_id=RID, endpoint_id="ep_1", workspace_id="ws_a", source="status",
        event=event.model_dump_json(),
    )  # fmt: skip
    due = await setup.dispatcher.handle(
        message(replay.model_dump_json().encode(), topic="webhook.replays")
    )
    state = setup.store.pair(PARTITION, live.key)
    assert state is not None and [p.replay for p in state.queue] == [RID, None]
    assert due == [live.key], "the missed event is the head: due at once"
    await setup.dispatcher.follow_up(PARTITION, live.key)
    assert len(setup.sender.urls) == 1, "the missed event went out, the live head waits"
    state = setup.store.pair(PARTITION, live.key)
    assert state is not None and [p.webhook_id for p in state.queue] == ["msg_waiting"]


class ReadingPublisher(NotingPublisher):
    """Runs ``meanwhile`` once, inside the first delivered head's log entry: after the pair's
    state dropped that head, while its lane still awaits the writes."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Callable[[], Awaitable[object]] | None = None

    async def log_finished(self, *args: Any, **kwargs: Any) -> None:
        await super().log_finished(*args, **kwargs)
        run, self.meanwhile = self.meanwhile, None
        if run is not None:
            await run()


async def test_a_missed_event_read_while_the_head_before_settles_goes_ahead_of_the_live_one() -> (
    None
):
    """Only a head being attempted or settled keeps its place: once the settled head left
    the pair, a missed event read while the lane still writes goes ahead of the live head.
    Before, a pair merely claimed counted as one in flight: the missed event went behind the
    live head, which went out first once the replay's records were all taken in."""
    publisher = ReadingPublisher()
    setup, taken = Setup(publisher=publisher), Taken(None)
    recovering(setup, taken, replaying=True)
    live = setup.pending("acc_1")
    first = live.queue[0].model_copy(update={"webhook_id": "msg_missed_1", "replay": RID})
    setup.store.put(PARTITION, live.model_copy(update={"queue": (first, live.queue[0])}))
    replay = Replay(
        replay_id=RID, endpoint_id="ep_1", workspace_id="ws_a", source="status",
        event=status_event("acc_1", 2).model_dump_json(),
    )  # fmt: skip
    record = message(replay.model_dump_json().encode(), topic="webhook.replays")
    publisher.meanwhile = lambda: setup.dispatcher.handle(record)
    await setup.dispatcher.follow_up(PARTITION, live.key)
    assert publisher.meanwhile is None, "the missed event was read while the lane wrote"
    assert len(setup.sender.urls) == 2, "both missed events went out"
    state = setup.store.pair(PARTITION, live.key)
    assert state is not None and [p.webhook_id for p in state.queue] == ["msg_waiting"]
    assert not setup.dispatcher.missed_first.settling, "none left marked once the heads settled"


def test_a_recovery_replay_goes_ahead_of_the_live_deliveries_never_attempted() -> None:
    """The placement alone: behind a held (in-flight) head, an attempted delivery and earlier
    replays, ahead of the never-attempted live ones; a plain delivery is appended."""

    def pending(wid: str, replay: str | None = None, attempts: int = 0) -> Pending:
        return Pending(
            webhook_id=wid, event_type="t", event_id=wid, body="{}", occurred_at="",
            enqueued_at=0.0, next_attempt_at=0.0, replay=replay, attempts=attempts,
        )  # fmt: skip

    def order(queue: tuple[Pending, ...], new: Pending, **how: bool) -> list[str]:
        state = DeliveryState(endpoint_id="ep", account_id="acc", workspace_id="ws", queue=queue)
        grown, taken = enqueue(state, new, **how)
        assert taken
        return [p.webhook_id for p in grown.queue]

    live = (pending("l1"), pending("l2"))
    assert order(live, pending("r1", "rp"), missed=True) == ["r1", "l1", "l2"]
    assert order(live, pending("r1", "rp"), missed=True, held=True) == ["l1", "r1", "l2"]
    assert order(live, pending("r1", "rp")) == ["l1", "l2", "r1"]
    tried = (pending("l0", attempts=1), pending("r1", "rp"), *live)
    assert order(tried, pending("r2", "rp"), missed=True) == ["l0", "r1", "r2", "l1", "l2"]
