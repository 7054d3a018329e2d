"""Every metric the dashboard and the Prometheus rules query is one the processes export.

``deploy/metrics.txt`` lists the exported metric families (counters by their ``_total`` name,
histograms by their base name, gauges as they are). A metric name in a rule or dashboard
expression must be one of them, a histogram's ``_bucket``/``_sum``/``_count`` series, or a
recording rule defined in ``deploy/prometheus/rules``, or one of the ``STANDARD_FAMILIES`` that
every process exports under prometheus_client's own names (``process_*``, ``python_*``). Label
names are checked against the labels of the metric contract plus those the scrape adds, so a
typo in ``by (...)`` fails too.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
METRICS_FILE = REPO / "deploy" / "metrics.txt"
RULE_FILES = sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml"))
DASHBOARD = REPO / "deploy" / "grafana" / "passkey-worker.json"

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# The product's families (docs/operations.md, "Prometheus"): passkey_, then the process' word.
PRODUCT_PREFIX = "passkey_"
PROCESS_PREFIXES = ("passkey_auth_", "passkey_api_", "passkey_webhook_")
# What every process exports beside its own prefix (worker/runtime/metrics.py,
# export_process_metrics).
# prometheus_client's standard collectors keep their standard names, the ones shared dashboards
# already query: they are allowed here by name instead of being listed in deploy/metrics.txt.
# They are the client's (pinned in requirements.lock); the live checks assert that every
# process exports exactly these, so a client upgrade that changes them fails there.
STANDARD_FAMILIES = frozenset(
    {
        "process_virtual_memory_bytes", "process_resident_memory_bytes",
        "process_start_time_seconds", "process_cpu_seconds_total", "process_open_fds",
        "process_max_fds", "python_info", "python_gc_objects_collected_total",
        "python_gc_objects_uncollectable_total", "python_gc_collections_total",
    }
)  # fmt: skip
STANDARD_LABELS = frozenset(
    {"generation", "implementation", "major", "minor", "patchlevel", "version"}
)
# The product's families every process exports (listed in deploy/metrics.txt): the build.
SHARED_FAMILIES = frozenset({"passkey_build_info"})
SHARED_LABELS = frozenset({"service", "version"})
# Labels of the metric contract: the worker's and the front-end's (worker/runtime/metrics.py,
# worker/api/metrics.py), and those of the webhook dispatcher (`python -m worker webhooks`,
# passkey_webhook_* families: result, status_class, kind, topic, partition, the DLQ's reason).
WORKER_API_LABELS = SHARED_LABELS | frozenset(
    {
        "type", "outcome", "code", "numeric_code", "http_status", "provider", "operation",
        "topic", "partition", "kind", "reason", "status", "route", "method", "stage", "tail",
        "quota", "key_id", "state",
    }
)  # fmt: skip
WEBHOOK_LABELS = SHARED_LABELS | frozenset(
    {"result", "status_class", "kind", "topic", "partition", "stage", "outcome", "tail", "reason"}
)
CONTRACT_LABELS = WORKER_API_LABELS | WEBHOOK_LABELS | STANDARD_LABELS
# Labels that scraping adds (deploy/prometheus/prometheus.yml) and histogram buckets carry.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "le"})

# --- a small PromQL scanner: enough to pull out metric and label names ---------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{([^{}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:])(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.*),)?\s*([A-Za-z_]\w*)\s*\)\s*$")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
     "offset", "bool", "inf", "nan"}
)  # fmt: skip


@dataclass
class Names:
    metrics: set[str] = field(default_factory=set)
    labels: set[str] = field(default_factory=set)


def scan(expr: str) -> Names:
    """Metric and label names used by one PromQL expression (Grafana variables allowed)."""
    names = Names()
    label_values = _LABEL_VALUES.match(expr)
    if label_values:  # Grafana's label_values([metric,] label) variable query
        names.labels.add(label_values.group(2))
        expr = label_values.group(1) or ""
    text = _STRING.sub('""', expr)
    text = _GRAFANA_VARIABLE.sub("", text)
    for matchers in _MATCHERS.findall(text):
        names.labels.update(_MATCHER_LABEL.findall(matchers))
    text = _MATCHERS.sub(" ", text)
    for grouping in _GROUPING.findall(text):
        names.labels.update(n.strip() for n in grouping.split(",") if n.strip())
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    for name, call in _IDENTIFIER.findall(text):
        if not call and name not in _KEYWORDS:
            names.metrics.add(name)
    return names


def exported() -> set[str]:
    """The product's families, as deploy/metrics.txt lists them."""
    return set(METRICS_FILE.read_text().split())


def queryable() -> set[str]:
    """What a rule or a dashboard query may name: the product's and the standard families."""
    return exported() | STANDARD_FAMILIES


def family(name: str, families: set[str]) -> str | None:
    """The exported family a series name belongs to, if any."""
    if name in families:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and base in families and not base.endswith("_total"):
            return base
    return None


