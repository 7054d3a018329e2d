"""A SIGTERM that lands while a process is still starting ends it with status 0
(``worker.runtime.early_stop``), and every entry point installs that before its heavy imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

STARTING = """
import os, signal, time
from worker.runtime.early_stop import exit_on_sigterm_while_starting
exit_on_sigterm_while_starting()
os.kill(os.getpid(), signal.SIGTERM)  # as an orchestrator would, mid-start
time.sleep(30)  # the imports and connections a start does; never reached
"""


def test_a_sigterm_while_starting_exits_with_status_0() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STARTING], cwd=REPO, timeout=30, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_without_it_the_same_sigterm_kills_the_process() -> None:
    """The control: Python's default for SIGTERM is to die by the signal."""
    script = STARTING.replace("exit_on_sigterm_while_starting()\n", "")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=30)
    assert done.returncode == -15


def test_every_entry_point_installs_it_before_anything_else() -> None:
    for main in ("worker/__main__.py", "devstack/__main__.py"):
        body = ast.parse((REPO / main).read_text()).body
        statements = [
            s
            for s in body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            and not (isinstance(s, ast.ImportFrom) and s.module == "__future__")
        ]
        first, second = statements[0], statements[1]
        assert isinstance(first, ast.ImportFrom), main
        assert first.module == "worker.runtime.early_stop", main
        assert isinstance(second, ast.Expr) and isinstance(second.value, ast.Call), main
        call = second.value.func
        assert isinstance(call, ast.Name) and call.id == "exit_on_sigterm_while_starting", main
