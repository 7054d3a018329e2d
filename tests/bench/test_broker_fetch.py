"""Smoke test of ``python -m bench.broker_fetch``: a tiny run, checked for completeness only
(no timing thresholds)."""

from __future__ import annotations

import json

import pytest

from tests.bench import run_bench


@pytest.mark.slow
def test_every_place_and_every_wait_is_measured() -> None:
    argv = ["--partitions", "4", "--history", "400", "--fetches", "5"]
    argv += ["--rate", "50", "--waits", "50,200", "--window-s", "2"]
    done = run_bench("bench.broker_fetch", *argv, timeout=120)
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    places = ["fetch-a[0]", "fetch-b[0]", "fetch-b[2]", "fetch-b[3]"]
    assert list(result["ms_per_fetch_before"]) == list(result["ms_per_fetch_after"]) == places
    assert [t["wait_ms"] for t in result["tails"]] == [50, 200]
    # The client counted its fetch requests, and the tail read what was produced meanwhile.
    assert all(t["fetches_per_s"] > 0 and t["records_per_s"] > 0 for t in result["tails"])
    assert "fetches/s" in done.stdout
