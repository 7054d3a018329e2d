"""Each package of ``worker/`` says what it offers (docs/architecture.md, "Where each concept
lives in the code"): its ``__init__`` has a docstring saying what the package is for and an
``__all__``. A package whose modules are imported by their full names (``worker.api.routes``)
lists exactly its public modules; a package that re-exports names (``worker.auth.provider``)
lists only names its ``__init__`` binds or modules it holds. Checked on the source, so no
package is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source import parse

REPO = Path(__file__).resolve().parents[1]


def public_modules(package: Path) -> set[str]:
    """The modules and subpackages of ``package`` whose names do not start with ``_``."""
    return {
        p.stem if p.suffix == ".py" else p.name
        for p in package.iterdir()
        if not p.name.startswith("_")
        and (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))
    }


def _bound(tree: ast.Module) -> tuple[set[str], bool]:
    """The names the module's top level binds, and whether any of them is imported (a
    re-exporting face)."""
    names: set[str] = set()
    imports = False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom | ast.Import):
            imports = True
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names - {"annotations"}, imports


def _all_of(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list | tuple)
            return [str(v) for v in value]
    return None


def faults(root: Path) -> list[str]:
    """What is wrong with the face of each package under ``root/worker``."""
    wrong = []
    for init in sorted((root / "worker").rglob("__init__.py")):
        package = init.parent
        rel = init.relative_to(root).as_posix()
        tree = parse(init)
        if not (ast.get_docstring(tree) or "").strip():
            wrong.append(f"{rel} has no docstring")
        names = _all_of(tree)
        if names is None:
            wrong.append(f"{rel} has no __all__")
            continue
        modules = public_modules(package)
        bound, reexports = _bound(tree)
        wrong.extend(
            f"{rel} lists {name!r}, which is neither bound there nor a module"
            for name in sorted(set(names) - bound - modules - {"__all__"})
        )
        if len(names) != len(set(names)):
            wrong.append(f"{rel} lists a name twice")
        if not reexports:
            wrong.extend(
                f"{rel} does not list its module {name!r}" for name in sorted(modules - set(names))
            )
    return wrong


def test_every_package_names_what_it_offers() -> None:
    assert faults(REPO) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_missing_docstring_or_all_is_found(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "worker/__init__.py": '__version__ = "1"\n__all__ = ["__version__", "engine"]\n',
            "worker/engine/__init__.py": '"""The engine."""\n',
        },
    )
    assert faults(tmp_path) == [
        "worker/__init__.py has no docstring",
        "worker/engine/__init__.py has no __all__",
    ]


def test_a_name_that_does_not_exist_and_a_module_left_out_are_found(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "worker/__init__.py": '"""The product."""\n__all__ = ["engine", "gone"]\n',
            "worker/cli.py": "",
            "worker/_private.py": "",
            "worker/engine/__init__.py": '"""The engine."""\n__all__ = ["lanes"]\n',
            "worker/engine/lanes.py": "",
            "worker/static/page.html": "",
        },
    )
    assert faults(tmp_path) == [
        "worker/__init__.py lists 'gone', which is neither bound there nor a module",
        "worker/__init__.py does not list its module 'cli'",
    ]


def test_a_re_exporting_face_lists_only_what_it_binds(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "worker/__init__.py": '"""The product."""\n__all__ = ["http1"]\n',
            "worker/http1/__init__.py": (
                '"""The client."""\n'
                "from worker.http1.client import Client\n"
                '__all__ = ["Client", "wire", "Missing"]\n'
            ),
            "worker/http1/client.py": "class Client: ...\n",
            "worker/http1/wire.py": "",
        },
    )
    assert faults(tmp_path) == [
        "worker/http1/__init__.py lists 'Missing', which is neither bound there nor a module",
    ]
