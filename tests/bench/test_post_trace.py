"""``bench.post_trace``: the legs of a POST from its records' CreateTime, and what the slowest
1 % adds leg by leg."""

from __future__ import annotations

import json

import pytest

from bench import post_trace
from bench.post_trace import COMMANDS, REPLIES, STATE


def test_the_account_is_read_from_a_command_or_reply_and_anything_else_is_none() -> None:
    assert post_trace.account_of(json.dumps({"account_id": "acc_1"}).encode()) == "acc_1"
    for value in (None, b"", b"not json", b"[1]", b'{"account_id": 7}', b"{}"):
        assert post_trace.account_of(value) is None


def test_each_request_splits_into_ingress_worker_and_reply_legs() -> None:
    timings = {"a": (100.000, 100.100), "b": (101.000, 101.050), "lost": (102.0, 102.5)}
    stamps = {
        (COMMANDS, "a"): 100.010,
        (STATE, "a"): 100.055,
        (REPLIES, "a"): 100.070,
        (COMMANDS, "b"): 101.005,
        (STATE, "b"): 101.030,
        (REPLIES, "b"): 101.040,
        (COMMANDS, "lost"): 102.1,  # no state record or reply seen: not traced
    }
    rows = post_trace.legs(timings, stamps)
    assert len(rows) == 2
    a = next(r for r in rows if r["total"] == pytest.approx(100))
    assert a["ingress"] == pytest.approx(10)
    assert a["worker"] == pytest.approx(45)
    assert a["state_ack"] == pytest.approx(15)
    assert a["reply"] == pytest.approx(30)


def test_the_slowest_one_percent_shows_which_leg_grows() -> None:
    rows = [{"ingress": 1.0, "worker": 40.0, "state_ack": 2.0, "reply": 10.0, "total": 53.0}] * 198
    rows += [{"ingress": 1.0, "worker": 140.0, "state_ack": 2.0, "reply": 10.0, "total": 153.0}] * 2
    summary = post_trace.summary(rows)
    assert summary["traced"] == 200
    assert summary["median"]["worker"] == 40.0
    assert summary["slowest_1pct"] == {
        "ingress": 1.0,
        "worker": 140.0,
        "state_ack": 2.0,
        "reply": 10.0,
        "total": 153.0,
    }
    assert "slowest 1 %" in "\n".join(post_trace.lines(summary))
    assert post_trace.summary([]) == {"traced": 0}
