"""Where a POST's time goes through the stack, from the records themselves: each confirm's
command on ``auth.commands`` and its reply on ``auth.replies`` carry the time their producer
made them (CreateTime: the front-end's and the worker's clocks, this machine's), and the load
generator knows when it scheduled the request and when the answer came. So every request
splits into four legs without instrumenting any process:

- *ingress*: scheduled → command made (the generator's socket, the front-end's HTTP and
  route, queueing behind its loop);
- *worker*: command made → the account's first state record made after it (the produce,
  the worker's fetch, its decision, the provider call);
- *state ack*: that state record made → reply made (the worker waits for the state record's
  acknowledgement before it replies: read-your-writes, docs/architecture.md "Guarantees");
- *reply*: reply made → answered (the reply's produce, the front-end's reply fetch, the
  response write, the generator's read).

``bench.stack_cost`` prints the legs for the median request and for the slowest 1 % at each
open-loop point (bench/README.md, "Front-end cost")."""

from __future__ import annotations

import json
import statistics
from typing import Any

COMMANDS = "auth.commands"
STATE = "auth.state"
REPLIES = "auth.replies"
TRACED = (COMMANDS, STATE, REPLIES)
LEGS = ("ingress", "worker", "state_ack", "reply")


def account_of(value: bytes | None) -> str | None:
    """The ``account_id`` of a command or reply record, or ``None`` for anything else."""
    if not value:
        return None
    try:
        decoded = json.loads(value)
    except ValueError:
        return None
    account = decoded.get("account_id") if isinstance(decoded, dict) else None
    return account if isinstance(account, str) else None


def legs(
    timings: dict[str, tuple[float, float]], stamps: dict[tuple[str, str], float]
) -> list[dict[str, float]]:
    """Per request (``timings``: account → scheduled and answered, epoch seconds) whose
    command, state record and reply were all seen (``stamps``: (topic, account) → the first
    such record's CreateTime, epoch seconds), its legs and total in ms."""
    out = []
    for account, (scheduled, answered) in timings.items():
        command = stamps.get((COMMANDS, account))
        state = stamps.get((STATE, account))
        reply = stamps.get((REPLIES, account))
        if command is None or state is None or reply is None:
            continue
        out.append(
            {
                "ingress": (command - scheduled) * 1000,
                "worker": (state - command) * 1000,
                "state_ack": (reply - state) * 1000,
                "reply": (answered - reply) * 1000,
                "total": (answered - scheduled) * 1000,
            }
        )
    return out


def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Each leg's median over all requests and its mean over the slowest 1 % (at least one
    request) by total time: what the tail adds, leg by leg."""
    if not rows:
        return {"traced": 0}
    slowest = sorted(rows, key=lambda r: r["total"])[-max(1, len(rows) // 100) :]
    return {
        "traced": len(rows),
        "median": {leg: statistics.median(r[leg] for r in rows) for leg in (*LEGS, "total")},
        "slowest_1pct": {
            leg: statistics.fmean(r[leg] for r in slowest) for leg in (*LEGS, "total")
        },
    }


def lines(trace: dict[str, Any]) -> list[str]:
    """The report's lines for one open-loop point."""
    if not trace.get("traced"):
        return ["  trace: no request's command, state record and reply were all seen"]
    med, slow = trace["median"], trace["slowest_1pct"]

    def legs_of(row: dict[str, float]) -> str:
        return ", ".join(f"{leg} {row[leg]:.1f}" for leg in (*LEGS, "total"))

    return [
        f"  trace ({trace['traced']} requests), ms: median {legs_of(med)}",
        f"    slowest 1 % (mean): {legs_of(slow)}",
    ]
