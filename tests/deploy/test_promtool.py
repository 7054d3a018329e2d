"""deploy/prometheus: promtool accepts the scrape configs and the rules, the rule unit tests pass,
and every alert is unit-tested both firing and silent, carries a severity and a runbook, and has
a runbook section in docs/operations.md.

promtool comes from the `prometheus` Debian package (.ci/run installs it); see conftest.py for
what happens without it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"
CONFIGS = sorted(PROMETHEUS.glob("prometheus*.yml"))
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
OPERATIONS = REPO / "docs" / "operations.md"

SEVERITIES = frozenset({"critical", "warning"})
RUNBOOK_MAX_CHARS = 600


def run(promtool: str, *args: str | Path) -> str:
    proc = subprocess.run(
        [promtool, *map(str, args)],
        cwd=PROMETHEUS,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output


def rules(kind: str) -> Iterator[dict[str, Any]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from (r for r in group["rules"] if kind in r)


def unit_tests() -> Iterator[dict[str, Any]]:
    for path in RULE_TESTS:
        yield from yaml.safe_load(path.read_text())["tests"]


# --- promtool -------------------------------------------------------------------------------


def test_files_exist() -> None:
    assert [c.name for c in CONFIGS] == ["prometheus-local.yml", "prometheus.yml"]
    assert RULE_FILES
    assert RULE_TESTS


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_check_config(promtool: str, config: Path) -> None:
    """Also checks the rule files the config loads."""
    run(promtool, "check", "config", config)


def test_check_rules(promtool: str) -> None:
    output = run(promtool, "check", "rules", *RULE_FILES)
    assert "SUCCESS" in output


def test_rule_unit_tests(promtool: str) -> None:
    output = run(promtool, "test", "rules", *RULE_TESTS)
    assert "FAILED" not in output


# --- coverage and conventions (no promtool needed) ------------------------------------------


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for test in unit_tests():
        for case in test.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    alerts = {r["alert"] for r in rules("alert")}
    assert alerts - firing == set(), "alerts never seen firing in deploy/prometheus/tests"
    assert alerts - silent == set(), "alerts never seen silent in deploy/prometheus/tests"
    assert (firing | silent) - alerts == set(), "tests name alerts that do not exist"


def test_every_recording_rule_is_unit_tested() -> None:
    tested = {
        case["expr"].strip() for test in unit_tests() for case in test.get("promql_expr_test", [])
    }
    assert {r["record"] for r in rules("record")} - tested == set()


def test_alerts_carry_severity_summary_and_a_short_runbook() -> None:
    names = [r["alert"] for r in rules("alert")]
    assert len(names) == len(set(names)), "duplicate alert names"
    for rule in rules("alert"):
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook"} <= set(annotations), rule["alert"]
        assert 0 < len(annotations["runbook"]) <= RUNBOOK_MAX_CHARS, rule["alert"]


def test_every_alert_has_a_runbook_in_the_operations_guide() -> None:
    guide = OPERATIONS.read_text()
    for rule in rules("alert"):
        assert f"### {rule['alert']}" in guide, f"docs/operations.md lacks {rule['alert']}"
