"""Smoke test of ``python -m bench.broker_history``: a tiny run, checked for completeness only
(no timing thresholds)."""

from __future__ import annotations

import json

import pytest

from tests.bench import run_bench


@pytest.mark.slow
def test_every_window_of_every_topic_is_measured() -> None:
    argv = ["--topics", "2", "--steps", "2", "--records", "200", "--partitions", "3"]
    done = run_bench("bench.broker_history", *argv, timeout=120)
    windows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(w["topic"], w["history"]) for w in windows] == [
        (f"history-{t}", n) for t in range(2) for n in (200, 400)
    ]
    assert all(w["rate"] > 0 and w["broker_us_per_record"] >= 0 for w in windows)
    assert "µs/record" in done.stdout
