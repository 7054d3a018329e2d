"""Every structure of ``worker/`` that outside input could grow has a row in docs/architecture.md,
"Resource bounds", or a line in ``NOT_GROWN`` below saying why outside input cannot grow it.

What counts as such a structure, found with ``ast`` in every module of the package: a
module-level or class-level name, or a ``self.<name>`` assigned in a class, whose value is a
container (a dict, set or list display or comprehension; ``dict``, ``set``, ``list``, ``deque``,
``defaultdict``, ``OrderedDict``, ``collections.Counter``, ``heapq``-fed lists, weak maps), a
lock, semaphore, condition or queue (their waiters are a queue), or a thread pool, or whose
annotation is such a type. It is named ``<path below worker/>:<Class>.<attr>`` (or
``<path>:<NAME>`` at module level), e.g. ``api/request_rate.py:RateLimiter._buckets``; a row
names it in backticks in that form.

The table's "test" column must name test files that exist (and ``file::test`` names that are
defined there), and every structure the table names must still be in the code.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.source import parse

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "worker"
DOC = REPO / "docs" / "architecture.md"
SECTION = "## Resource bounds"

#: Constructors whose result grows (or queues its waiters), by the name they are called with.
#: ``Counter`` counts only when it is ``collections.Counter`` (prometheus_client has one too).
GROWING_CALLS = frozenset(
    {
        "dict",
        "set",
        "list",
        "bytearray",
        "deque",
        "defaultdict",
        "OrderedDict",
        "Counter",
        "ChainMap",
        "WeakValueDictionary",
        "WeakKeyDictionary",
        "WeakSet",
        "Queue",
        "LifoQueue",
        "PriorityQueue",
        "SimpleQueue",
        "Lock",
        "RLock",
        "Semaphore",
        "BoundedSemaphore",
        "Condition",
        "ThreadPoolExecutor",
        "ProcessPoolExecutor",
    }
)
#: Annotations that say a container (the outermost type, ``| None`` and ``ClassVar`` unwrapped).
GROWING_TYPES = frozenset(
    {
        "dict",
        "set",
        "list",
        "bytearray",
        "deque",
        "defaultdict",
        "OrderedDict",
        "Counter",
        "ChainMap",
        "Dict",
        "Set",
        "List",
        "Deque",
        "DefaultDict",
        "MutableMapping",
        "MutableSet",
        "MutableSequence",
        "WeakValueDictionary",
        "WeakKeyDictionary",
        "WeakSet",
        "Queue",
        "ThreadPoolExecutor",
    }
)

# Structures outside input cannot grow, each with why. Anything else the scan finds needs a row
# in the doc's table. Keep the reason to one line; an entry that no longer matches fails the
# test (``test_the_allow_list_names_only_what_is_there``).
NOT_GROWN: dict[str, str] = {
    "engine/compacted_view.py:CompactedView.takers": "one entry per record kind another owner"
    " keeps (rp_, ps_): filled at start-up",
    "runtime/tracing.py:_Carried._kafka": "one message's fields: a command's trace headers",
    "runtime/tracing.py:_Carried._http": "one message's fields: a command's trace headers",
    "auth/execute.py:_Step.headers": "one command's fields: its outputs' trace headers",
    "auth/publish.py:Output.headers": "one decision's fields: its records' trace headers",
    "engine/metrics.py:LoopSeries._children": "one entry per series looked up: fixed label"
    " sets of the code (types, verdicts, statuses, outcomes, catalogued errors, reasons) and"
    " the providers",
    "engine/tail.py:TopicTail._fetched": "a condition: its waiters are read_to_end calls,"
    " one per record the dispatcher is taking in, bounded by its consume loop, and"
    " CompactedView.until calls, one per replay-follow request (connections), each timed",
    # -- constants and registries built at import or start-up, never added to afterwards --
    "api/keys_cli.py:_UNIT_S": "constant: the CLI's time units",
    "dispatcher/intake.py:_REPLAYED": "constant: a replay's decoder by its source",
    "dispatcher/sender.py:DEFAULT_HEADERS": "constant: the sender's default request headers",
    "api/portal/page.py:PAGE_FILES": "constant: the portal page's three files",
    "api/portal/page.py:_HEADERS": "constant: the portal page's response headers",
    "documents/openapi/portal.py:PORTAL_SCHEME": "constant: the portal's security scheme",
    "api/routes.py:EXCEPTION_HANDLERS": "constant: Starlette's exception handlers",
    "api/middleware.py:FrontDoor._takes": "built at start-up from the app's fixed routes",
    "api/middleware.py:FrontDoor._allow": "built at start-up from the app's fixed routes",
    "api/middleware.py:FrontDoor._span_names": "built at start-up from the app's fixed routes",
    "api/middleware.py:FrontDoor._direct": "built at start-up from the app's fixed routes",
    "auth/machine.py:_OPEN": "constant: the statuses of a flow in progress",
    "auth/machine.py:TRANSITIONS": "constant: the state machine's transitions",
    "auth/provider/errors.py:_BY_TYPE": "constant: failure type to catalogued error",
    "auth/provider/registry.py:ProviderRegistry._adapters": "one adapter per PROVIDER_URLS entry",
    "auth/provider/transport.py:ProviderHttpClient.headers": "fixed default headers of the client",
    "contract/catalogue.py:_MESSAGE_OVERRIDES": "constant: the catalogue's messages",
    **dict.fromkeys(
        (
            "documents/asyncapi/components.py:TRACE_HEADERS",
            "documents/asyncapi/components.py:AUTH_DLQ_HEADERS",
            "documents/asyncapi/components.py:DLQ_FAULT_HEADERS",
            "documents/asyncapi/components.py:WEBHOOK_DLQ_HEADERS",
            "documents/asyncapi/components.py:_KEYS",
            "documents/asyncapi/document.py:ROLES",
            "documents/asyncapi/document.py:CHANNELS",
            "documents/asyncapi/document.py:_ONLY",
            "documents/asyncapi/document.py:_GROUPS",
            "documents/asyncapi/document.py:_REPLIES",
            "documents/asyncapi/messages.py:_KEYS",
            "documents/asyncapi/messages.py:_TOMBSTONE",
            "documents/asyncapi/messages.py:_TOMBSTONES",
            "documents/asyncapi/messages.py:_PAIRED",
        ),
        "constant of the AsyncAPI document",
    ),
    **dict.fromkeys(
        (
            "documents/openapi/parts.py:RID_HEADER",
            "documents/openapi/parts.py:EMPTY_BODY",
            "documents/openapi/parts.py:_CORS_ANSWER",
            "documents/openapi/document.py:_OUTCOMES",
            "documents/openapi/document.py:_TAGS",
            "documents/openapi/accounts.py:_EVENTS_QUERY",
            "documents/openapi/deliveries.py:_EXAMPLE_EVENT",
            "documents/openapi/deliveries.py:_ID_SCHEMA",
            "documents/openapi/deliveries.py:_LIST_QUERY",
        ),
        "constant of the OpenAPI document",
    ),
    "contract/operational_events.py:MODELS": "constant: one model per operational event type",
    "contract/operational_events.py:EXAMPLES": "constant: one example per operational event type",
    "dlq/letter.py:_UNITS": "constant: byte units for the operator's listing",
    "engine/topics.py:KAFKA_DEFAULTS": "constant: Kafka's topic-config defaults",
    "contract/topics.py:PROCESS_TOPICS": "constant: which process needs which topic",
    "startup.py:_NAMES": "constant: each process's service name and metric prefix",
    "settings.py:Settings.provider_urls": "configuration, read once at start-up",
    "settings.py:Settings.providers": "configuration, one per PROVIDER_URLS entry",
    "settings.py:Settings.api_cors_origins": "configuration, read once at start-up",
    # -- the event catalogue (issue 34): built once from the code, the same for everyone --
    "webhooks/event_types.py:ENVELOPE_HEADERS": "constant: the delivery headers described",
    "api/event_types.py:Envelope.headers": "one answer: the catalogue's fixed header set",
    "api/event_types.py:EventTypeEntry.json_schema": "one answer: a schema built from a model",
    "api/event_types.py:EventTypeEntry.example": "one answer: an example built from the code",
    "api/event_types.py:EventCatalogue.event_types": "one answer: EVENT_CATALOGUE's fixed types",
    # -- the front-ends' presence (worker/api/presence.py): bounded by what it counts --
    "api/presence.py:PresenceRecord.replays": "one record: the replica's replays, at most"
    " WEBHOOK_REPLAY_MAX_RUNNING + MAX_QUEUED workspaces (max_length 1000 on the wire)",
    "api/presence.py:Presence._seen": "one record per front-end replica, live or silent less"
    " than FORGET_AFTER_S (then dropped and tombstoned)",
    "api/presence.py:Presence._held": "this process's replays by workspace: at most"
    " WEBHOOK_REPLAY_MAX_RUNNING + MAX_QUEUED (+1 claim being decided)",
    "api/presence.py:Presence._claiming": "one lock per process",
    "webhooks/endpoints.py:EndpointsTail.positions": "one entry per endpoint the registry holds,"
    " dropped with its tombstone: bounded as the registry (WEBHOOK_ENDPOINTS_PER_WORKSPACE per"
    " workspace)",
    # -- values: one message, answer or report, bounded where it is parsed or built --
    "api/keys.py:KeysFile.keys": "the operator's keys file, parsed at start-up and on reload",
    "api/replies.py:ReplyRouter._next_offset": (
        "one position per partition the replica reads, at most the topic's partition count"
    ),
    "api/webhooks/bodies.py:EndpointData.event_types": (
        "a body field: WEBHOOK_EVENT_TYPES_MAX_ITEMS"
    ),
    "engine/writes.py:Sent.headers": "one produced record's headers, built by the process",
    "engine/writes.py:RecordOptions.headers": "the same record's headers, handed to enqueue",
    "api/webhooks/delivery_bodies.py:DeliveryDetail.attempts_detail": (
        "an answer: ≤ the delivery's entries in one bounded slice"
    ),
    "documents/openapi/deliveries.py:_EXAMPLE_ATTEMPT": "constant: a document example",
    "documents/openapi/deliveries.py:_EXAMPLE_DELIVERY": "constant: a document example",
    "auth/provider/answer.py:ProviderAnswer.headers": "one answer: the client's 64 KiB head cap",
    "engine/topics.py:TopicObservation.configs": "one DescribeConfigs answer of an operator check",
    "dispatcher/delivery_store.py:AccountDeliveries.endpoints": "old-form record, read to migrate",
    "dispatcher/publish.py:_LogBatch.entries": "one log batch: ≤ LOG_BATCH_MAX (200) entries",
    "dispatcher/publish.py:_LogBatch.headers": "one log batch's record headers, built here",
    "contract/operational_events.py:EndpointDisabledData.last_failures": (
        "one event's field: ≤ MAX_LAST_FAILURES (5)"
    ),
    "api/webhooks/follow_bodies.py:AccountEventData.body": "one event's body, as written",
    "contract/webhook_endpoints.py:Recovery.resume": "one offset per partition of one topic",
    "contract/webhook_endpoints.py:Recovery.replays_end": "one offset per partition of one"
    " topic (webhook.replays)",
    "api/webhooks/account_events.py:EventPage.events": "one page: ≤ MAX_LIMIT (100) events",
    # -- operator tools (python -m worker dlq|keys): run by hand, not fed by outside input --
    "dlq/cli.py:RedriveReport.redriven": "operator CLI: counts by target topic",
    "dlq/cli.py:RedriveReport.skipped": "operator CLI: counts by fixed skip reason",
    "dlq/cli.py:RedriveReport.failed": "operator CLI: counts by error class",
    "dlq/cli.py:Redriver._pending": "operator CLI: ≤ SENDS_IN_FLIGHT sends, PENDING_BYTES",
    "runtime/admission.py:Admission.refused": "one count per fixed refusal reason",
    # -- one call's scratch state --
    "runtime/logs.py:log_context._token": "a ContextVar token of one `with` block",
    "runtime/tracing.py:_Carry._token": "a ContextVar token of one `with` block",
}


def _imported_from(tree: ast.Module) -> dict[str, str]:
    """Each name the module imports with ``from X import Y`` (as bound) and its module."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            for alias in node.names:
                found[alias.asname or alias.name] = node.module
    return found


