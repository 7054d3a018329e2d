"""The pure delivery decisions: dedup of replays, order, the retry schedule, 410, Retry-After,
and the bound of a pair's queue."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.contract.delivery_log import webhook_id
from worker.dispatcher.delivery import (
    DEFAULT_SCHEDULE_S,
    JITTER,
    PENDING_TEXT,
    STATE_HEADROOM,
    DeliveryResult,
    DeliveryState,
    Pending,
    QueueLimits,
    carry_over,
    enqueue,
    fail_head,
    most_bytes,
    parse_schedule,
    refused,
    remember,
    settle,
    state_key,
    take_in,
)

NOW = 1_800_000_000.0


def pending(version: int, *, replay: str | None = None, at: float = NOW) -> Pending:
    return Pending(
        webhook_id=webhook_id(f"ev-{version}", "ep_1"),
        event_type="account.auth_status_changed",
        event_id=f"ev-{version}",
        version=version,
        body=f'{{"v":{version}}}',
        occurred_at="2026-11-23T00:00:00.000Z",
        enqueued_at=at,
        next_attempt_at=at,
        replay=replay,
    )


def empty() -> DeliveryState:
    return DeliveryState(endpoint_id="ep_1", account_id="acc_1", workspace_id="ws_a")


def test_webhook_id_is_one_per_event_and_endpoint() -> None:
    assert webhook_id("ev", "ep_1") == webhook_id("ev", "ep_1")
    assert webhook_id("ev", "ep_1") != webhook_id("ev", "ep_2")
    assert webhook_id("ev", "ep_1") != webhook_id("ev2", "ep_1")
    assert webhook_id("ev", "ep_1").startswith("msg_")
    assert state_key("ep_1", "acc_1") == "ep_1/acc_1"


def test_a_replayed_event_is_taken_in_once_a_replay_request_once_more() -> None:
    state, taken = enqueue(empty(), pending(1))
    assert taken
    state, taken = enqueue(state, pending(1))
    assert not taken and len(state.queue) == 1
    delivered = settle(state, DeliveryResult(200), now=NOW).state
    _, taken = enqueue(delivered, pending(1))
    assert not taken, "a replay after delivery is dropped: seen keeps its webhook-id"
    replayed, taken = enqueue(delivered, pending(1, replay="rp_1"))
    assert taken and replayed.queue[0].webhook_id == pending(1).webhook_id
    assert not enqueue(replayed, pending(1, replay="rp_1"))[1]


def test_only_the_head_is_attempted_and_the_next_is_due_when_it_ends() -> None:
    state = empty()
    for v in (1, 2, 3):
        state = enqueue(state, pending(v))[0]
    retried = settle(state, DeliveryResult(500), now=NOW, rng=random.Random(1))
    assert retried.outcome == "retry"
    assert [p.version for p in retried.state.queue] == [1, 2, 3], "order is kept while retrying"
    due = retried.state.due_at()
    assert due is not None and NOW + 5.0 * (1 - JITTER) <= due <= NOW + 5.0 * (1 + JITTER)
    done = settle(retried.state, DeliveryResult(204), now=NOW + 10)
    assert done.outcome == "delivered"
    assert done.finished is not None and done.finished.attempts == 2
    assert [p.version for p in done.state.queue] == [2, 3]
    assert done.state.due_at() == NOW  # it was already due


def test_the_schedule_is_followed_with_jitter_then_the_delivery_fails() -> None:
    state = enqueue(empty(), pending(1))[0]
    rng = random.Random(7)
    now = NOW
    for wait in DEFAULT_SCHEDULE_S:
        step = settle(state, DeliveryResult(None, error="timeout"), now=now, rng=rng)
        due = step.state.due_at()
        assert step.outcome == "retry" and due is not None
        assert wait * (1 - JITTER) <= due - now <= wait * (1 + JITTER)
        state, now = step.state, due
    assert state.queue[0].attempts == len(DEFAULT_SCHEDULE_S)
    assert state.queue[0].first_failed_at == NOW
    last = settle(state, DeliveryResult(502), now=now)
    assert last.outcome == "failed" and last.state.queue == ()
    assert last.finished is not None
    assert (last.finished.state, last.finished.attempts) == ("failed", 8)


def test_gone_fails_at_once_and_retry_after_is_honoured() -> None:
    state = enqueue(empty(), pending(1))[0]
    assert settle(state, DeliveryResult(410), now=NOW).outcome == "gone"
    slow = settle(state, DeliveryResult(429, retry_after_s=600.0), now=NOW, schedule=(5.0, 900.0))
    assert slow.state.due_at() == NOW + 600.0
    ignored = settle(state, DeliveryResult(500, retry_after_s=600.0), now=NOW, schedule=(5.0,))
    due = ignored.state.due_at()
    assert due is not None and due < NOW + 10


@pytest.mark.parametrize("hint", [1e12, 1e300, float("inf"), float("nan"), -5.0])
def test_retry_after_never_waits_past_the_schedules_longest_step(hint: float) -> None:
    state = enqueue(empty(), pending(1))[0]
    for status in (429, 503):
        step = settle(
            state, DeliveryResult(status, retry_after_s=hint), now=NOW, schedule=(5.0, 900.0)
        )
        due = step.state.due_at()
        assert step.outcome == "retry" and due is not None
        assert NOW + 5.0 * (1 - JITTER) <= due <= NOW + 900.0


def test_fail_head_records_the_reason_and_failing_since_spans_deliveries() -> None:
    state = empty()
    for v in range(3):
        state = enqueue(state, pending(v))[0]
    state = settle(state, DeliveryResult(503), now=NOW).state
    assert state.failing_since == NOW
    failed = fail_head(state, "endpoint_inactive", now=NOW + 50)
    assert failed.finished is not None
    assert (failed.finished.state, failed.finished.last_error) == ("failed", "endpoint_inactive")
    assert failed.state.failing_since == NOW, "a failure does not reset the clock"
    ok = settle(failed.state, DeliveryResult(200), now=NOW + 60)
    assert ok.state.failing_since is None, "a success does"


def test_an_outcome_carries_over_onto_what_was_taken_in_meanwhile() -> None:
    state = enqueue(empty(), pending(1))[0]
    retried = settle(state, DeliveryResult(500), now=NOW, rng=random.Random(2))
    grown = enqueue(state, pending(2))[0]  # the account's lane, during the attempt
    merged = carry_over(grown, retried)
    assert [p.version for p in merged.queue] == [1, 2]
    assert merged.queue[0].attempts == 1 and merged.failing_since == NOW
    assert merged.seen == grown.seen
    done = settle(merged, DeliveryResult(200), now=NOW + 9)
    later = enqueue(merged, pending(3))[0]
    final = carry_over(later, done)
    assert [p.version for p in final.queue] == [2, 3]
    assert final.queue[0].next_attempt_at <= NOW + 9
    assert final.failing_since is None


@pytest.mark.parametrize(
    ("status", "behind"),
    [(500, 0), (500, 1), (200, 0), (200, 1), (410, 1), (None, 1)],
)
def test_an_outcome_carried_over_onto_an_unchanged_state_is_the_settled_state(
    status: int | None, behind: int
) -> None:
    state = enqueue(empty(), pending(1))[0]
    if behind:
        waiting = pending(2, at=NOW + 60)  # queued behind, its own time later than the outcome
        state = enqueue(state, waiting)[0]
    settled = (
        fail_head(state, "endpoint_deleted", now=NOW)
        if status is None
        else settle(state, DeliveryResult(status), now=NOW, rng=random.Random(3))
    )
    same = carry_over(state, settled)
    assert same is settled.state, "nothing changed meanwhile: no copy"
    # what the general path (a copy of the state as it is now) makes of it is the same
    copy = state.model_copy()
    assert copy is not state
    assert carry_over(copy, settled) == same


def test_parse_schedule() -> None:
    assert parse_schedule("5,300, 1800") == (5.0, 300.0, 1800.0)
    with pytest.raises(ValueError, match=">= 0"):
        parse_schedule("5,-1")
    with pytest.raises(ValueError, match="<= 2592000"):
        parse_schedule("5," + "9" * 40)  # a due time that far out is no date at all


# --- the bound of a pair's queue ----------------------------------------------------------------


def big(version: int, size: int) -> Pending:
    return pending(version).model_copy(update={"body": '{"pad":"' + "x" * size + '"}'})


def test_a_full_queue_refuses_the_newest_delivery_and_keeps_what_waits() -> None:
    limits = QueueLimits(max_pending=3)
    state = empty()
    for v in range(3):
        state, verdict = take_in(state, pending(v), limits)
        assert verdict == "taken"
    after, verdict = take_in(state, pending(3), limits)
    assert verdict == "full" and after == state, "nothing changes until the refusal is written"
    assert take_in(state, pending(1), limits)[1] == "duplicate"
    remembered = remember(state, pending(3))
    assert [p.version for p in remembered.queue] == [0, 1, 2]
    assert take_in(remembered, pending(3), limits)[1] == "duplicate", "refused once only"
    done = refused(pending(3), "queue_full", now=NOW)
    assert (done.state, done.attempts, done.last_error) == ("failed", 0, "queue_full")
    # once the head is delivered there is room again
    room = settle(remembered, DeliveryResult(200), now=NOW).state
    assert take_in(room, pending(4), limits)[1] == "taken"


def test_a_record_never_passes_its_byte_bound_whatever_happens_to_it() -> None:
    """Fill a pair with large deliveries, refusals, replays and failed attempts: its JSON,
    as written to the changelog, stays within ``max_bytes``."""
    limits = QueueLimits(max_pending=1000, max_bytes=64 * 1024)
    rng = random.Random(3)
    state = empty()
    sizes = []
    for v in range(400):
        delivery = big(v, rng.randrange(10, 6000))
        if rng.random() < 0.2:
            delivery = delivery.model_copy(update={"replay": f"rp_{rng.getrandbits(128):032x}"})
        state, verdict = take_in(state, delivery, limits)
        if verdict == "full":
            state = remember(state, delivery)
        if state.queue and rng.random() < 0.3:
            error = "x" * rng.randrange(0, 5000)  # whatever a failure says, it is cut
            state = settle(state, DeliveryResult(None, error=error), now=NOW + v, rng=rng).state
        sizes.append(len(state.model_dump_json()))
    assert max(sizes) <= limits.max_bytes
    assert max(sizes) > limits.max_bytes - 2 * STATE_HEADROOM, "the queue did fill up"
    too_big = big(1000, limits.max_bytes)
    assert take_in(empty(), too_big, limits)[1] == "full", "one delivery past the bound alone"


def test_the_byte_bound_is_of_the_record_as_written_whatever_its_text() -> None:
    """``fits`` decides on the record's bytes as written to the changelog, not its characters,
    also for bodies of 4-byte characters, escaped quotes and control characters (6 bytes
    each): it says exactly what measuring the record says, near the bound too."""
    limits = QueueLimits(max_pending=1000, max_bytes=32 * 1024)
    limit = limits.max_bytes - STATE_HEADROOM
    rng = random.Random(7)
    texts = ("\U0001f600", "é", '"', "\\", "\x01", "x")
    state = empty()
    sizes, near = [], 0
    for v in range(300):
        body = "".join(rng.choice(texts) for _ in range(rng.randrange(1, 1500)))
        grown, _ = enqueue(state, big(v, 0).model_copy(update={"body": body}))
        exact = len(grown.model_dump_json().encode()) <= limit
        assert limits.fits(grown) == exact
        near += limit - 4096 < len(grown.model_dump_json().encode()) < limit + 4096
        state, verdict = take_in(state, big(v, 0).model_copy(update={"body": body}), limits)
        if verdict == "full":
            state = settle(state, DeliveryResult(200), now=NOW + v).state
        sizes.append(len(state.model_dump_json().encode()))
    assert max(sizes) <= limit, "bytes, not characters, are bounded"
    assert near > 10, "the bound was tried near its edge"


_TEXT = st.text(st.sampled_from(("\U0001f600", "\u2028", "é", '"', "\\", "\x01", "\x7f", "x")))
_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
_INT = st.integers(min_value=-(10**30), max_value=10**30)
_PENDING = st.builds(
    Pending,
    webhook_id=_TEXT,
    event_type=_TEXT,
    event_id=_TEXT,
    version=st.none() | _INT,
    body=_TEXT,
    occurred_at=_TEXT,
    enqueued_at=_FLOAT,
    attempts=_INT,
    next_attempt_at=_FLOAT,
    first_failed_at=st.none() | _FLOAT,
    last_status=st.none() | _INT,
    last_error=st.none() | _TEXT,
    replay=st.none() | _TEXT,
    traceparent=st.none() | _TEXT,
    tracestate=st.none() | _TEXT,
)


@settings(max_examples=300, deadline=None)
@given(
    st.builds(
        DeliveryState,
        endpoint_id=_TEXT,
        account_id=_TEXT,
        workspace_id=_TEXT,
        queue=st.lists(_PENDING, max_size=4).map(tuple),
        seen=st.lists(_TEXT, max_size=8).map(tuple),
        failing_since=st.none() | _FLOAT,
    )
)
def test_the_bound_summed_from_the_strings_is_never_below_the_record_as_written(
    state: DeliveryState,
) -> None:
    """``fits`` takes a delivery in unmeasured when ``most_bytes`` is within the bound: so it
    must never say less than the record's bytes as written, whatever its characters (escaped,
    4-byte, line separators) and numbers (``None`` for an int it cannot bound)."""
    written = len(state.model_dump_json().encode())
    most = most_bytes(state)
    huge = any(
        n is not None and abs(n) >= 10**20
        for d in state.queue
        for n in (d.version, d.attempts, d.last_status)
    )
    assert (most is None) == huge
    assert most is None or most >= written


@pytest.mark.parametrize("char", ["\x01", '"', "\\", "\u2028", "\U0001f600", "é", "x"])
@pytest.mark.parametrize("field", [*PENDING_TEXT, "seen"])
def test_the_summed_bound_holds_for_a_long_string_of_the_costliest_characters(
    char: str, field: str
) -> None:
    """Two thousand of one character in one string: the frame's slack cannot hide a wrong
    bytes-a-character (a control character is written as six)."""
    text = char * 2000
    if field == "seen":
        state = empty().model_copy(update={"seen": (text,)})
    else:
        state, _ = enqueue(empty(), pending(1).model_copy(update={field: text}))
    most = most_bytes(state)
    assert most is not None and most >= len(state.model_dump_json().encode())


@pytest.mark.parametrize(
    "field",
    [n for n, f in Pending.model_fields.items() if f.annotation in (int, int | None)],
)
def test_every_int_of_a_pending_too_large_to_bound_is_measured(field: str) -> None:
    """``most_bytes`` checks the ints it knows by name: an int field of ``Pending`` it did not
    check would let a huge number through the 24-character frame."""
    state, _ = enqueue(empty(), pending(1).model_copy(update={field: 10**25}))
    assert most_bytes(state) is None
    assert QueueLimits().fits(state) == (len(state.model_dump_json().encode()) <= 256 * 1024)


def test_a_record_bounded_only_by_measuring_is_measured() -> None:
    """Near the bound the summed bound is too coarse (six bytes a character): the record is
    measured, and a queue whose bound passes the limit still fits when its bytes do."""
    limits = QueueLimits(max_pending=1000, max_bytes=32 * 1024)
    room = limits.max_bytes - STATE_HEADROOM
    state, _ = enqueue(empty(), big(1, room // 2))
    most = most_bytes(state)
    assert most is not None and most > room, "the bound alone would refuse it"
    assert len(state.model_dump_json().encode()) <= room
    assert limits.fits(state)
    several = state
    for v in (2, 3, 4):
        several, _ = enqueue(several, pending(v))
    stopped, whole = most_bytes(several, limit=100), most_bytes(several)
    assert stopped is not None and whole is not None
    assert 100 < stopped < whole, "summed only until past the limit"
    assert limits.fits(several), "and then measured"
    huge = pending(10**25)
    grown, _ = enqueue(empty(), huge)
    assert most_bytes(grown) is None and limits.fits(grown), "a huge version is measured"


def test_queue_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="max_pending"):
        QueueLimits(max_pending=0)
    with pytest.raises(ValueError, match="max_bytes"):
        QueueLimits(max_bytes=1000)
