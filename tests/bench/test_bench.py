"""Smoke test of ``python -m bench``: a tiny run end to end, in its own process (it
starts its own broker, simulator and contender processes), checked for completeness only.
No timing thresholds: the numbers depend on the machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.load import Workload, percentile
from tests.bench import run_bench
from worker.contract.messages import PasskeyConfirm, RegisterAccount, decode_command

SCENARIOS = ("ceiling", "floor", "batched", "baseline", "worker-1p", "worker-inproc")


def test_workload_commands_decode_as_the_worker_decodes_them() -> None:
    fresh = Workload("t1", commands=4, accounts=2, mix="fresh")
    assert fresh.registered == 4
    spread = Workload("t1", commands=5, accounts=2, mix="spread")
    assert spread.registered == 2
    for key, value, _ in spread.register_commands():
        assert isinstance(decode_command(key, value), RegisterAccount)
    accounts = []
    for i in range(5):
        command_id, key, value, outputs = spread.confirm(i, 1_700_000_000.0)
        cmd = decode_command(key, value)
        assert isinstance(cmd, PasskeyConfirm)
        assert cmd.command_id == command_id
        accounts.append(cmd.account_id)
        assert outputs.count(b"replies") == 1
    assert accounts[0] == accounts[2] == accounts[4] != accounts[1]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([3.0], 99) == 3.0


@pytest.mark.slow
def test_tiny_bench_run_measures_every_scenario(tmp_path: Path) -> None:
    argv = [
        *("--quick", "--commands", "300", "--accounts", "100"),
        *("--scenarios", ",".join(SCENARIOS)),
        *("--curve", "0.5", "--curve-seconds", "2"),
        *("--memory-sizes", "2000", "--restore-records", "2000"),
        *("--phase-timeout", "60", "--out-dir", str(tmp_path)),
    ]
    run_bench("bench", *argv, timeout=240)
    results: dict[str, Any] = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.png").stat().st_size > 0

    assert not results["failures"]
    assert set(results["scenarios"]) == set(SCENARIOS)
    for name, s in results["scenarios"].items():
        assert s["complete"], name
        assert s["replies"] == s["commands"] == 300, name
        assert s["ok_share"] == 1.0, (name, s["http_status"])
        assert s["throughput"] > 0, name
        assert s["latency_ms"]["p50"] > 0, name
        assert s["latency_ms"]["p99"] >= s["latency_ms"]["p50"], name
        assert s["cpu_us_per_command"] > 0, name
        assert s["peak_rss_mb"] > 0, name
    assert results["ratios"]["worker-inproc/ceiling"] > 0
    # The floor makes the provider calls the worker makes, and the worker's CPU is printed
    # over both the ceiling's and the floor's.
    scenarios = results["scenarios"]
    assert scenarios["floor"]["provider_calls_per_command"] == 1.0
    assert scenarios["worker-1p"]["provider_calls_per_command"] == 1.0
    assert scenarios["ceiling"]["provider_calls_per_command"] == 0.0
    by_cpu = results["cpu_ratios"]["worker-1p"]
    assert by_cpu["floor"] == round(
        scenarios["worker-1p"]["cpu_us_per_command"] / scenarios["floor"]["cpu_us_per_command"], 2
    )
    assert by_cpu["ceiling"] > 0
    # The batched contender makes the worker's calls too, and sits between floor and worker.
    assert scenarios["batched"]["provider_calls_per_command"] == 1.0
    assert by_cpu["batched"] == round(
        scenarios["worker-1p"]["cpu_us_per_command"] / scenarios["batched"]["cpu_us_per_command"],
        2,
    )
    assert results["cpu_ratios"]["batched"]["floor"] > 0
    assert results["ratios"]["worker-1p/baseline"] > 0

    [point] = results["latency_curve"]
    assert point["fraction_of_max"] == 0.5
    assert point["complete"] and point["latency_ms"]["p99"] > 0
    assert all(m["bytes_per_account"] > 0 for m in results["memory"])
    assert results["restore"]["records"] == 2000
    assert results["restore"]["records_per_s"] > 0
    assert {t["target"] for t in results["targets"]} and all(
        t["measured"] is not None for t in results["targets"]
    )


@pytest.mark.slow
def test_the_batched_contender_keeps_each_accounts_order_across_batches(tmp_path: Path) -> None:
    """Repeat confirms of one account land in overlapping batches (a 300 ms provider keeps
    each first confirm in flight while later batches arrive); each account's first confirm
    must be settled before its repeats are decided, or a repeat would be decided on the
    registered record and call the provider a second time (a contender that skips the wait
    for an earlier batch made 0.041 calls per command here, not 0.033)."""
    argv = [
        *("--scenarios", "batched-spread", "--commands", "3000", "--accounts", "100"),
        *("--rounds", "1"),
        *("--latency-ms", "300", "--jitter-ms", "0"),
        *("--curve=", "--memory-sizes=", "--restore-records", "0", "--no-plot"),
        *("--phase-timeout", "60", "--out-dir", str(tmp_path)),
    ]
    run_bench("bench", *argv, timeout=180)
    results: dict[str, Any] = json.loads((tmp_path / "results.json").read_text())
    assert not results["failures"]
    s = results["scenarios"]["batched-spread"]
    assert s["complete"] and s["replies"] == s["commands"] == 3000
    assert s["ok_share"] == 1.0, s["http_status"]
    assert s["provider_calls_per_command"] == round(100 / 3000, 3)  # one call per account


@pytest.mark.slow
def test_rounds_alternate_the_order_and_take_the_median(tmp_path: Path) -> None:
    """A process and its floor each run first once: the order is reversed every other round;
    each scenario's figure is the median of its rounds, every round's ratio printed."""
    argv = [
        *("--scenarios", "floor,batched", "--commands", "300", "--accounts", "100"),
        *("--rounds", "2", "--settle-s", "0.2"),
        *("--curve=", "--memory-sizes=", "--restore-records", "0", "--no-plot"),
        *("--phase-timeout", "60", "--out-dir", str(tmp_path)),
    ]
    done = run_bench("bench", *argv, timeout=240)
    results: dict[str, Any] = json.loads((tmp_path / "results.json").read_text())
    assert not results["failures"]
    assert results["order"] == ["floor-r1", "batched-r1", "batched-r2", "floor-r2"]
    floor = results["scenarios"]["floor"]
    assert [r["name"] for r in floor["rounds"]] == ["floor-r1", "floor-r2"]
    cpus = sorted(r["cpu_us_per_command"] for r in floor["rounds"])
    assert floor["cpu_us_per_command"] == round(sum(cpus) / 2, 1)
    [first, second] = results["cpu_ratios_by_round"]
    assert first["batched"]["floor"] > 0 and second["batched"]["floor"] > 0
    assert "batched CPU ÷ floor, each round" in done.stdout
