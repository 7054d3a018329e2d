"""Smoke test of ``python -m bench.produce_cost``: a tiny run end to end (its own embedded
broker, a process per trial), checked for completeness only; no timing thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import run_bench


@pytest.mark.slow
def test_every_client_and_lane_count_is_measured(tmp_path: Path) -> None:
    out = tmp_path / "produce-cost.json"
    argv = ["--records", "100", "--rounds", "1", "--lingers", "0", "--in-flight", "1,5"]
    done = run_bench("bench.produce_cost", *argv, "--out", str(out), timeout=180)
    trials = json.loads(out.read_text())["trials"]
    seen = {(t["client"], t["in_flight"]): t for t in trials}
    assert set(seen) == {(c, n) for c in ("aiokafka", "confluent") for n in (1, 5)}
    for (_, lanes), trial in seen.items():
        assert trial["records"] == (100 if lanes == 1 else 1000)
        assert trial["rate"] > 0 and trial["total_us"] > 0
        assert trial["total_us"] == pytest.approx(trial["user_us"] + trial["system_us"])
    assert "median" in done.stdout