def _called_name(func: ast.expr, imports: dict[str, str]) -> str | None:
    """The constructor a call names, or ``None`` (``Counter`` only if it is collections')."""
    if isinstance(func, ast.Name):
        name = func.id
        if name == "Counter" and imports.get(name) != "collections":
            return None
        return name
    if isinstance(func, ast.Attribute):
        if func.attr == "Counter":
            owner = func.value
            return "Counter" if isinstance(owner, ast.Name) and owner.id == "collections" else None
        return func.attr
    return None


def _grows_value(value: ast.expr | None, imports: dict[str, str]) -> bool:
    if value is None:
        return False
    if isinstance(value, ast.Dict | ast.Set | ast.List | ast.DictComp | ast.SetComp | ast.ListComp):
        return True
    if isinstance(value, ast.Lambda):
        return _grows_value(value.body, imports)
    if isinstance(value, ast.IfExp):  # ``asyncio.Semaphore(n) if n else nullcontext()``
        return _grows_value(value.body, imports) or _grows_value(value.orelse, imports)
    if isinstance(value, ast.BinOp):  # e.g. ``weakref.WeakKeyDictionary() | ...`` or ``{} or ...``
        return _grows_value(value.left, imports) or _grows_value(value.right, imports)
    if isinstance(value, ast.Call):
        name = _called_name(value.func, imports)
        if name in GROWING_CALLS:
            return True
        if name == "fromkeys":  # dict.fromkeys(...)
            return True
        if name == "field":  # dataclasses.field(default_factory=dict) and the like
            for keyword in value.keywords:
                if keyword.arg in ("default_factory", "default") and (
                    _grows_value(keyword.value, imports)
                    or (
                        isinstance(keyword.value, ast.Name | ast.Attribute)
                        and _called_name(keyword.value, imports) in GROWING_CALLS
                    )
                ):
                    return True
        if name == "Field":  # pydantic.Field(default_factory=list)
            for keyword in value.keywords:
                if keyword.arg == "default_factory" and (
                    _grows_value(keyword.value, imports)
                    or _called_name(keyword.value, imports) in GROWING_CALLS
                ):
                    return True
    return False


