"""The completion watermark: a commit never passes an unfinished record."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.consumer import OffsetTracker


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
