"""Smoke test of ``python -m bench.speedups``: a tiny run prints every figure (no timings)."""

from __future__ import annotations

import re

from tests.bench import run_bench


def test_speedups_bench_prints_every_figure() -> None:
    done = run_bench(
        "bench.speedups", "--calls", "100", "--repeat", "1", "--accounts", "200", timeout=120
    )
    assert len(re.findall(r"([0-9.]+) µs/(?:call|id)", done.stdout)) == 3, done.stdout
    held = re.findall(r"([0-9.]+) B/account", done.stdout)
    assert len(held) == 6 and all(float(b) > 0 for b in held), done.stdout
