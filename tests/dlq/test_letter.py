"""``worker.dlq.letter`` without a broker: the header contract read defensively, the time and
position arguments, and renderings that never raise and never pass a control character to a
terminal, whatever bytes a hostile writer put in a dead letter."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.dlq.cli import REPLAY_HINT, Target, plan
from worker.dlq.letter import (
    DELIVERY_FAILED,
    DeadLetter,
    Filter,
    Position,
    parse_at,
    parse_when,
    printable,
    show_json,
    show_text,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def letter(
    headers: list[tuple[str, bytes | None]],
    *,
    key: bytes | None = b"acc_1",
    value: bytes | None = b"{}",
    timestamp_ms: int = 1_772_366_400_000,
) -> DeadLetter:
    return DeadLetter("auth.dlq", 0, 7, timestamp_ms, key, value, tuple(headers))


def terminal_safe(text: str) -> bool:
    return all(c.isprintable() or c in "\n\t" for c in text)


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (b"auth.commands:0:5", Position("auth.commands", 0, 5)),
        (b"t_1-x.y:11:123456789", Position("t_1-x.y", 11, 123456789)),
        (b"auth.commands", None),
        (b"auth.commands:0", None),
        (b"auth.commands:-1:5", None),
        (b"auth.commands:0:-5", None),
        (b"auth.commands:x:5", None),
        (b"auth.commands: 1:5", None),
        (b"auth:commands:1:5", None),  # a colon is not a topic character
        (b":1:5", None),
        (b"\xff\xfe:1:5", None),
        (b"auth.commands:1:" + b"9" * 40, None),
        (b"a" * 250 + b":0:0", None),
        (b"", None),
        (None, None),
    ],
)
def test_position_parse(raw: bytes | None, parsed: Position | None) -> None:
    assert Position.parse(raw) == parsed


def test_parse_when_absolute_and_relative() -> None:
    assert parse_when("2026-01-31T12:00:00Z") == datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert parse_when("2026-01-31T12:00:00") == datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert parse_when("2026-01-31T13:00:00+01:00") == datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert parse_when("2026-01-31") == datetime(2026, 1, 31, tzinfo=UTC)
    assert parse_when("90s", now=NOW) == NOW - timedelta(seconds=90)
    assert parse_when("15m", now=NOW) == NOW - timedelta(minutes=15)
    assert parse_when("1.5h", now=NOW) == NOW - timedelta(minutes=90)
    assert parse_when("2d", now=NOW) == NOW - timedelta(days=2)
    assert parse_when("1w", now=NOW) == NOW - timedelta(weeks=1)


@pytest.mark.parametrize("text", ["", "1", "1y", "-1h", "h", "yesterday", "1h ago", "9" * 12 + "d"])
def test_parse_when_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_when(text)


def test_parse_at() -> None:
    assert parse_at("3:42") == (3, 42)
    for bad in ("3", "3:", ":4", "a:1", "1:-1", "-1:1", "1:2:3", "1:" + "9" * 30):
        with pytest.raises(ValueError, match="partition"):
            parse_at(bad)


def test_the_engines_headers_are_the_last_of_each_name() -> None:
    """An original record that carried its own dlq.* headers cannot pose as another reason
    or source: the engine's follow the original's."""
    d = letter(
        [
            ("dlq.reason", b"forged"),
            ("dlq.source", b"auth.state:0:1"),
            ("traceparent", b"00-abc-def-01"),
            ("dlq.reason", b"not_json"),
            ("dlq.source", b"auth.commands:2:9"),
        ]
    )
    assert d.reason == "not_json"
    assert d.source == Position("auth.commands", 2, 9)
    assert d.original_headers() == [("traceparent", b"00-abc-def-01")]
    assert not Filter.of(reasons=["forged"])(d)


def test_a_failed_delivery_reads_as_delivery_failed() -> None:
    d = letter(
        [
            ("webhook.id", b"msg_1"),
            ("webhook.endpoint", b"ep_1"),
            ("webhook.event_type", b"auth.status_changed"),
            ("webhook.attempts", b"8"),
            ("webhook.last_status", b"503"),
            ("webhook.last_error", b""),
        ]
    )
    assert d.reason == DELIVERY_FAILED
    assert d.detail == "endpoint ep_1 auth.status_changed, 8 attempts, last 503"
    assert d.summary()["webhook"]["endpoint"] == "ep_1"
    assert plan(d, {"auth.commands": 3}) == REPLAY_HINT


def test_plan() -> None:
    partitions = {"auth.commands": 3, "auth.status": 3}

    def of(source: bytes) -> Target | str:
        return plan(letter([("dlq.reason", b"invalid"), ("dlq.source", source)]), partitions)

    assert of(b"auth.commands:2:9") == Target("auth.commands", 2)
    assert of(b"auth.commands:3:9") == Target("auth.commands", None)  # keyed
    assert "not a topic the worker or dispatcher reads" in str(of(b"auth.state:0:1"))
    assert "is not <topic>:<partition>:<offset>" in str(of(b"\xff:0:1"))
    assert plan(letter([("dlq.reason", b"invalid")]), partitions) == "no dlq.source header"


def test_filter_time_bounds_are_half_open() -> None:
    at = datetime(2026, 3, 1, 12, tzinfo=UTC)
    d = letter([], timestamp_ms=int(at.timestamp() * 1000))
    assert Filter.of(since=at)(d)
    assert not Filter.of(until=at)(d)
    assert Filter.of(until=at + timedelta(milliseconds=1))(d)
    assert not Filter.of(since=at + timedelta(milliseconds=1))(d)


def test_printable_escapes_and_cuts() -> None:
    assert printable(b"\x1b]0;owned\x07ok", 64) == "\\x1b]0;owned\\x07ok"
    assert printable("a\u202eb".encode(), 64) == "a\\u202eb"  # right-to-left override
    assert printable(b"\xff\xfe", 64) == "hex:fffe"
    assert printable(b"x" * 100, 10) == "x" * 10 + "…"
    assert printable("é".encode() * 100, 3) == "ééé…"
    assert printable(b"\xff" * 100, 8) == "hex:" + "ff" * 4 + "…"
    # valid UTF-8 up to the cut, invalid after it: not text
    assert printable(b"a" * 100 + b"\xff", 10).startswith("hex:")


_header_names = st.one_of(
    st.sampled_from(
        ["dlq.reason", "dlq.detail", "dlq.source", "dlq.exception", "dlq.fingerprint",
         "dlq.attempts", "dlq.redriven", "webhook.id", "webhook.endpoint", "webhook.last_error",
         "traceparent"]
    ),
    st.text(max_size=20),
)  # fmt: skip
_header_values = st.one_of(
    st.none(),
    st.binary(max_size=300),
    st.text(max_size=100).map(str.encode),
    st.from_regex(r"[a-z.]{1,12}:[0-9-]{1,3}:[0-9-]{1,3}", fullmatch=True).map(str.encode),
)


@settings(max_examples=300, deadline=None)
@given(
    headers=st.lists(st.tuples(_header_names, _header_values), max_size=12),
    key=st.one_of(st.none(), st.binary(max_size=64), st.text(max_size=40).map(str.encode)),
    value=st.one_of(st.none(), st.binary(max_size=600), st.text(max_size=300).map(str.encode)),
    timestamp_ms=st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
def test_any_dead_letter_renders_safely(
    headers: list[tuple[str, bytes | None]],
    key: bytes | None,
    value: bytes | None,
    timestamp_ms: int,
) -> None:
    d = letter(headers, key=key, value=value, timestamp_ms=timestamp_ms)
    line = d.line()
    assert terminal_safe(line)
    assert len(line.split("\t")) == 7  # a tab inside a field is escaped
    for limit in (None, 16):
        assert terminal_safe(show_text(d, limit=limit))
        json.dumps(show_json(d, limit=limit))
    json.dumps(d.summary())
    plan(d, {"auth.commands": 3})
    Filter.of(reasons=["x"], keys=["acc_1"], source_topics=["auth.commands"], since=NOW)(d)