def _outer_type(annotation: ast.expr | None, imports: dict[str, str]) -> str | None:
    """The outermost type of an annotation, ``X | None``, ``Optional``, ``ClassVar`` and
    ``Final`` unwrapped."""
    node = annotation
    while node is not None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node = ast.parse(node.value, mode="eval").body
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            left = _outer_type(node.left, imports)
            return left if left in GROWING_TYPES else _outer_type(node.right, imports)
        if isinstance(node, ast.Subscript):
            outer = _called_name(node.value, imports) or ""
            if outer in ("Optional", "ClassVar", "Final", "Annotated"):
                inner = node.slice
                node = inner.elts[0] if isinstance(inner, ast.Tuple) else inner
                continue
            node = node.value
            continue
        return _called_name(node, imports)
    return None


def _grows(node: ast.Assign | ast.AnnAssign, imports: dict[str, str]) -> bool:
    annotation = node.annotation if isinstance(node, ast.AnnAssign) else None
    return _grows_value(node.value, imports) or _outer_type(annotation, imports) in GROWING_TYPES


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return list(node.targets) if isinstance(node, ast.Assign) else [node.target]


def _assignments(body: list[ast.stmt]) -> Iterator[ast.Assign | ast.AnnAssign]:
    for statement in body:
        if isinstance(statement, ast.Assign | ast.AnnAssign):
            yield statement


