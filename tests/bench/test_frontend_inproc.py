"""Smoke test of ``python -m bench.frontend_inproc``: a tiny run answers every POST with a 200
through the real front-end app (the program exits non-zero otherwise) and prints the figure."""

from __future__ import annotations

import re

from tests.bench import run_bench


def test_frontend_inproc_answers_every_post_and_prints_its_cost() -> None:
    done = run_bench(
        "bench.frontend_inproc",
        "--requests",
        "200",
        "--rounds",
        "1",
        "--concurrency",
        "10",
        timeout=180,  # a tiny run takes seconds; a loaded CI machine can take a minute to start it
    )
    cost = re.search(r"([0-9.]+) µs/POST best", done.stdout)
    assert cost is not None and float(cost.group(1)) > 0, done.stdout
