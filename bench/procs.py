"""The benchmarks' child processes: start one with its output to a log file, stop a group,
profile one with py-spy."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO_ROOT


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int | None = None  # probes (/readyz, /metrics) of worker processes

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


def start_proc(name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> Proc:
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, *argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )
    return Proc(name, popen, log)


def stop_procs(procs: list[Proc], timeout: float = 15.0) -> None:
    for proc in procs:
        if proc.alive():
            proc.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(timeout=5)


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy (200 Hz, raw collapsed stacks, non-blocking) on ``pid`` into ``out`` until it
    exits or is stopped; None, with a note on stderr, when py-spy is not installed."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy not found; --profile ignored", file=sys.stderr)
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            *(spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"),
            *("--nonblocking", "--output", str(out)),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
