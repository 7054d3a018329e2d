"""No module of ``worker`` reaches into a library: no private attribute (``obj._name``) of a
library's object, no private method of a library's base class, no import from a library's
private module. Those change without notice between releases."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source import parse

REPO = Path(__file__).resolve().parents[1]

PUBLIC_DESPITE_UNDERSCORE = {("os", "_exit")}
"""Library names that start with an underscore yet are documented public API: ``os._exit``
(the standard library documents it; the runner exits with it when shutdown hangs)."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _defined_private_names(tree: ast.Module) -> set[str]:
    """The underscored names a module defines: functions, classes, names and attributes it
    assigns (on any object), names it imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return {name for name in names if _private(name)}


def _own_object(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def _private_reaches(tree: ast.Module) -> list[tuple[int, ast.expr, str]]:
    """Each ``obj._name`` (or ``getattr(obj, "_name")`` and kin) in ``tree``."""
    found: list[tuple[int, ast.expr, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            found.append((node.lineno, node.value, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            found.append((node.lineno, node.args[0], node.args[1].value))
    return found


def _private_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Each import of a library's private module or name (``from x._y import z``,
    ``from x import _z``, ``import x._y``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "worker":
                continue
            names = [alias.name for alias in node.names]
            if any(_private(part) for part in node.module.split(".")) or any(
                _private(name) for name in names
            ):
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != "worker" and any(_private(part) for part in parts):
                    found.append((node.lineno, f"import {alias.name}"))
    return found


def test_no_module_of_the_package_reaches_into_a_library() -> None:
    """Nothing in ``worker`` uses a library's private attribute or module: those change
    without notice between releases. ``obj._name`` is allowed only when the module itself
    defines ``_name`` (its own classes' internals), and ``self._name``/``cls._name`` when
    some module of the package does (a base class of ours); so a subclass of a library
    class (uvicorn's protocol) may not call the library's private methods either. Without
    types, a name the module also defines for itself is taken for its own."""
    trees = {path: parse(path) for path in sorted((REPO / "worker").rglob("*.py"))}
    defined = {path: _defined_private_names(tree) for path, tree in trees.items()}
    package = set().union(*defined.values())
    offenders: list[str] = []
    for path, tree in trees.items():
        where = path.relative_to(REPO)
        for line, value, attr in _private_reaches(tree):
            if isinstance(value, ast.Name) and (value.id, attr) in PUBLIC_DESPITE_UNDERSCORE:
                continue
            if attr not in (package if _own_object(value) else defined[path]):
                offenders.append(f"{where}:{line}: {ast.unparse(value)}.{attr}")
        offenders.extend(f"{where}:{line}: {text}" for line, text in _private_imports(tree))
    assert offenders == []


def test_the_private_access_check_finds_what_it_forbids() -> None:
    """The check above flags a library's private attribute on an object and on ``self``,
    private imports and ``getattr`` by name; it passes a module's own internals."""
    tree = ast.parse(
        "import aiokafka._x\n"
        "from uvicorn._compat import thing\n"
        "from aiokafka import _hidden\n"
        "class P(Base):\n"
        "    def __init__(self): self._mine = 1\n"
        "    def f(self, consumer):\n"
        "        consumer._client.update()\n"
        "        getattr(consumer, '_coordinator')\n"
        "        self._should_upgrade()\n"
        "        return self._mine, other._mine, self.__class__\n"
    )
    defined = _defined_private_names(tree)
    reached = sorted(
        (ast.unparse(value), attr)
        for _, value, attr in _private_reaches(tree)
        if attr not in defined
    )
    assert reached == [
        ("consumer", "_client"),
        ("consumer", "_coordinator"),
        ("self", "_should_upgrade"),
    ]
    assert [text for _, text in _private_imports(tree)] == [
        "import aiokafka._x",
        "from uvicorn._compat import thing",
        "from aiokafka import _hidden",
    ]
