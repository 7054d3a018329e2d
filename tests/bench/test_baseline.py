"""``--baseline REF`` (``bench.baseline``): the arguments a baseline's run gets, and tiny runs
of a tree against its own commit, checked for completeness only (no timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import baseline, run, webhooks
from tests.bench import run_bench


def test_baseline_arguments_are_not_passed_to_the_runs() -> None:
    argv = ["--commands", "10", "--baseline", "main", "--baseline-rounds=3", "--no-plot"]
    assert baseline.strip_baseline_args(argv) == ["--commands", "10", "--no-plot"]
    assert baseline.strip_baseline_args(["--baseline-json", "x.json", "-q"]) == ["-q"]


def test_options_and_scenarios_the_baseline_lacks_are_left_out() -> None:
    parser = run.build_parser()
    argv = ["--commands", "10", "--max-in-flight", "5", "--scenarios", "floor,worker-1p", "--quick"]
    known = {"--commands", "--scenarios", "--quick"}
    kept, dropped = baseline.adapt(argv, parser, known, {"ceiling", "worker-1p"})
    assert kept == ["--commands", "10", "--scenarios", "worker-1p", "--quick"]
    assert dropped == ["--max-in-flight 5", "--scenarios floor"]
    # The current tree's runs: every option kept, the same scenarios as the baseline's.
    everything = set(parser._option_string_actions)
    kept, _ = baseline.adapt(argv, parser, everything, {"ceiling", "worker-1p"})
    assert kept == [*argv[:4], "--scenarios", "worker-1p", "--quick"]
    kept, dropped = baseline.adapt(
        ["--no-floor", "--events=5"], webhooks.build_parser(), set(), None
    )
    assert kept == [] and dropped == ["--no-floor", "--events=5"]


def test_a_tree_imports_its_own_code(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    commit = baseline.copy_commit("HEAD", tree)
    assert len(commit) == 40 and (tree / "worker" / "__init__.py").exists()
    baseline.check_imports(tree)  # raises if worker or bench came from elsewhere
    with pytest.raises(RuntimeError, match="cannot import"):
        baseline.check_imports(tmp_path)  # not a tree: no bench to import
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    with pytest.raises(RuntimeError, match=r"cannot import|outside it"):
        baseline.check_imports(tmp_path)  # worker, if importable at all, is another tree's


@pytest.mark.slow
def test_bench_against_its_own_head_prints_the_ratio(tmp_path: Path) -> None:
    summary = tmp_path / "baseline.json"
    argv = [
        *("--quick", "--commands", "200", "--scenarios", "ceiling,worker-1p"),
        *("--curve=", "--memory-sizes=", "--restore-records", "0", "--phase-timeout", "60"),
        *("--baseline", "HEAD", "--baseline-rounds", "1", "--baseline-json", str(summary)),
    ]
    done = run_bench("bench", *argv, timeout=300)
    result = json.loads(summary.read_text())
    assert result["commit"] and result["rounds"] == 1
    for side in ("current", "baseline"):
        (figures,) = result["runs"][side]
        assert figures["worker-1p: CPU µs/cmd"] > 0 and figures["ceiling: ok cmd/s"] > 0
    assert result["ratios"]["worker-1p: CPU µs/cmd"] > 0
    assert "current ÷ baseline" in done.stdout and "| worker-1p: CPU µs/cmd |" in done.stdout
    assert not Path(result["work_dir"]).exists(), "the baseline's copy is removed"
    assert "load average" in done.stdout


@pytest.mark.slow
def test_webhooks_against_its_own_head_prints_the_ratio(tmp_path: Path) -> None:
    summary = tmp_path / "baseline.json"
    argv = [
        *("--events", "300", "--fractions=", "--noisy-seconds", "0", "--phase-timeout", "60"),
        *("--baseline", "HEAD", "--baseline-rounds", "1", "--baseline-json", str(summary)),
    ]
    done = run_bench("bench.webhooks", *argv, timeout=240)
    result = json.loads(summary.read_text())
    for side in ("current", "baseline"):
        (figures,) = result["runs"][side]
        assert figures["dispatcher deliveries/s"] > 0
        assert figures["dispatcher CPU µs/delivery"] > 0
    assert result["ratios"]["dispatcher CPU µs/delivery"] > 0
    assert "| dispatcher CPU µs/delivery |" in done.stdout
