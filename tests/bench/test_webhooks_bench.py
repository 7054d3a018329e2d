"""Smoke test of ``python -m bench.webhooks``: a tiny run end to end in its own process (its
own broker, dispatcher and receiver processes), with the receiver verifying every signature.
Checked for completeness only: no timing thresholds, the numbers depend on the machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.webhooks import Events, HookBench, build_parser
from tests.bench import run_bench
from worker.contract.messages import AuthStatusChanged
from worker.settings import Settings
from worker.webhooks.secrets_box import generate_key


def test_events_interleave_accounts_and_count_versions_up() -> None:
    events = Events("t", count=6, versions=3)
    assert events.accounts == 2
    decoded = [AuthStatusChanged.model_validate_json(events.at(i, 1.7e9)[2]) for i in range(6)]
    assert [(e.account_id[-1], e.version) for e in decoded] == [
        ("0", 1),
        ("1", 1),
        ("0", 2),
        ("1", 2),
        ("0", 3),
        ("1", 3),
    ]
    assert [e.event_id for e in decoded] == list(events.ids())
    assert decoded[0].occurred_at.endswith("Z")


def test_the_take_in_hold_asked_for_reaches_the_dispatcher_and_none_leaves_its_default(
    tmp_path: Path,
) -> None:
    """``--take-in-hold-s`` prices the hold (bench/README.md, "Session 27"): the dispatcher gets
    it; without it, the bench's environment passes no ``WEBHOOK_*`` of its own."""
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:9", webhook_secrets_key=generate_key())
    asked = build_parser().parse_args(["--take-in-hold-s", "10"])
    held = HookBench(asked, settings, None, tmp_path)
    assert held.dispatcher_env()["WEBHOOK_TAKE_IN_HOLD_S"] == "10.0"
    plain = HookBench(build_parser().parse_args([]), settings, None, tmp_path)
    assert "WEBHOOK_TAKE_IN_HOLD_S" not in plain.dispatcher_env()


@pytest.mark.slow
def test_tiny_webhook_bench_run_delivers_everything(tmp_path: Path) -> None:
    out = tmp_path / "webhooks-results.json"
    argv = [
        *("--events", "500", "--seconds", "2", "--fractions", "0.5"),
        *("--noisy-seconds", "2", "--noisy-rate", "50"),
        *("--verify", "--phase-timeout", "60", "--out", str(out)),
    ]
    done = run_bench("bench.webhooks", *argv, timeout=150)
    results: dict[str, Any] = json.loads(out.read_text())
    assert not results["failures"]

    # The floor signs as the dispatcher does: the receiver verified every delivery of it.
    floor = results["floor"]
    assert floor["complete"] and floor["delivered"] == floor["events"] == 500
    assert floor["verified"] == floor["requests"] >= 500 and floor["verify_failed"] == 0
    assert floor["duplicates"] == 0 and floor["cpu_us_per_delivery"]["total"] > 0
    # Once before the dispatcher and once after it, so neither always runs first; the mean.
    assert [(r["when"], r["complete"]) for r in floor["runs"]] == [
        ("before", True),
        ("after", True),
    ]
    totals = [r["cpu_us_per_delivery"] for r in floor["runs"]]
    assert floor["cpu_us_per_delivery"]["total"] == round(sum(totals) / 2, 1)
    assert "before the dispatcher" in done.stdout and "after the dispatcher" in done.stdout
    by_floor = results["by_floor"]
    assert by_floor["floor_us"] == floor["cpu_us_per_delivery"]["total"]
    assert by_floor["cpu_ratio"] > 0 and "dispatcher ÷ floor" in done.stdout

    top = results["max_rate"]
    assert top["complete"] and top["delivered"] == top["events"] == 500
    assert top["verified"] == top["requests"] >= 500 and top["verify_failed"] == 0
    assert top["deliveries_per_s"] > 0
    assert set(top["cpu_us_per_delivery"]) == {"user", "system", "total"}
    assert top["cpu_us_per_delivery"]["total"] > 0
    assert set(top["cpu_cores"]) == {"dispatcher", "receiver", "broker", "bench", "others"}

    [point] = results["latency_curve"]
    assert point["fraction_of_max"] == 0.5
    assert point["complete"] and point["delivered"] == point["events"] == point["sent"]
    assert point["verify_failed"] == 0 and point["verified"] >= point["events"]
    assert point["latency_ms"]["p99"] >= point["latency_ms"]["p50"] > 0
    assert point["cpu_us_per_delivery"]["total"] > 0

    noisy = results["noisy_neighbour"]
    for half in (noisy["alone"], noisy["beside_hanging"]):
        assert half["complete"] and half["delivered"] == half["events"] == 100
        assert half["verify_failed"] == 0
    assert noisy["p99_alone_ms"] == noisy["alone"]["latency_ms"]["p99"] > 0
    assert noisy["ratio"] == round(noisy["p99_beside_hanging_ms"] / noisy["p99_alone_ms"], 2)
    assert noisy["hanging_endpoint"]["connections"] >= 1, "the hanging endpoint was tried"

    assert [a["measured"] is not None for a in results["aims"]] == [True, True, True]
    assert "deliveries/s" in done.stdout and "p99" in done.stdout
    assert "noisy neighbour: healthy p99" in done.stdout
