"""Smoke test of ``python -m bench.stack_cost --replicas 3``: a tiny run end to end in its own
process, checked for completeness only. No timing thresholds: the numbers depend on the
machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import run_bench


@pytest.mark.slow
def test_tiny_replica_cost_run_has_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "replica-cost.json"
    argv = [
        *("--replicas", "3", "--rounds", "1", "--requests", "60", "--connections", "6"),
        *("--rate", "60", "--idle-s", "0.5", "--state-records", "300", "--ready-starts", "1"),
        *("--out", str(out)),
    ]
    done = run_bench("bench.stack_cost", *argv, timeout=240)
    result = json.loads(out.read_text())
    (round_,) = result["rounds"]
    assert round_["one"]["statuses"] == {"POST 200": 10, "GET 200": 10}
    assert round_["shared"]["statuses"] == {"POST 200": 30, "GET 200": 30}
    assert sorted(round_["shared"]["served"].values()) == [20, 20, 20]
    assert set(round_["shared"]["cpu"]) == {"replica-0", "replica-1", "replica-2"}
    assert round_["ratio_total"] > 0
    ready = result["seconds_to_ready"]
    assert len(ready["accounts"]) == len(ready["more_accounts"]) == 1
    assert "median ratio" in done.stdout and "to ready" in done.stdout
