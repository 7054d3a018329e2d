"""The account flow's statuses and the one ``transitions`` machine every account shares
(docs/architecture.md, "The account flow"; drawn in ``docs/flow.md``)."""

from __future__ import annotations

from transitions import Machine

PRE_CHALLENGE = (
    "pending_auth",
    "awaiting_qr_scan",
    "awaiting_code",
    "pending",
    "passkey_required",
    "passkey_pending",
)
CHALLENGE = "passkey_confirmation"
SENT = "passkey_confirmation_sent"
AUTHORIZED = "authorized"
FAILED = "failed"
STATUSES = (*PRE_CHALLENGE, CHALLENGE, SENT, AUTHORIZED, FAILED)
TERMINAL = frozenset({AUTHORIZED, FAILED})

_OPEN = [*PRE_CHALLENGE, CHALLENGE, SENT]


def _t(trigger: str, source: str | list[str], dest: str) -> dict[str, object]:
    return {"trigger": trigger, "source": source, "dest": dest}


TRANSITIONS: list[dict[str, object]] = [
    # The contract's one documented transition: the caller confirms the pending challenge.
    {"trigger": "confirm_passkey", "source": CHALLENGE, "dest": SENT},
    # A flow left unresolved past its deadline ends in failed.
    {"trigger": "expire", "source": SENT, "dest": FAILED},
    # Provider-observed progress before the challenge (order not fixed by the contract), and a
    # fresh attempt after a failure.
    *[_t(f"observe_{dest}", [*PRE_CHALLENGE, FAILED], dest) for dest in PRE_CHALLENGE],
    {"trigger": f"observe_{CHALLENGE}", "source": list(PRE_CHALLENGE), "dest": CHALLENGE},
    # The provider may report the confirmation itself (e.g. a confirm re-driven after a crash).
    {"trigger": f"observe_{SENT}", "source": CHALLENGE, "dest": SENT},
    # The follow-up: the flow ends authorized or failed (QR/code paths may authorize directly).
    {"trigger": f"observe_{AUTHORIZED}", "source": _OPEN, "dest": AUTHORIZED},
    {"trigger": f"observe_{FAILED}", "source": _OPEN, "dest": FAILED},
]

MACHINE = Machine(
    model=None,
    states=list(STATUSES),
    transitions=TRANSITIONS,
    auto_transitions=False,
    initial=None,
)


def next_status(event: str, source: str) -> str | None:
    """Destination of ``event`` from ``source``, or None when the machine forbids it."""
    found = MACHINE.events.get(event)
    taken = found.transitions.get(source) if found is not None else None
    dest = taken[0].dest if taken else None
    return None if dest is None else str(dest)
