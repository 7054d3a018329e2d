"""Smoke test of ``python -m bench.dispatcher_inproc``: a tiny run attempts every event once
through the real dispatcher (the program exits non-zero otherwise) and prints its figure."""

from __future__ import annotations

import re

from tests.bench import run_bench


def test_dispatcher_inproc_attempts_every_event_and_prints_its_cost() -> None:
    done = run_bench(
        "bench.dispatcher_inproc",
        "--events",
        "80",
        "--rounds",
        "1",
        timeout=180,  # a tiny run takes seconds; a loaded CI machine can take a minute to start it
    )
    cost = re.search(r"this: median ([0-9.]+) µs/delivery,", done.stdout)
    assert cost is not None and float(cost.group(1)) > 0, done.stdout
