"""Smoke test of ``python -m bench.stack_cost``: a tiny run end to end in its own process
(it starts the dev stack and the ceiling itself), checked for completeness only. No timing
thresholds: the numbers depend on the machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.stack_cost import baseline_figures
from tests.bench import run_bench

ROLES = {"broker", "simulator", "worker", "dispatcher", "front-end", "receiver"}


@pytest.mark.slow
def test_tiny_stack_cost_run_has_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "stack-cost.json"
    argv = [
        *("--rounds", "1", "--requests", "60", "--ceiling-requests", "600"),
        *("--floor-requests", "300"),  # enough CPU ticks for a floor and a ratio
        *("--connections", "5", "--settle-s", "0.5", "--latency-s", "0.5", "--idle-s", "0.5"),
        *("--max-rate-guess", "100", "--out", str(out)),
    ]
    done = run_bench("bench.stack_cost", *argv, timeout=240)
    result = json.loads(out.read_text())
    assert set(result["pids"]) == ROLES
    (ceiling,) = result["ceiling"]
    (front,) = result["frontend"]
    assert ceiling["statuses"] == {"200": 600}
    assert front["statuses"] == {"200": 60}
    # The ceiling paced at the rate the front-end reached, which ran first in round one; the
    # front-end's own figure over its load alone, as the ceiling's.
    assert ceiling["offered_rate"] == front["rate"] and front["first"]
    assert front["frontend_window_s"] < front["window_s"]  # the stack's takes the settle
    (ratio,) = result["ratio"]
    assert ratio == pytest.approx(front["frontend_cpu"]["total_us"] / ceiling["cpu"]["total_us"])
    assert {"user_us", "system_us", "total_us"} <= set(ceiling["cpu"])
    assert set(front["cpu"]) == ROLES
    assert front["records_per_confirm"]["auth.commands"] == 1.0
    assert front["records_per_confirm"]["auth.replies"] == 1.0
    assert front["provider_calls_per_confirm"] >= 1.0
    assert len(result["ratio"]) == 1 and result["stack_us_spread"]["median"] > 0
    # The product's three processes apart from the dev stack's: their sum, and less.
    # Summed in the report's order, as the bench does: float sums depend on the order.
    wanted = ("front-end", "worker", "dispatcher")
    product = sum(c["total_us"] for name, c in front["cpu"].items() if name in wanted)
    assert front["product_total_us"] == product < front["stack_total_us"]
    (floor,) = result["floor"]
    assert floor["answered"] == 300 and floor["rate"] > 0
    assert floor["cpu"]["total_us"] > 0 and {"user_us", "system_us"} <= set(floor["cpu"])
    assert result["floor_us"] == [floor["cpu"]["total_us"]]
    (floor_ratio,) = result["floor_ratio"]
    assert floor_ratio is not None and floor_ratio > 1
    assert len(result["frontend_minus_floor_us"]) == 1
    (by_floor,) = result["frontend_by_floor"]
    assert by_floor == front["frontend_cpu"]["total_us"] / (
        ceiling["cpu"]["total_us"] + result["floor_us"][0]
    )
    # Each side's idle cost left out: smaller than the front-end's whole CPU, and the same
    # arithmetic as the JSON's own figures.
    idle = result["idle_cores"]
    assert {"ceiling", "floor-aiokafka", "front-end"} <= set(idle)
    (busy_ratio,) = result["frontend_by_floor_busy"]
    fe_busy = (
        front["frontend_cpu"]["total_us"]
        - idle["front-end"] * front["frontend_window_s"] * 1e6 / 60
    )
    ce_busy = ceiling["cpu"]["total_us"] - idle["ceiling"] * ceiling["window_s"] * 1e6 / 600
    fl_busy = (
        result["floor_us"][0] - idle["floor-aiokafka"] * result["floor"][0]["window_s"] * 1e6 / 300
    )
    assert busy_ratio == pytest.approx(fe_busy / (ce_busy + fl_busy))
    figures = baseline_figures(result)
    assert figures["front-end ÷ floor"] == by_floor
    assert {"stack µs/confirm", "worker µs/confirm", "p99 ms at 50%"} <= set(figures)
    assert figures["product µs/confirm"] == product
    # A baseline tree's rounds from before the product's figure: summed from its processes.
    older = {**result, "frontend": [{k: v for k, v in front.items() if k != "product_total_us"}]}
    assert baseline_figures(older)["product µs/confirm"] == pytest.approx(product)
    confluent = result["floor_confluent"]
    (floor,) = confluent["runs"]
    assert floor["answered"] == 300 and floor["cpu"]["total_us"] > 0
    assert confluent["floor_us"] == [floor["cpu"]["total_us"]]
    assert len(confluent["floor_ratio"]) == 1 and len(confluent["frontend_minus_floor_us"]) == 1
    assert [p["fraction"] for p in result["latency"]] == [0.1, 0.5, 0.9]
    for point in result["latency"]:
        assert {"p50_ms", "p99_ms", "offered_rate", "achieved_rate"} <= set(point)
        # Every request of the point traced from its command and reply records.
        assert point["trace"]["traced"] == point["requests"]
        assert point["trace"]["median"]["worker"] > 0
    assert "front-end" in done.stdout and "target" in done.stdout
    assert "Kafka floor" in done.stdout and "(ceiling + floor)" in done.stdout
    assert "Kafka floor, librdkafka" in done.stdout
    assert "front-end ÷ floor" in done.stdout
