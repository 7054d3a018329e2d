"""The packages of ``worker/`` are layers (docs/architecture.md, "Where each concept lives in
the code"): each imports only from the ones below it, so the engine knows no process and the
contract and runtime know neither."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source import parse

REPO = Path(__file__).resolve().parents[1]

#: What each package may import from ``worker``: packages, and top-level modules by name.
ALLOWED: dict[str, set[str]] = {
    "runtime": set(),
    "contract": {"engine", "runtime", "settings", "speedups"},
    "engine": {"runtime", "speedups"},
    "auth": {"engine", "contract", "runtime", "settings", "speedups", "dlq"},
    "webhooks": {"engine", "contract", "runtime", "settings", "dlq"},
    "api": {"engine", "contract", "runtime", "settings", "webhooks"},
    "dlq": {"engine", "contract", "runtime", "settings"},
}
#: Modules that build a document from the code it describes, wherever that code lives.
DOCUMENT_BUILDERS = {"worker/contract/asyncapi.py", "worker/contract/schemas.py"}


def imported(tree: ast.AST) -> set[str]:
    """The first name after ``worker.`` of every import of the package in ``tree``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "worker":
                continue
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "worker" and len(parts) > 1:
                    found.add(parts[1])
    return found - {"__version__"}


def crossings(root: Path) -> list[str]:
    """Every import of a module of ``root/worker`` that its package's layer does not allow."""
    wrong = []
    for path in sorted((root / "worker").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = path.relative_to(root / "worker").parts
        if len(parts) < 2 or rel in DOCUMENT_BUILDERS:
            continue
        package = parts[0]
        allowed = ALLOWED[package] | {package}
        for name in sorted(imported(parse(path)) - allowed):
            wrong.append(f"{rel} imports worker.{name}")
    return wrong


def test_each_package_imports_only_the_layers_below_it() -> None:
    assert crossings(REPO) == []


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in (REPO / "worker").iterdir() if (p / "__init__.py").exists()}
    assert packages == set(ALLOWED)


def test_an_engine_module_importing_a_process_is_found(tmp_path: Path) -> None:
    (tmp_path / "worker" / "engine").mkdir(parents=True)
    (tmp_path / "worker" / "engine" / "loop.py").write_text(
        "from worker.auth.flow import decide\nimport worker.api.app\nfrom worker import settings\n"
    )
    assert crossings(tmp_path) == [
        "worker/engine/loop.py imports worker.api",
        "worker/engine/loop.py imports worker.auth",
        "worker/engine/loop.py imports worker.settings",
    ]
