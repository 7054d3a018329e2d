"""``--baseline REF`` of ``python -m bench``, ``bench.stack_cost`` and ``bench.webhooks``: the
same benchmark run from a copy of commit REF, alternating with the current tree, both printed
with their ratio (bench/README.md, "Against a baseline").

REF is copied with ``git archive`` into a temporary directory (removed at the end). Each run
is a subprocess on this interpreter (the current venv) with the tree as its working
directory and ``PYTHONPATH``, so ``import worker`` and ``import bench`` resolve to that tree
(checked before the first run): the baseline runs its own benchmark code against its own
product code. Runs alternate current, baseline, baseline, current, ... (the order flips each
round, so a machine that slows down during the session is charged to both alike); each writes
its results file into the temporary directory, never into the repository. Options the
baseline's benchmark does not know (``--help``) are left out of its runs, and
``--scenarios`` it does not have out of both trees' runs (a scenario before another in the
same run changes what the later one measures).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT

Figures = Callable[[dict[str, Any]], dict[str, float]]
"""The figures of one results file to compare, by name (NaN or absent: not measured)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baseline",
        metavar="REF",
        default=None,
        help="run the same benchmark from a copy of commit REF too, alternating with this "
        "tree, and print both with the ratio (bench.baseline)",
    )
    parser.add_argument(
        "--baseline-rounds",
        type=int,
        default=2,
        help="runs of each tree with --baseline (2; the order flips each round)",
    )
    parser.add_argument(
        "--baseline-json",
        type=Path,
        default=None,
        help="with --baseline: also write every run's figures and the ratios here",
    )


def strip_baseline_args(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--baseline*`` and their values (the runs' own arguments)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--baseline", "--baseline-rounds", "--baseline-json"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def copy_commit(ref: str, into: Path) -> str:
    """``git archive`` of ``ref`` unpacked in ``into``; returns the full commit id."""
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    archive = into.parent / f"{into.name}.tar"
    with archive.open("wb") as out:
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", commit], stdout=out, check=True
        )
    into.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return commit


def tree_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    return env


def check_imports(tree: Path) -> None:
    """``import worker`` and ``import bench`` in a run from ``tree`` resolve inside it."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import bench, worker; print(bench.__file__); print(worker.__file__)",
        ],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"a run from {tree} cannot import worker and bench:\n{done.stderr}")
    for path in done.stdout.split():
        if not Path(path).resolve().is_relative_to(tree.resolve()):
            raise RuntimeError(f"a run from {tree} imports {path}, outside it")


def known_options(module: str, tree: Path) -> set[str]:
    """The option strings ``python -m module --help`` lists in ``tree``."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
        check=False,
    )
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", done.stdout))


def known_scenarios(tree: Path) -> set[str] | None:
    """``python -m bench``'s scenario names in ``tree`` (None: not found)."""
    done = subprocess.run(
        [sys.executable, "-c", "from bench.run import SCENARIOS; print(','.join(SCENARIOS))"],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
        check=False,
    )
    return set(done.stdout.strip().split(",")) if done.returncode == 0 else None


def adapt(
    argv: list[str], parser: argparse.ArgumentParser, known: set[str], scenarios: set[str] | None
) -> tuple[list[str], list[str]]:
    """``argv`` without the options the other tree does not know (and their values), and
    ``--scenarios`` cut to the ones it has; returns (argv, what was left out)."""
    out: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        action = parser._option_string_actions.get(name) if name.startswith("--") else None
        takes = action is not None and action.nargs != 0 and not eq
        if action is not None and name not in known:
            dropped.append(arg if not takes else f"{arg} {argv[i + 1]}")
            i += 2 if takes else 1
            continue
        if name == "--scenarios" and scenarios is not None:
            given = value if eq else argv[i + 1]
            kept = [s for s in given.split(",") if s in scenarios]
            if kept != given.split(","):
                dropped.append(
                    f"--scenarios {','.join(s for s in given.split(',') if s not in kept)}"
                )
            out += ["--scenarios", ",".join(kept)]
            i += 1 if eq else 2
            continue
        out.append(arg)
        i += 1
    return out, dropped