def rules() -> Iterator[dict[str, Any]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


def recorded() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in container.get("panels", []):
        yield panel
        yield from panels(panel)  # collapsed rows keep their panels inside


def dashboard_expressions() -> list[str]:
    board = dashboard()
    exprs = [t["expr"] for p in panels(board) for t in p.get("targets", []) if "expr" in t]
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def rule_expressions() -> list[str]:
    return [str(r["expr"]) for r in rules()]


# --- the scanner itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "metrics", "labels"),
    [
        (
            'sum by (type, outcome) (rate(passkey_auth_commands_total{namespace=~"$namespace"}'
            "[$__rate_interval]))",
            {"passkey_auth_commands_total"},
            {"type", "outcome", "namespace"},
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket[5m]))) > 1e3"
            " and on (namespace) group_left () y offset 5m",
            {"x_seconds_bucket", "y"},
            {"le", "namespace"},
        ),
        ("time() - hb_seconds > 60", {"hb_seconds"}, set()),
        ('absent(up{job="x", a!~"{b}"})', {"up"}, {"job", "a"}),
        ("passkey:a:rate5m / ignoring(code) b", {"passkey:a:rate5m", "b"}, {"code"}),
        (
            "label_values(passkey_auth_worker_ready, namespace)",
            {"passkey_auth_worker_ready"},
            {"namespace"},
        ),
        ("label_values(namespace)", set(), {"namespace"}),
        ("sum(rate(m_total[1m])) without (instance)", {"m_total"}, {"instance"}),
    ],
)
def test_scan(expr: str, metrics: set[str], labels: set[str]) -> None:
    names = scan(expr)
    assert names.metrics == metrics
    assert names.labels == labels


# --- deploy/metrics.txt ---------------------------------------------------------------------


def test_metrics_file_is_a_plain_list_of_families() -> None:
    text = METRICS_FILE.read_text()
    lines = text.splitlines()
    assert text.endswith("\n")
    assert all(re.fullmatch(r"[a-z_][a-z0-9_]*", line) for line in lines), "one name a line"
    assert len(lines) == len(set(lines)), "duplicate names"
    for line in lines:
        assert not line.endswith(HISTOGRAM_SUFFIXES), f"{line}: list a histogram by its base"
        assert not line.endswith("_created"), line
    assert STANDARD_FAMILIES.isdisjoint(lines), "standard families are allowed, not listed"
    for line in lines:
        assert line in SHARED_FAMILIES or line.startswith(PROCESS_PREFIXES), line
    assert set(lines) >= SHARED_FAMILIES


# --- the rules and the dashboard ------------------------------------------------------------


def _unknown(exprs: list[str], allowed_recorded: set[str]) -> dict[str, set[str]]:
    families = queryable()
    unknown: dict[str, set[str]] = {}
    for expr in exprs:
        bad = {
            m
            for m in scan(expr).metrics
            if m not in allowed_recorded and family(m, families) is None
        }
        if bad:
            unknown[expr] = bad
    return unknown


def test_every_expression_queries_some_metric() -> None:
    """Guards the scanner: an expression without a metric means it missed one."""
    for expr in [*rule_expressions(), *dashboard_expressions()]:
        assert scan(expr).metrics, expr


def test_rule_metrics_are_exported() -> None:
    assert _unknown(rule_expressions(), recorded()) == {}


def test_recording_rules_are_named_level_metric_operation() -> None:
    families = exported()
    for name in recorded():
        prefix, metric, operation = name.split(":")
        assert prefix == "passkey"
        assert metric.startswith(PRODUCT_PREFIX), name
        assert operation
        assert any(f.startswith(metric) for f in families), f"{name}: unknown metric {metric}"


def test_dashboard_metrics_are_exported() -> None:
    # The dashboard works on raw series only, so it does not depend on the rules being loaded.
    assert _unknown(dashboard_expressions(), set()) == {}


def test_dashboard_shows_every_exported_family() -> None:
    families = exported()
    used = {family(m, families) for e in dashboard_expressions() for m in scan(e).metrics}
    assert families - used == set()


def test_label_names_are_known() -> None:
    rule_labels = {k for r in rules() for k in r.get("labels", {})}
    allowed = CONTRACT_LABELS | TARGET_LABELS | rule_labels
    for expr in [*rule_expressions(), *dashboard_expressions()]:
        assert scan(expr).labels - allowed == set(), expr


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] == "passkey-worker"
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "namespace"} <= variables
    for panel in panels(board):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert 'namespace=~"$namespace"' in target["expr"], panel["title"]


def test_dashboard_panels_do_not_overlap() -> None:
    """Rows and panels each have a place of their own on the 24-column grid (a collapsed row's
    panels are laid out when it opens, so they are checked among themselves)."""

    def overlap(a: dict[str, int], b: dict[str, int]) -> bool:
        return (
            a["x"] < b["x"] + b["w"]
            and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"]
            and b["y"] < a["y"] + a["h"]
        )

    layers = [dashboard().get("panels", [])]
    layers += [p["panels"] for p in dashboard().get("panels", []) if p.get("panels")]
    for layer in layers:
        for i, a in enumerate(layer):
            for b in layer[i + 1 :]:
                assert not overlap(a["gridPos"], b["gridPos"]), (a["title"], b["title"])


def test_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    """promtool parses every panel query (Grafana's variables filled in with examples)."""
    queries = [
        e.replace("$__rate_interval", "1m").replace("$namespace", ".*")
        for e in dashboard_expressions()
        if not _LABEL_VALUES.match(e)
    ]
    group = {
        "name": "dashboard-queries",
        "rules": [
            {"record": f"dashboard:query_{i}:expr", "expr": q} for i, q in enumerate(queries)
        ],
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
