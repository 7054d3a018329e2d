"""``rfc3339`` writes what the datetime formula writes, for every timestamp: the same rounding
(to the microsecond, half to even, then cut to the millisecond), far dates, and the same
errors out of range."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.contract.messages import rfc3339

FIRST, LAST = -62135596800, 253402300799  # 0001-01-01T00:00:00, 9999-12-31T23:59:59


def formula(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def edges() -> list[float]:
    """Whole seconds over the range, each with the fractions where rounding turns over."""
    rng = random.Random(48)
    seconds = [FIRST, LAST, 0, -1, 1, 1_764_460_800, 951_782_400, 4_107_542_400]
    seconds += [rng.randint(FIRST, LAST) for _ in range(300)]
    seconds += [rng.randint(0, 4_102_444_800) for _ in range(300)]
    fractions = [0.0, 0.5, 0.999, 0.9995, 0.9999995, 0.99999949, 0.9999996, 0.0000005]
    fractions += [0.0000015, 0.0000025, 0.0005, 0.0004999, 0.001, 0.1, 0.123456, 0.7]
    out: list[float] = []
    for whole in seconds:
        for frac in fractions:
            for ts in (whole + frac, whole - frac, math.nextafter(whole + frac, math.inf)):
                if FIRST <= ts < LAST:
                    out.append(ts)
    return out


def test_same_string_as_the_formula_at_rounding_edges_and_far_dates() -> None:
    stamps = edges()
    assert len(stamps) > 10_000
    for ts in stamps:
        assert rfc3339(ts) == formula(ts), repr(ts)


@given(st.floats(min_value=FIRST, max_value=LAST - 1) | st.integers(FIRST, LAST))
def test_same_string_as_the_formula(ts: float) -> None:
    assert rfc3339(ts) == formula(ts)


@pytest.mark.parametrize("ts", [LAST + 1.0, LAST + 0.9999996, FIRST - 1.0, 1e20, -1e20])
def test_out_of_range_fails_as_the_formula(ts: float) -> None:
    with pytest.raises((ValueError, OverflowError)) as expected:
        formula(ts)
    with pytest.raises(type(expected.value)):
        rfc3339(ts)


@pytest.mark.parametrize("ts", [math.nan, math.inf, -math.inf])
def test_not_a_time_fails(ts: float) -> None:
    with pytest.raises((ValueError, OverflowError)):
        formula(ts)
    with pytest.raises((ValueError, OverflowError)):
        rfc3339(ts)