def median(values: list[float]) -> float:
    real = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(real) if real else math.nan


INTERVAL = 0.90
"""The share of bootstrap resamples the printed interval of a ratio spans."""
RESAMPLES = 2000


def ratio_interval(
    current: list[float], baseline: list[float], *, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """A bootstrap interval (``INTERVAL``) of current's median ÷ baseline's: the rounds drawn
    again with replacement, as pairs (round i of each tree, run one after the other) when both
    sides have every round, else each side on its own; ``None`` below three rounds a side. The
    draws are seeded, so the same runs print the same interval."""
    pairs = [
        (c, b)
        for c, b in zip(current, baseline, strict=False)
        if not (math.isnan(c) or math.isnan(b))
    ]
    cur = [v for v in current if not math.isnan(v)]
    base = [v for v in baseline if not math.isnan(v)]
    paired = len(pairs) == len(current) == len(baseline)
    if min(len(cur), len(base)) < 3:
        return None
    rng = random.Random(seed)
    ratios: list[float] = []
    for _ in range(resamples):
        if paired:
            drawn = rng.choices(pairs, k=len(pairs))
            top = statistics.median(c for c, _ in drawn)
            bottom = statistics.median(b for _, b in drawn)
        else:
            top = statistics.median(rng.choices(cur, k=len(cur)))
            bottom = statistics.median(rng.choices(base, k=len(base)))
        if bottom:
            ratios.append(top / bottom)
    if not ratios:
        return None
    ratios.sort()
    tail = (1 - INTERVAL) / 2
    return ratios[int(tail * (len(ratios) - 1))], ratios[int((1 - tail) * (len(ratios) - 1))]


def run(
    *,
    module: str,
    argv: Sequence[str],
    parser: argparse.ArgumentParser,
    ref: str,
    rounds: int,
    out_args: Callable[[Path], list[str]],
    results_file: Callable[[Path], Path],
    figures: Figures,
    summary: Path | None = None,
) -> int:
    """Run ``python -m module argv`` ``rounds`` times from this tree and from ``ref``,
    alternating; print each figure per run and the ratio of the medians. ``out_args(dir)`` are
    the arguments that put a run's results into ``dir``, ``results_file(dir)`` is that file."""
    argv = strip_baseline_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    try:
        base_tree = work / "tree"
        commit = copy_commit(ref, base_tree)
        trees = {"current": REPO_ROOT, "baseline": base_tree}
        for tree in trees.values():
            check_imports(tree)
        scenarios = known_scenarios(base_tree) if module == "bench" else None
        base_argv, dropped = adapt(argv, parser, known_options(module, base_tree), scenarios)
        # The same scenarios on both sides: one run before another in the same broker and
        # simulator changes what the later one measures.
        argv, _ = adapt(argv, parser, set(parser._option_string_actions), scenarios)
        print(
            f"baseline {ref} = {commit[:12]} in {base_tree}; current = {REPO_ROOT}; "
            f"{rounds} round(s), alternating",
            file=sys.stderr,
        )
        if dropped:
            print(
                f"left out of the baseline's runs (scenarios: of both): {' '.join(dropped)}",
                file=sys.stderr,
            )
        runs: dict[str, list[dict[str, float]]] = {"current": [], "baseline": []}
        loads: list[tuple[str, int, float, float]] = []
        failed = 0
        for i in range(rounds):
            order = ("current", "baseline") if i % 2 == 0 else ("baseline", "current")
            for side in order:
                out_dir = work / f"{side}-{i}"
                out_dir.mkdir()
                args = [*(argv if side == "current" else base_argv), *out_args(out_dir)]
                load = os.getloadavg()[0]
                started = time.monotonic()
                print(
                    f"[{side} {i + 1}/{rounds}] python -m {module} {' '.join(args)}",
                    file=sys.stderr,
                )
                with (out_dir / "output.log").open("w") as log:
                    done = subprocess.run(
                        [sys.executable, "-m", module, *args],
                        cwd=trees[side],
                        env=tree_env(trees[side]),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        check=False,
                    )
                loads.append((side, i, load, os.getloadavg()[0]))
                path = results_file(out_dir)
                if done.returncode != 0 or not path.exists():
                    failed += 1
                    tail = (out_dir / "output.log").read_text(errors="replace")[-2000:]
                    print(f"[{side} {i + 1}] exited {done.returncode}:\n{tail}", file=sys.stderr)
                if path.exists():
                    runs[side].append(figures(json.loads(path.read_text())))
                print(
                    f"[{side} {i + 1}/{rounds}] {time.monotonic() - started:.0f} s, "
                    f"load average {load:.2f} → {os.getloadavg()[0]:.2f}",
                    file=sys.stderr,
                )
        table, ratios = compare(runs, ref, commit)
        print(table)
        print(
            "load average (1 min) at each run's start: "
            + ", ".join(f"{side[0]}{i + 1} {start:.2f}" for side, i, start, _ in loads)
        )
        if summary is not None:
            summary.write_text(
                json.dumps(
                    {
                        "module": module,
                        "work_dir": str(work),
                        "argv": argv,
                        "baseline_argv": base_argv,
                        "ref": ref,
                        "commit": commit,
                        "rounds": rounds,
                        "runs": runs,
                        "ratios": ratios,
                        "loadavg": loads,
                    },
                    indent=2,
                    default=lambda v: None,
                )
                + "\n"
            )
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(
    runs: dict[str, list[dict[str, float]]], ref: str, commit: str
) -> tuple[str, dict[str, float]]:
    """A table: each figure's value per run of each tree, the medians and current ÷ baseline."""
    names = list(dict.fromkeys(n for side in runs.values() for r in side for n in r))
    rows = [
        f"| figure | current (each run) | baseline {ref} = {commit[:8]} (each run) "
        f"| current ÷ baseline (medians) | its {INTERVAL * 100:.0f} % interval (bootstrap) |",
        "|---|---|---|---:|---|",
    ]
    ratios: dict[str, float] = {}

    def cells(side: str, name: str) -> str:
        return " / ".join(_num(r.get(name, math.nan)) for r in runs[side]) or "-"

    for name in names:
        values = {
            side: [_value(r.get(name)) for r in runs[side]] for side in ("current", "baseline")
        }
        cur, base = median(values["current"]), median(values["baseline"])
        ratio = cur / base if base and not math.isnan(cur) and not math.isnan(base) else math.nan
        if not math.isnan(ratio):
            ratios[name] = round(ratio, 3)
        interval = ratio_interval(values["current"], values["baseline"])
        rows.append(
            f"| {name} | {cells('current', name)} | {cells('baseline', name)} "
            f"| {'-' if math.isnan(ratio) else f'{ratio:.3f}'} "
            f"| {'-' if interval is None else f'{interval[0]:.3f} to {interval[1]:.3f}'} |"
        )
    return "\n".join(rows), ratios


def _value(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _num(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "-"
    return f"{v:,.1f}" if abs(v) < 100 else f"{v:,.0f}"


def pool(summaries: Sequence[Path]) -> tuple[str, dict[str, float]]:
    """The table of several runs' ``--baseline-json`` summaries pooled: their rounds side by
    side as one run's (a pair stays a pair); they must be of the same baseline commit."""
    loaded = [json.loads(Path(path).read_text()) for path in summaries]
    commits = {summary["commit"] for summary in loaded}
    if len(commits) != 1:
        raise SystemExit(f"the summaries are of different baselines: {sorted(commits)}")
    runs: dict[str, list[dict[str, float]]] = {"current": [], "baseline": []}
    for summary in loaded:
        for side in runs:
            runs[side].extend(summary["runs"][side])
    return compare(runs, loaded[0]["ref"], loaded[0]["commit"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.baseline",
        description="Pool the rounds of several --baseline-json summaries into one table.",
    )
    parser.add_argument("summaries", nargs="+", type=Path)
    args = parser.parse_args(argv)
    table, _ = pool(args.summaries)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
