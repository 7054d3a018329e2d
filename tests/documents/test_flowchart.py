"""docs/flow.md is generated from the machine in worker/auth/flow.py (``make schemas``); a change of
the machine without re-exporting fails here, as do rendering rules that would misdraw it."""

from __future__ import annotations

from pathlib import Path

import pytest
from transitions import Machine

from worker.auth.machine import MACHINE, PRE_CHALLENGE, TRANSITIONS
from worker.documents.export import pages
from worker.documents.flowchart import Group, machine_edges, mermaid_state_diagram

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("name", sorted(pages()))
def test_committed_page_matches_the_machine(name: str) -> None:
    path = DOCS / name
    assert path.exists(), f"docs/{name} missing: run `make schemas`"
    assert path.read_text(encoding="utf-8") == pages()[name], (
        f"docs/{name} drifted from worker/auth/flow.py: run `make schemas` and review the diff"
    )


def test_every_transition_between_two_statuses_is_drawn() -> None:
    """Each (source, dest) pair of the machine appears as an edge between their nodes."""
    diagram = mermaid_state_diagram(
        MACHINE, groups=[Group("pre", "pre", PRE_CHALLENGE)], terminal=()
    )
    node = {s: "pre" if s in PRE_CHALLENGE else s for s in MACHINE.states}
    for trigger, source, dest in machine_edges(MACHINE):
        if source != dest:
            edge = f"    {node[source]} --> {node[dest]} : "
            line = next((ln for ln in diagram.splitlines() if ln.startswith(edge)), None)
            assert line is not None, f"{trigger}: {source} -> {dest} not drawn"
            assert trigger in line or line.endswith("(status)"), line


def test_ungrouped_rendering_lists_every_trigger() -> None:
    diagram = mermaid_state_diagram(MACHINE)
    assert diagram.startswith("stateDiagram-v2\n")
    edges = {(s, d) for _, s, d in machine_edges(MACHINE) if s != d}
    assert sum(" --> " in ln for ln in diagram.splitlines()) == len(edges)


def test_a_group_whose_members_differ_is_refused() -> None:
    machine = Machine(
        model=None,
        states=["a", "b", "c"],
        transitions=[{"trigger": "go", "source": "a", "dest": "c"}],
        auto_transitions=False,
        initial=None,
    )
    with pytest.raises(ValueError, match="leaves group"):
        mermaid_state_diagram(machine, groups=[Group("ab", "a or b", ("a", "b"))])


def test_machine_definition_is_the_source() -> None:
    """The renderer reads the built machine, so it sees every entry of TRANSITIONS."""
    triggers = {t for t, _, _ in machine_edges(MACHINE)}
    assert triggers == {str(t["trigger"]) for t in TRANSITIONS}
