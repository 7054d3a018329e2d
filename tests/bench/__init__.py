"""Smoke tests of the benchmark's programs: each runs one in its own process, tiny, and checks
that every figure is there; none asserts a timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_bench(module: str, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <module> argv`` from the repository root; asserts it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done
