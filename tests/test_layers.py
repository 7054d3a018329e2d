"""The packages and top-level modules of ``worker/`` are layers (docs/architecture.md, "Where
each concept lives in the code"): each imports only what its layer allows, so the engine knows
no process, the contract knows no process nor settings, and the document builders sit above
everything they describe. Every import counts, at the top of a module or inside a function,
and no module is exempt."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source import parse

REPO = Path(__file__).resolve().parents[1]

_BELOW_SETTINGS = {"runtime", "engine", "contract"}
_BELOW_PROCESSES = {*_BELOW_SETTINGS, "settings", "dlq", "startup"}
_PROCESSES = {"auth", "webhooks", "dispatcher", "api"}
_EVERYTHING = {*_BELOW_PROCESSES, *_PROCESSES, "documents"}

#: What each layer (a package, or a top-level module by its name) may import from ``worker``
#: besides itself and the package's ``__init__`` (``__version__``, which imports nothing).
ALLOWED: dict[str, set[str]] = {
    "__init__": set(),
    "runtime": set(),
    "engine": {"runtime"},
    "contract": {"runtime", "engine"},
    "settings": _BELOW_SETTINGS,
    "dlq": {*_BELOW_SETTINGS, "settings"},
    # The composition roots' one start-up prologue (registry, broker health, topics verified):
    # above the settings it reads, below the three processes that run it first.
    "startup": {*_BELOW_SETTINGS, "settings"},
    "auth": _BELOW_PROCESSES,
    # The webhook library both the front-end and the dispatcher use (the endpoint registry
    # and store, signing, secrets at rest, URL checks, samples); its records are the contract's.
    "webhooks": _BELOW_PROCESSES,
    "dispatcher": {*_BELOW_PROCESSES, "webhooks"},
    "api": {*_BELOW_PROCESSES, "webhooks"},
    "documents": _EVERYTHING,
    "cli": _EVERYTHING | {"preflight"},
    "preflight": _EVERYTHING,
    "__main__": _EVERYTHING | {"cli", "preflight"},
}


def _layer_of(module: str) -> str:
    """``worker.api.app`` → ``api``; ``worker.settings`` → ``settings``; ``worker`` →
    ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module ``node`` imports from, resolving a relative import against
    ``module`` (the dotted name of the file it is in)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported(tree: ast.AST, module: str = "worker.x", is_package: bool = False) -> set[str]:
    """The layer of every import of the ``worker`` package in ``tree``, wherever the import
    stands (module top, function body, ``try`` block); ``module`` is the dotted name of the
    file, to resolve relative imports."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, is_package)
            if source.split(".")[0] != "worker":
                continue
            if source == "worker":
                # ``from worker import settings``: a module of the package, or its attribute.
                found.update(
                    alias.name if alias.name != "__version__" else "__init__"
                    for alias in node.names
                )
            else:
                found.add(_layer_of(source))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "worker":
                    found.add(_layer_of(alias.name))
    return found


def crossings(root: Path) -> list[str]:
    """Every import by a module of ``root/worker`` that its layer does not allow."""
    wrong = []
    package_root = root / "worker"
    for path in sorted(package_root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = path.relative_to(package_root).with_suffix("").parts
        layer = parts[0]
        is_package = parts[-1] == "__init__"
        dotted = ".".join(("worker", *(parts[:-1] if is_package else parts)))
        allowed = ALLOWED.get(layer)
        if allowed is None:
            wrong.append(f"{rel} has no layer")
            continue
        for name in sorted(
            imported(parse(path), dotted, is_package) - allowed - {layer, "__init__"}
        ):
            wrong.append(f"{rel} imports worker.{name}")
    return wrong


def test_each_module_imports_only_the_layers_below_it() -> None:
    assert crossings(REPO) == []


def test_every_package_and_top_level_module_has_a_layer() -> None:
    worker = REPO / "worker"
    layers = {p.name for p in worker.iterdir() if (p / "__init__.py").exists()}
    layers |= {p.stem for p in worker.glob("*.py")}
    assert layers == set(ALLOWED)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_an_engine_module_importing_a_process_is_found(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "worker/engine/loop.py": (
                "from worker.auth.flow import decide\n"
                "import worker.api.app\n"
                "from worker import settings\n"
                "from worker.runtime import logs\n"
            )
        },
    )
    assert crossings(tmp_path) == [
        "worker/engine/loop.py imports worker.api",
        "worker/engine/loop.py imports worker.auth",
        "worker/engine/loop.py imports worker.settings",
    ]


def test_a_top_level_module_importing_a_process_is_found(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "worker/settings.py": "from worker.webhooks.limits import MAX_EVENTS\n",
            "worker/cli.py": "from worker.api.app import serve_api\nimport worker.documents\n",
        },
    )
    assert crossings(tmp_path) == [
        "worker/settings.py imports worker.webhooks",
    ]


def test_a_contract_module_importing_webhooks_is_found_even_inside_a_function(
    tmp_path: Path,
) -> None:
    _tree(
        tmp_path,
        {
            "worker/contract/__init__.py": "",
            "worker/contract/wire.py": (
                "from worker.engine.topics import COMPACTED\n"
                "def build():\n"
                "    try:\n"
                "        from worker.webhooks.delivery import DeliveryState\n"
                "    except ImportError:\n"
                "        pass\n"
                "    from ..settings import Settings\n"
            ),
        },
    )
    assert crossings(tmp_path) == [
        "worker/contract/wire.py imports worker.settings",
        "worker/contract/wire.py imports worker.webhooks",
    ]


def test_a_process_importing_another_or_the_documents_is_found(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "worker/api/app.py": "from worker.documents.openapi import openapi_route\n",
            "worker/webhooks/gate.py": "from worker.auth import flow\n",
            "worker/auth/flow.py": "from worker.webhooks.limits import MAX\n",
            "worker/documents/export.py": "from worker.api import app\nfrom worker.auth import x\n",
        },
    )
    assert crossings(tmp_path) == [
        "worker/api/app.py imports worker.documents",
        "worker/auth/flow.py imports worker.webhooks",
        "worker/webhooks/gate.py imports worker.auth",
    ]


def test_the_front_end_and_the_dispatcher_share_only_the_webhook_library_and_the_contract() -> None:
    """The front-end reads the dispatcher's records from ``worker.contract``, never from the
    dispatcher, and no process imports another: what both use that is not a record is the
    shared ``worker.webhooks`` library."""
    for process in ("api", "dispatcher"):
        assert "webhooks" in ALLOWED[process]
        assert not ALLOWED[process] & {"auth", "api", "dispatcher"} - {process}
    assert not ALLOWED["webhooks"] & _PROCESSES
    assert not ALLOWED["auth"] & _PROCESSES


def test_a_front_end_module_importing_the_dispatcher_is_found(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "worker/api/webhooks/log.py": (
                "from worker.contract.delivery_log import DeliveryLogEntry\n"
                "from worker.webhooks.endpoints import EndpointsTail\n"
                "from worker.dispatcher.publish import DeliveryPublisher\n"
            ),
            "worker/dispatcher/gate.py": (
                "from worker.webhooks.targets import TargetPolicy\n"
                "def late():\n"
                "    from worker.api.webhooks import routes\n"
            ),
            "worker/webhooks/registry.py": "from worker.dispatcher.delivery import webhook_id\n",
        },
    )
    assert crossings(tmp_path) == [
        "worker/api/webhooks/log.py imports worker.dispatcher",
        "worker/dispatcher/gate.py imports worker.api",
        "worker/webhooks/registry.py imports worker.dispatcher",
    ]


def test_a_module_outside_every_layer_is_found(tmp_path: Path) -> None:
    _tree(tmp_path, {"worker/extras/thing.py": "import json\n"})
    assert crossings(tmp_path) == ["worker/extras/thing.py has no layer"]


# Direction inside a package. A package's composition roots wire its modules together, so
# they import nearly everything in it; a module of a subpackage importing one of them would
# point back up. Below the roots, the rule is the graph's: no module imports one that
# (transitively) imports it back, type-only imports included, so every module can be read,
# tested and moved knowing only what is under it.

#: Each package's composition roots, which no module of its subpackages may import.
ROOTS: dict[str, set[str]] = {
    "worker.api": {"app", "routes", "server"},
    "worker.auth": {"app"},
    "worker.dispatcher": {"app"},
    "worker.documents": {"export"},
}


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Every module of ``root/worker`` by dotted name, with its path and whether it is a
    package's ``__init__``."""
    found = {}
    package_root = root / "worker"
    for path in sorted(package_root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _module_named(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """The module ``name`` denotes: itself, or the longest dotted prefix that is a module (an
    attribute of it was imported)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(root: Path) -> dict[str, set[str]]:
    """Which ``worker`` modules each module of ``root/worker`` imports, every import counted:
    at the top, in a function, under ``if TYPE_CHECKING:``. ``from p import m`` is an edge to
    the module ``p.m`` when there is one, else to ``p`` (an attribute of it); the packages
    Python imports on the way to a module are not edges (a package's ``__init__`` naming its
    modules would otherwise close a circle with each)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        edges: set[str | None] = set()
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, name, is_package)
                if source.split(".")[0] != "worker":
                    continue
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    edges.add(full if full in modules else _module_named(source, modules))
            elif isinstance(node, ast.Import):
                edges.update(
                    _module_named(alias.name, modules)
                    for alias in node.names
                    if alias.name.split(".")[0] == "worker"
                )
        graph[name] = {e for e in edges if e is not None and e != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each set of modules that import each other in a circle (a strongly connected component
    of more than one module), sorted; iterative Tarjan, so no recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def upward(root: Path) -> list[str]:
    """Every import of a package's composition root (``ROOTS``) by a module of one of its
    subpackages (or by a subpackage's ``__init__``)."""
    modules = _modules(root)
    wrong: list[str] = []
    for module, imports in sorted(import_graph(root).items()):
        for package, roots in ROOTS.items():
            rel = module.removeprefix(f"{package}.")
            if rel == module or ("." not in rel and not modules[module][1]):
                continue  # outside the package, or one of its own top modules
            wrong.extend(
                f"{module} imports {target}"
                for target in sorted(imports)
                if target.removeprefix(f"{package}.") in roots
            )
    return wrong


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert cycles(import_graph(REPO)) == []


def test_no_subpackage_imports_its_package_composition_roots() -> None:
    assert upward(REPO) == []


def test_every_named_composition_root_exists() -> None:
    modules = _modules(REPO)
    assert {f"{p}.{r}" for p, roots in ROOTS.items() for r in roots} <= set(modules)


def test_a_type_only_circle_is_found(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "worker/__init__.py": "",
            "worker/dispatcher/__init__.py": "",
            "worker/dispatcher/log.py": "from worker.dispatcher.sender import Sender\n",
            "worker/dispatcher/sender.py": "from worker.dispatcher import delivery\n",
            "worker/dispatcher/delivery.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .log import Entry\n"
            ),
            "worker/dispatcher/alone.py": "def f():\n    import worker.dispatcher.log\n",
        },
    )
    graph = import_graph(tmp_path)
    assert graph["worker.dispatcher.alone"] == {"worker.dispatcher.log"}
    assert cycles(graph) == [
        ["worker.dispatcher.delivery", "worker.dispatcher.log", "worker.dispatcher.sender"]
    ]


def test_a_circle_through_a_function_body_import_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"b"}, "e": {"a"}, "f": {"f"}}
    assert cycles(graph) == [["b", "c", "d"]]


def test_a_subpackage_importing_its_package_root_is_found(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "worker/api/__init__.py": "",
            "worker/api/routes.py": "from worker.api.reading import request_id_of\n",
            "worker/api/reading.py": "",
            "worker/api/app.py": "from worker.api.portal import sessions\n",
            "worker/api/keys.py": "from worker.api.routes import X\n",
            "worker/api/portal/__init__.py": "",
            "worker/api/portal/sessions.py": (
                "from worker.api.routes import request_id_of\n"
                "from worker.api.keys import KeyStore\n"
                "from worker.api.webhooks.bodies import json_object_body\n"
            ),
            "worker/api/webhooks/__init__.py": "",
            "worker/api/webhooks/bodies.py": "from worker.api import app\n",
        },
    )
    assert upward(tmp_path) == [
        "worker.api.portal.sessions imports worker.api.routes",
        "worker.api.webhooks.bodies imports worker.api.app",
    ]
