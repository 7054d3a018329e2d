"""The families every process defines through ``Families`` (worker/runtime/metrics.py): their
series are ``LoopValue``s, written without prometheus_client's lock, and what a scrape shows
after any writes is what prometheus_client's own families show after the same writes."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values

from worker.runtime.metrics import Families, LoopValue

BUCKETS = (0.01, 0.1, 1.0, 10.0, 300.0)
_CREATED = re.compile(rb"^\w+_created(\{.*\})? .*\n", re.MULTILINE)


def _scrape(registry: CollectorRegistry) -> bytes:
    """The exposition without the ``_created`` samples (when each series was made)."""
    return _CREATED.sub(b"", generate_latest(registry))


amounts = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([*BUCKETS, 0.0, -0.0, -1.0, math.inf, -math.inf, math.nan, 1e-300]),
)


@settings(max_examples=60, deadline=None)
@given(
    observed=st.lists(amounts, max_size=30),
    counted=st.lists(st.floats(min_value=0, max_value=1e9), max_size=10),
    gauged=st.lists(st.tuples(st.sampled_from(["inc", "dec", "set"]), st.floats(-1e6, 1e6))),
)
def test_a_scrape_shows_what_the_librarys_own_families_show_after_the_same_writes(
    observed: list[float], counted: list[float], gauged: list[tuple[str, float]]
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    f = Families(ours)
    our_h = f.histogram("t_seconds", "h", ("kind",), buckets=BUCKETS)
    their_h = Histogram("t_seconds", "h", ("kind",), buckets=BUCKETS, registry=theirs)
    our_c = f.counter("t_total", "c", ("result",), seed=("a", "b"))
    their_c = Counter("t_total", "c", ("result",), registry=theirs)
    for seeded in ("a", "b"):
        their_c.labels(seeded)
    our_g, their_g = f.gauge("t_gauge", "g"), Gauge("t_gauge", "g", registry=theirs)
    for amount in observed:
        our_h.labels("x").observe(amount)
        their_h.labels("x").observe(amount)
    for amount in counted:
        our_c.labels("a").inc(amount)
        their_c.labels("a").inc(amount)
    for op, amount in gauged:
        getattr(our_g, op)(amount)
        getattr(their_g, op)(amount)
    assert _scrape(ours) == _scrape(theirs)


def test_every_series_of_a_family_is_a_loop_value() -> None:
    f = Families(CollectorRegistry())
    counter = f.counter("c_total", "c", ("result",), seed=("a",))
    gauge = f.gauge("g", "g")
    histogram = f.histogram("h_seconds", "h", buckets=BUCKETS)
    assert isinstance(counter.labels("a")._value, LoopValue)
    assert isinstance(counter.labels("new")._value, LoopValue)
    assert isinstance(gauge._value, LoopValue)
    assert isinstance(histogram._sum, LoopValue)
    assert all(isinstance(b, LoopValue) for b in histogram._buckets)


def test_a_value_kind_other_than_the_lock_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``PROMETHEUS_MULTIPROC_DIR`` the library writes its series to files shared by
    processes: that kind is left as it is."""

    class Shared(values.MutexValue):
        pass

    monkeypatch.setattr(values, "ValueClass", Shared)
    f = Families(CollectorRegistry())
    assert type(f.counter("c_total", "c")._value) is Shared
    histogram = f.histogram("h_seconds", "h", buckets=BUCKETS)
    assert type(histogram._sum) is Shared
    histogram.observe(0.5)
    assert histogram._buckets[2].get() == 1.0


def test_a_labelled_family_refuses_a_write_without_labels_and_keeps_exemplars() -> None:
    f = Families(CollectorRegistry())
    labelled = f.histogram("h_seconds", "h", ("kind",), buckets=BUCKETS)
    with pytest.raises(ValueError, match="missing label values"):
        labelled.observe(1.0)
    plain = f.histogram("p_seconds", "h", buckets=BUCKETS)
    plain.observe(0.5, {"trace_id": "abc"})
    assert plain._buckets[2].get_exemplar().labels == {"trace_id": "abc"}
    assert plain._buckets[2].get() == 1.0 and plain._sum.get() == 0.5
