"""Smoke test of ``python -m bench.decision``: a tiny run prints both figures (no timings)."""

from __future__ import annotations

import re

from tests.bench import run_bench


def test_decision_bench_prints_both_costs() -> None:
    done = run_bench("bench.decision", "--decisions", "200", "--repeat", "1", timeout=180)
    costs = re.findall(r"([0-9.]+) µs/decision", done.stdout)
    assert len(costs) == 2 and all(float(c) > 0 for c in costs), done.stdout