def structures_of(path: Path, root: Path = PACKAGE) -> dict[str, int]:
    """The growable structures one module defines, by name, with their first line."""
    tree = parse(path)
    imports = _imported_from(tree)
    module = path.relative_to(root).as_posix()
    found: dict[str, int] = {}

    def note(name: str, line: int) -> None:
        found.setdefault(f"{module}:{name}", line)

    for node in _assignments(tree.body):
        if _grows(node, imports):
            for target in _targets(node):
                if isinstance(target, ast.Name) and target.id != "__all__":
                    note(target.id, node.lineno)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in _assignments(cls.body):  # class-level names, dataclass and model fields
            if _grows(node, imports):
                for target in _targets(node):
                    if isinstance(target, ast.Name):
                        note(f"{cls.name}.{target.id}", node.lineno)
        for inner in ast.walk(cls):  # ``self.<name> = ...`` in any method
            if isinstance(inner, ast.Assign | ast.AnnAssign) and _grows(inner, imports):
                for target in _targets(inner):
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        note(f"{cls.name}.{target.attr}", inner.lineno)
    return found


def structures(root: Path = PACKAGE) -> dict[str, str]:
    """Every growable structure of the package: name → ``file:line``."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for name, line in structures_of(path, root).items():
            found[name] = f"{path.relative_to(root.parent).as_posix()}:{line}"
    return found


def section(doc: str) -> str:
    """The "Resource bounds" section of the doc, to the next section of its level."""
    start = doc.index(f"\n{SECTION}\n")
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end >= 0 else len(doc)]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the section's tables (the header and rules left out)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("| ") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "structure":
            continue
        rows.append(cells)
    return rows


NAME = re.compile(r"`([a-z0-9_/]+\.py):([A-Za-z_][A-Za-z0-9_.]*)`")
TEST_REF = re.compile(r"`(tests/[A-Za-z0-9_/]+\.py)(?:::([A-Za-z0-9_]+))?`")


def named_in_table(text: str) -> set[str]:
    """Every ``file:Name`` the section's table rows name in backticks."""
    return {f"{m[0]}:{m[1]}" for row in table_rows(text) for m in NAME.findall(" ".join(row))}


