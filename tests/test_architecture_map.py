"""docs/architecture.md's map of the code ("Where each concept lives in the code") names every
module of ``worker/``, and nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def named_in_map(doc: str) -> set[str]:
    """The ``worker/...`` paths in the first column of the map's rows."""
    section = doc[doc.index("## Where each concept lives in the code") :]
    firsts = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {m for cell in firsts for m in re.findall(r"`(worker/[A-Za-z0-9_./]+)`", cell)}


def in_tree(root: Path) -> set[str]:
    """Every module of the package but the package markers and the ``-m`` entry point."""
    return {
        p.relative_to(root).as_posix()
        for p in (root / "worker").rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    }


def test_the_map_matches_the_tree() -> None:
    named = named_in_map((REPO / "docs" / "architecture.md").read_text())
    tree = in_tree(REPO)
    assert sorted(tree - named) == [], "modules the map does not name"
    assert sorted(named - tree) == [], "names in the map that are not in the tree"


def test_the_map_reader_sees_rows() -> None:
    doc = "## Where each concept lives in the code\n\n| `worker/a.py`, `worker/b/c.py` | x |\n"
    assert named_in_map(doc) == {"worker/a.py", "worker/b/c.py"}


def test_a_module_missing_from_the_map_is_found(tmp_path: Path) -> None:
    (tmp_path / "worker" / "engine").mkdir(parents=True)
    for name in ("__init__.py", "engine/__init__.py", "engine/new.py", "cli.py"):
        (tmp_path / "worker" / name).write_text("")
    assert in_tree(tmp_path) == {"worker/engine/new.py", "worker/cli.py"}
