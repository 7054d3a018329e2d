"""``bench/`` is a tool of small modules, not a tangle: no module imports one that (directly or
through others) imports it back, counting imports inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source import parse

BENCH = Path(__file__).resolve().parents[2] / "bench"


def imports_of(path: Path) -> set[str]:
    """The ``bench.*`` modules ``path`` imports anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("bench."))
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == "bench":
                found.update(f"bench.{a.name}" for a in node.names)
            elif node.module.startswith("bench."):
                found.add(node.module)
    return found


def graph() -> dict[str, set[str]]:
    return {f"bench.{p.stem}": imports_of(p) for p in BENCH.glob("*.py")}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``edges``, or None (depth-first search with a path stack)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(edges.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(edges):
        found = visit(start, [])
        if found:
            return found
    return None


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_bench_has_no_import_cycle() -> None:
    edges = graph()
    assert "bench.run" in edges and edges["bench.webhooks"], "the scan sees the modules"
    assert cycle(edges) is None