def _doc_section() -> str:
    return section(DOC.read_text())


def test_every_growable_structure_has_a_row_or_a_reason() -> None:
    found = structures()
    named = named_in_table(_doc_section())
    missing = {n: at for n, at in found.items() if n not in named and n not in NOT_GROWN}
    assert missing == {}, (
        "structures outside input might grow, with no row in docs/architecture.md, "
        '"Resource bounds" (nor a reason in NOT_GROWN): ' + repr(missing)
    )


def test_the_allow_list_names_only_what_is_there() -> None:
    found = structures()
    assert sorted(set(NOT_GROWN) - set(found)) == []
    assert sorted(set(NOT_GROWN) & named_in_table(_doc_section())) == [], (
        "both allowed and in the table: one or the other"
    )


def test_every_structure_the_table_names_is_in_the_code() -> None:
    gone = []
    for name in sorted(named_in_table(_doc_section())):
        module, _, attribute = name.partition(":")
        path = PACKAGE / module
        last = attribute.rsplit(".", 1)[-1]
        if not path.is_file() or not re.search(rf"\b{re.escape(last)}\b", path.read_text()):
            gone.append(name)
    assert gone == [], "the table names structures the code no longer has"


def test_every_test_the_table_names_exists() -> None:
    text = _doc_section()
    refs = [m for row in table_rows(text) for m in TEST_REF.findall(row[-1])]
    assert refs, "the table names no test"
    wrong = []
    for file, test in refs:
        path = REPO / file
        if not path.is_file():
            wrong.append(file)
        elif test and not re.search(rf"^(async )?def {test}\(", path.read_text(), re.M):
            wrong.append(f"{file}::{test}")
    assert wrong == [], "tests the table names that do not exist"


def test_every_row_has_every_column() -> None:
    rows = table_rows(_doc_section())
    assert len(rows) >= 40
    short = [row[0] for row in rows if len(row) != 5 or not all(row)]
    assert short == [], "rows without structure | bound | setting | charged to | test"


# -- the scan itself ------------------------------------------------------------------------


SAMPLE = """
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from prometheus_client import Counter as PromCounter
import asyncio, collections

_CACHE: dict[str, int] = {}
LIMIT = 5
__all__ = ["Thing"]

@dataclass
class Thing:
    seen: list[int] = field(default_factory=list)
    size: int = 0

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}
        self._queue = deque()
        self._count = Counter()
        self._lock = asyncio.Lock()
        self._counter = PromCounter("x", "y")
        self._name = "n"
        self._pair: tuple[int, int] = (1, 2)
        self._maybe: OrderedDict[str, int] | None = None
        self._other = collections.Counter()
"""


