"""``Retry-After`` from a hostile peer (``worker.runtime.retry_after``): every form RFC 9110 allows,
every form an attacker might send, and the property that no string raises or escapes the
caller's ceiling."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.runtime.retry_after import parse_retry_after

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
MAX = 36_000.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("", None),
        ("0", 0.0),
        ("120", 120.0),
        (" 30 ", 30.0),
        ("\t7\t", 7.0),
        ("1.5", 1.5),  # a fraction is tolerated
        ("007", 7.0),
        ("0" * 500 + "7", 7.0),  # leading zeros are not a huge number
        ("-5", None),  # not delta-seconds
        ("+5", None),
        ("1e5", None),
        ("nan", None),
        ("inf", None),
        ("1_000", None),
        ("soon", None),
        ("١٢", None),  # Arabic-Indic digits are not delta-seconds
        ("\uff11\uff12", None),  # nor full-width ones (float() would accept both)
        ("1 2", None),
        ("\u00a012", None),  # non-ASCII whitespace is not stripped
        ("9" * 400, MAX),  # too long for float(int()): clamped, not raised
        ("9" * 5000, MAX),  # past int()'s digit limit too
        ("1000000000000", MAX),  # "year 33715": clamped to the ceiling
        ("36001", MAX),
        ("36000", MAX),
        ("Sun, 01 Mar 2026 12:01:30 GMT", 90.0),
        ("Sun, 01 Mar 2026 11:00:00 GMT", 0.0),  # in the past: retry now
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
        ("Sunday, 01-Mar-26 12:00:10 GMT", 10.0),  # RFC 850, obsolete but allowed
        ("Sun Mar  1 12:00:20 2026", 20.0),  # asctime
        ("Fri, 31 Dec 9999 23:59:59 GMT", MAX),  # far future: the ceiling
        ("Sun, 01 Mar 99999 12:00:00 GMT", None),  # no such datetime
        ("Sun, 01 Mar 2026 12:00:00 +9999", None),  # no such offset
        ("Sun, 32 Mar 2026 12:00:00 GMT", None),
        ("Sun, 01 Mar 2026 12:01:30 GMT" + " " * 100 + "x", None),
        ("Sün, 01 Mär 2026 12:01:30 GMT", None),
    ],
)
def test_parse_retry_after(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, max_s=MAX, now=NOW) == seconds


def test_the_ceiling_is_the_callers() -> None:
    assert parse_retry_after("600", max_s=5.0) == 5.0
    assert parse_retry_after("600", max_s=0.0) == 0.0
    assert parse_retry_after("600", max_s=-1.0) == 0.0  # a nonsensical ceiling waits nothing
    assert parse_retry_after("600", max_s=float("nan")) == 0.0


def test_a_date_is_measured_from_now_by_default() -> None:
    soon = NOW.replace(year=dt.datetime.now(dt.UTC).year + 1)
    assert parse_retry_after(soon.strftime("%a, %d %b %Y %H:%M:%S GMT"), max_s=MAX) == MAX


headers = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(codec="latin-1")),
    st.from_regex(r"\A\s*-?[0-9]{0,500}(\.[0-9]{0,20})?\s*\Z"),
    st.datetimes(timezones=st.just(dt.UTC)).map(
        lambda d: d.strftime("%a, %d %b ") + f"{d.year:04d}" + d.strftime(" %H:%M:%S GMT")
    ),
    st.binary().map(lambda b: b.decode("utf-8", "surrogateescape")),
)


@settings(max_examples=500, deadline=None)
@given(value=headers, ceiling=st.floats(min_value=0, max_value=1e9))
def test_no_header_raises_or_escapes_the_ceiling(value: str, ceiling: float) -> None:
    seconds = parse_retry_after(value, max_s=ceiling, now=NOW)
    assert seconds is None or 0.0 <= seconds <= ceiling
