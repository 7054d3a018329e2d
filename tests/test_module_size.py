"""No module of ``worker/`` runs past 500 lines unless its docstring says why, on a line of its
own starting with ``Over 500 lines:``: a reader takes a module in at once, or is told up front
why this one is long."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT = 500
REASON = "Over 500 lines:"


def has_reason(source: str) -> bool:
    """Whether the module docstring has a line that starts with ``REASON``."""
    doc = ast.get_docstring(ast.parse(source)) or ""
    return any(line.strip().startswith(REASON) for line in doc.splitlines())


def too_long(root: Path) -> list[str]:
    """The modules under ``root/worker`` longer than ``LIMIT`` lines with no reason given."""
    found = []
    for path in sorted((root / "worker").rglob("*.py")):
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > LIMIT and not has_reason(source):
            found.append(f"{path.relative_to(root).as_posix()} ({lines} lines)")
    return found


def test_no_module_is_over_500_lines_without_a_reason() -> None:
    assert too_long(REPO) == []


def test_a_long_module_passes_with_its_reason_and_fails_without(tmp_path: Path) -> None:
    (tmp_path / "worker").mkdir()
    body = "x = 1\n" * LIMIT
    (tmp_path / "worker" / "short.py").write_text('"""Short."""\n' + "x = 1\n" * (LIMIT - 1))
    (tmp_path / "worker" / "long.py").write_text('"""Long."""\n' + body)
    (tmp_path / "worker" / "why.py").write_text(
        '"""Long, and why.\n\nOver 500 lines: one table read whole.\n"""\n' + body
    )
    (tmp_path / "worker" / "aside.py").write_text(
        '"""Mentions Over 500 lines: mid-line, which is no reason."""\n' + body
    )
    assert too_long(tmp_path) == ["worker/aside.py (501 lines)", "worker/long.py (501 lines)"]
