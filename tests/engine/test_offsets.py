"""The completion watermark: a commit never passes an unfinished or held record."""

from __future__ import annotations

import gc
import weakref

from aiokafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from worker.engine.offsets import Hold, OffsetTracker, hold_record


def test_watermark_waits_for_the_oldest_unfinished_record() -> None:
    t = OffsetTracker()
    assert t.watermark() is None
    for offset in (10, 11, 12, 13):
        t.dispatched(offset)
    assert t.watermark() == 10
    t.finished(12)
    t.finished(11)
    assert t.watermark() == 10
    t.finished(10)
    assert t.watermark() == 13
    t.finished(13)
    assert t.watermark() == 14
    assert t.pending == 0


@given(st.lists(st.integers(min_value=0, max_value=10_000), unique=True, max_size=60))
def test_watermark_is_always_the_first_unfinished(finish_order: list[int]) -> None:
    offsets = sorted(finish_order)
    t = OffsetTracker()
    for o in offsets:
        t.dispatched(o)
    done: set[int] = set()
    for o in finish_order:
        t.finished(o)
        done.add(o)
        unfinished = [x for x in offsets if x not in done]
        expected = unfinished[0] if unfinished else offsets[-1] + 1
        assert t.watermark() == expected


def test_a_held_offset_stops_the_watermark_until_every_hold_is_released() -> None:
    t = OffsetTracker()
    for offset in (10, 11, 12):
        t.dispatched(offset)
    t.hold(11)
    t.hold(11)
    for offset in (10, 11, 12):
        t.finished(offset)
    assert t.watermark() == 11, "finished but held: not committed"
    t.release(11)
    assert t.watermark() == 11, "one hold left"
    t.release(11)
    assert t.watermark() == 13
    t.dispatched(13)
    t.finished(13)
    assert t.watermark() == 14, "no hold is left behind"


def test_a_hold_released_before_its_record_finishes_does_not_finish_it() -> None:
    t = OffsetTracker()
    t.dispatched(5)
    t.hold(5)
    t.release(5)
    assert t.watermark() == 5, "still running"
    t.finished(5)
    assert t.watermark() == 6


@given(
    st.lists(st.integers(min_value=0, max_value=40), unique=True, min_size=1, max_size=40),
    st.data(),
)
def test_the_watermark_never_passes_a_held_or_unfinished_offset(
    finish_order: list[int], data: st.DataObject
) -> None:
    offsets = sorted(finish_order)
    held = set(data.draw(st.lists(st.sampled_from(offsets), unique=True)))
    t = OffsetTracker()
    for o in offsets:
        t.dispatched(o)
    for o in held:
        t.hold(o)
    done: set[int] = set()
    events = [("finish", o) for o in finish_order] + [("release", o) for o in held]
    for kind, o in data.draw(st.permutations(events)):
        if kind == "finish":
            t.finished(o)
            done.add(o)
        else:
            t.release(o)
            held.discard(o)
        blocked = [x for x in offsets if x not in done or x in held]
        assert t.watermark() == (blocked[0] if blocked else offsets[-1] + 1)


def test_no_hold_outside_the_consume_loop() -> None:
    assert hold_record() is None


class _Owner:
    hold: Hold | None = None


def _owned_hold(tracker: OffsetTracker) -> tuple[Hold, weakref.ref[_Owner]]:
    """A hold whose overdue callback refers to its owner, which refers back to the hold."""
    owner = _Owner()
    owner.hold = Hold(tracker, TopicPartition("t", 0), 5, on_overdue=lambda: print(owner.hold))
    return owner.hold, weakref.ref(owner)


def test_a_released_hold_lets_go_of_an_owner_that_refers_back_to_it() -> None:
    """An owner whose overdue callback refers to its own hold (the dispatcher's event hold)
    is freed on release by reference counting, not left to the cyclic collector."""
    tracker = OffsetTracker()
    tracker.dispatched(5)
    gc.disable()
    try:
        hold, owner = _owned_hold(tracker)
        assert owner() is not None
        hold.release()
        assert owner() is None
    finally:
        gc.enable()
    tracker.finished(5)
    assert tracker.watermark() == 6
