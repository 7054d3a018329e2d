"""``--baseline REF`` (``bench.baseline``): the arguments a baseline's run gets, and tiny runs
of a tree against its own commit, checked for completeness only (no timings)."""

from __future__ import annotations

import json
import statistics
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


def test_the_ratios_interval_is_drawn_from_the_rounds_in_pairs_and_seeded() -> None:
    """Each round of a tree ran beside the other tree's round of the same index: drawn as pairs,
    a slowdown both shared (here round 3) widens the interval less than drawing each tree's
    rounds on their own would; the same rounds print the same interval."""
    shared = [1.0, 1.1, 1.6, 0.9, 1.0, 1.2, 0.95, 1.05]
    current = [200 * s for s in shared]
    base = [300 * s * (1.02 if i % 2 else 0.98) for i, s in enumerate(shared)]
    paired = baseline.ratio_interval(current, base)
    assert paired is not None
    low, high = paired
    assert low <= statistics.median(current) / statistics.median(base) <= high
    assert high < 0.75, "a third cheaper in every pair: the interval stays below three quarters"
    unpaired = baseline.ratio_interval(current, [*base, 300.0])  # not one round a side each
    assert unpaired is not None and unpaired[1] - unpaired[0] > high - low
    assert baseline.ratio_interval(current, base) == paired, "seeded"
    assert baseline.ratio_interval([1.0, 2.0], [1.0, 2.0]) is None, "two rounds tell nothing"
    same = baseline.ratio_interval([5.0] * 4, [5.0] * 4)
    assert same == (1.0, 1.0)


def test_the_table_prints_each_ratio_with_its_interval_and_a_zero_is_a_figure() -> None:
    runs = {
        "current": [{"a": 0.0, "b": 10.0}, {"a": 0.0, "b": 11.0}, {"a": 0.0, "b": 12.0}, {}],
        "baseline": [{"a": 1.0, "b": 20.0}, {"a": 1.0, "b": 21.0}, {"a": 1.0, "b": 22.0}, {}],
    }
    table, ratios = baseline.compare(runs, "REF", "0123456789")
    assert "90 % interval (bootstrap)" in table
    row_a = next(line for line in table.splitlines() if line.startswith("| a |"))
    assert row_a.endswith("| 0.000 | 0.000 to 0.000 |"), "zero is measured, not missing"
    row_b = next(line for line in table.splitlines() if line.startswith("| b |"))
    assert "| 0.524 |" in row_b and row_b.count(" to ") == 1
    assert ratios == {"a": 0.0, "b": 0.524}
    assert baseline.compare({**runs, "baseline": runs["baseline"][:2]}, "REF", "0")[0].endswith(
        "| - |"
    ), "two rounds of a side: no interval"


def test_summaries_of_one_baseline_are_pooled_pair_by_pair(tmp_path: Path) -> None:
    def summary(name: str, commit: str, current: list[float], base: list[float]) -> Path:
        path = tmp_path / name
        runs = {
            "current": [{"cpu": v} for v in current],
            "baseline": [{"cpu": v} for v in base],
        }
        path.write_text(json.dumps({"ref": "R", "commit": commit, "runs": runs}))
        return path

    first = summary("a.json", "c0ffee", [200.0, 210.0, 190.0], [300.0, 310.0, 290.0])
    second = summary("b.json", "c0ffee", [250.0, 240.0], [330.0, 320.0])
    table, ratios = baseline.pool([first, second])
    assert "| cpu | 200 / 210 / 190 / 250 / 240 | 300 / 310 / 290 / 330 / 320 |" in table
    assert ratios == {"cpu": round(210 / 310, 3)}
    assert " to " in table, "five pairs: an interval"
    other = summary("c.json", "decade", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    with pytest.raises(SystemExit, match="different baselines"):
        baseline.pool([first, other])