def test_the_scan_finds_what_it_should_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "api").mkdir()
    path = tmp_path / "api" / "sample.py"
    path.write_text(SAMPLE)
    found = set(structures_of(path, tmp_path))
    assert found == {
        "api/sample.py:_CACHE",
        "api/sample.py:Thing.seen",
        "api/sample.py:Thing._seen",
        "api/sample.py:Thing._queue",
        "api/sample.py:Thing._count",
        "api/sample.py:Thing._lock",
        "api/sample.py:Thing._maybe",
        "api/sample.py:Thing._other",
    }


@pytest.mark.parametrize(
    ("row", "names"),
    [
        (
            "| `api/a.py:A._b`, `api/a.py:A._c` | 1 | X | ws | `tests/t.py` |",
            {"api/a.py:A._b", "api/a.py:A._c"},
        ),
        ("| the `A._b` map of `api/a.py` | 1 | X | ws | `tests/t.py` |", set()),
    ],
)
def test_rows_name_structures_in_one_form(row: str, names: set[str]) -> None:
    assert named_in_table(row) == names


# -- the one admission rule (docs/architecture.md, "Admission") --

#: Pools built on a semaphore or a thread pool of their own, each with why it is no shared slot
#: that owners could take from one another (its waiters are bounded by an admission upstream).
OWN_POOLS: dict[str, str] = {
    "auth/provider/http.py": "provider calls: its callers are the engine's in-flight records,"
    " admitted per partition through the rule",
    "api/webhooks/replay.py": "the running replays: each admitted first through the rule"
    " (ReplayRunner._admission); they run in arrival order, one per workspace at a time",
    "webhooks/lookup.py": "the resolver's threads, each taken through the rule"
    " (BoundedLookup._threads, an Admission) before a thread runs",
}
POOL_CALLS = frozenset({"Semaphore", "BoundedSemaphore", "ThreadPoolExecutor"})


def own_pools(root: Path = PACKAGE) -> dict[str, int]:
    """Modules that build a semaphore or a thread pool: ``path`` → first line."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        tree = parse(path)
        imports = _imported_from(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called_name(node.func, imports) in POOL_CALLS:
                found.setdefault(path.relative_to(root).as_posix(), node.lineno)
    return found


def admissions(root: Path = PACKAGE) -> set[str]:
    """Every structure whose value is an ``Admission(...)``: a shared slot under the rule."""
    found: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        tree = parse(path)
        module = path.relative_to(root).as_posix()
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if not isinstance(node, ast.Assign | ast.AnnAssign):
                    continue
                value = node.value
                if not (
                    isinstance(value, ast.Call) and _called_name(value.func, {}) == "Admission"
                ):
                    continue
                for target in _targets(node):
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                        found.add(f"{module}:{cls.name}.{target.attr}")
    return found


def test_no_pool_keeps_its_own_first_come_rule() -> None:
    pools = own_pools()
    assert sorted(set(pools) - set(OWN_POOLS)) == [], (
        "a semaphore or thread pool outside the admission rule (worker/runtime/admission.py):"
        f" {pools}"
    )
    assert sorted(set(OWN_POOLS) - set(pools)) == [], "OWN_POOLS names a pool no longer there"


def test_every_shared_slot_is_in_the_inventory_with_its_share() -> None:
    found = admissions()
    assert found, "no shared slot is taken through the admission rule"
    rows = table_rows(_doc_section())
    for name in sorted(found):
        row = next((r for r in rows if f"`{name}`" in " ".join(r)), None)
        assert row is not None, f"{name}: a shared slot with no row in Resource bounds"
        text = " ".join(row).lower()
        assert "admission" in text and "share" in text, (
            f"{name}: its row must say it is taken through the admission rule and the share"
            " each owner gets"
        )


def test_the_pool_finders_see_a_semaphore_and_an_admission(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "import asyncio\nclass A:\n    def __init__(self):\n"
        "        self.s = asyncio.Semaphore(2)\n        self.p = Admission('x', share)\n"
    )
    assert own_pools(tmp_path) == {"a.py": 4}
    assert admissions(tmp_path) == {"a.py:A.p"}
