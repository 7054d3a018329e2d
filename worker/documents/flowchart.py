"""The account flow as a Mermaid ``stateDiagram-v2`` rendered from the ``transitions`` machine into
``docs/flow.md``; a test compares them, so the picture cannot drift."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from transitions import Machine

from worker.auth.machine import FAILED, MACHINE, PRE_CHALLENGE, STATUSES, TERMINAL

__all__ = ["flow_page", "machine_edges", "mermaid_state_diagram"]


@dataclass(frozen=True, slots=True)
class Group:
    """Statuses drawn as one node: ``name`` is the Mermaid id, ``title`` its first line."""

    name: str
    title: str
    members: tuple[str, ...]


def machine_edges(machine: Machine) -> list[tuple[str, str, str]]:
    """Every (trigger, source, dest) of ``machine``, in definition order; internal transitions
    (no destination) are skipped."""
    edges: list[tuple[str, str, str]] = []
    for trigger, event in machine.events.items():
        for source, transitions in event.transitions.items():
            for transition in transitions:
                if transition.dest is not None:
                    edges.append((trigger, str(source), str(transition.dest)))
    return edges


def _label(triggers: Sequence[str], dests: Sequence[str]) -> str:
    """One edge label for several triggers; ``observe_a``/``observe_b`` into a and b read as
    ``observe_(status)``."""
    if len(triggers) > 1:
        stems = {t[: -len(d)] for t, d in zip(triggers, dests, strict=True) if t.endswith(d)}
        if len(stems) == 1 and all(t.endswith(d) for t, d in zip(triggers, dests, strict=True)):
            return f"{stems.pop()}(status)"
    return ", ".join(dict.fromkeys(triggers))


def _check_interchangeable(group: Group, edges: Iterable[tuple[str, str, str]]) -> None:
    leaving: dict[str, set[tuple[str, str]]] = {m: set() for m in group.members}
    for trigger, source, dest in edges:
        if source in leaving and dest not in group.members:
            leaving[source].add((trigger, dest))
    first = leaving[group.members[0]]
    for member, out in leaving.items():
        if out != first:
            raise ValueError(
                f"{member} leaves group {group.name} differently from {group.members[0]}: "
                f"{sorted(out ^ first)}; draw it on its own"
            )


def mermaid_state_diagram(
    machine: Machine,
    *,
    groups: Sequence[Group] = (),
    terminal: Iterable[str] = (),
) -> str:
    """``machine`` as Mermaid ``stateDiagram-v2`` source. A *group* is one node, faithful only
    if its members leave it by the same triggers to the same places (else this raises); edges
    between two nodes are merged, ``observe_<status>`` written ``observe_(status)``; a trigger
    from a status to itself is left out (the decision handles it before the machine)."""
    edges = machine_edges(machine)
    node: dict[str, str] = {}
    for group in groups:
        _check_interchangeable(group, edges)
        node |= dict.fromkeys(group.members, group.name)
    merged: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for trigger, source, dest in edges:
        if source == dest:
            continue
        a, b = node.get(source, source), node.get(dest, dest)
        triggers, dests = merged.setdefault((a, b), ([], []))
        if a in {g.name for g in groups} and (trigger, dest) in zip(triggers, dests, strict=True):
            continue  # the same edge from another member of the group
        triggers.append(trigger)
        dests.append(dest)
    lines = ["stateDiagram-v2"]
    for group in groups:
        lines.append(f'    state "{group.title}: {", ".join(group.members)}" as {group.name}')
    drawn = set(node)
    for state in machine.states:
        if state not in drawn:
            lines.append(f"    {state}")
    for (a, b), (triggers, dests) in merged.items():
        lines.append(f"    {a} --> {b} : {_label(triggers, dests)}")
    ends = [s for s in machine.states if s in set(terminal)]
    if ends:
        lines.append("    classDef terminal font-weight:bold,stroke-width:3px")
        lines.append(f"    class {','.join(ends)} terminal")
    return "\n".join(lines) + "\n"


BEFORE_CHALLENGE = Group("before_challenge", "before the challenge", PRE_CHALLENGE)


def flow_page(machine: Machine = MACHINE) -> str:
    """``docs/flow.md``: the diagram of the worker's machine, with what it leaves out."""
    diagram = mermaid_state_diagram(machine, groups=[BEFORE_CHALLENGE], terminal=TERMINAL)
    return (
        "# The account flow\n"
        "\n"
        "<!-- Generated from worker/auth/flow.py by `make schemas` (worker/documents/flowchart.py);"
        " do not edit. tests/documents/test_flowchart.py fails when it drifts. -->\n"
        "\n"
        "The statuses of one account and the transitions the shared `transitions` machine in\n"
        "`worker/auth/flow.py` allows between them. Bold statuses end a flow; a flow that "
        "`failed`\nmay start again from a status before the challenge. How the machine is used:\n"
        '[`docs/architecture.md`](architecture.md), "The account flow"; what a confirm answers:\n'
        '"The confirm decision table" there.\n'
        "\n"
        "```mermaid\n"
        f"{diagram}"
        "```\n"
        "\n"
        "Not drawn:\n"
        "\n"
        "- `register_account` sets any of the "
        f"{len(STATUSES)} statuses directly (it is not a transition of the\n"
        "  machine): an account enters the flow wherever its provider is.\n"
        "- A report of the status the account already has (`observe_<current status>`) only\n"
        "  refreshes `auth_status`; the decision handles it before it asks the machine.\n"
        "- Reports the machine does not allow (stale or out of order) are ignored.\n"
        "\n"
        "`expire` is the worker's own trigger, not a command: it moves the flow to\n"
        f"`{FAILED}` when the follow-up deadline (`WORKER_FOLLOW_UP_DEADLINE_S`) passes without a\n"
        "final status.\n"
    )
