"""Hypothesis over random command sequences applied through the pure decision, with a model
provider: the invariants of the flow hold for every sequence (docs/architecture.md, "The
account flow", "The confirm decision table" and "Guarantees")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.auth.flow import Decision, Policy, decide, expire, settle_confirm
from worker.auth.machine import STATUSES, next_status
from worker.auth.provider.base import ProviderAuthState
from worker.contract.catalogue import ServiceError
from worker.contract.messages import (
    AccountRecord,
    Command,
    DeregisterAccount,
    ObserveAuthState,
    PasskeyConfirm,
    RegisterAccount,
)

POLICY = Policy(providers=frozenset({"simulator"}), dedup_window=8)
T0 = 1_800_000_000.0
WORKSPACES = ("ws_a", "ws_b")


def command_ids(kind: str) -> st.SearchStrategy[str]:
    """A small pool per command type: plenty of repeats (ids are unique per command)."""
    return st.sampled_from([f"{kind}{i}" for i in range(6)])


statuses = st.sampled_from([*STATUSES, "mystery"])

confirms = st.builds(
    lambda cid, ws: PasskeyConfirm(
        command_id=cid,
        request_id=f"r-{cid}",
        workspace_id=ws,
        account_id="acc",
        issued_at=datetime.fromtimestamp(T0, UTC),
    ),
    command_ids("c"),
    st.sampled_from(WORKSPACES),
)
registers = st.builds(
    lambda cid, ws, status, prov: RegisterAccount(
        command_id=cid,
        workspace_id=ws,
        account_id="acc",
        provider=prov,
        provider_account_ref="ref",
        status=status,
    ),
    command_ids("r"),
    st.sampled_from(WORKSPACES),
    statuses,
    st.sampled_from(["simulator", None, "nowhere"]),
)
observes = st.builds(
    lambda cid, status: ObserveAuthState(
        command_id=cid, account_id="acc", status=status, auth_status=status
    ),
    command_ids("o"),
    statuses,
)
deregisters = st.builds(
    lambda cid, ws: DeregisterAccount(command_id=cid, workspace_id=ws, account_id="acc"),
    command_ids("d"),
    st.sampled_from(WORKSPACES),
)
commands = st.one_of(confirms, confirms, registers, observes, deregisters)
provider_results = st.sampled_from(
    [
        ProviderAuthState("passkey_confirmation_sent", "passkey_confirmation_sent"),
        ServiceError.of("provider_unavailable"),
        ServiceError.of("provider_account_mismatch"),
        ServiceError.of("provider_unavailable").refine(30010),
    ]
)


def apply(
    record: AccountRecord | None, cmd: Command, now: float, result: Any
) -> tuple[AccountRecord | None, Decision, int]:
    """One command through decide (+ provider settle when called). Returns calls made."""
    d = decide(record, cmd, now=now, policy=POLICY)
    calls = 0
    if d.call is not None:
        assert d.record is not None and d.record.in_flight is not None
        assert d.record.in_flight.command_id == cmd.command_id
        calls = 1
        d = settle_confirm(d.record, result, now=now, policy=POLICY)
    return (d.record if d.record is not None else record), d, calls


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(commands, provider_results), min_size=1, max_size=40))
def test_invariants_over_random_sequences(steps: list[tuple[Command, Any]]) -> None:
    record: AccountRecord | None = None
    first_reply: dict[tuple[str, str], Any] = {}
    owner: str | None = None
    now = T0
    for cmd, result in steps:
        now += 1.0
        before = record
        record, d, calls = apply(record, cmd, now, result)

        # the provider is never called for a command id the window remembers. The window is
        # the owning workspace's: a registration by another workspace starts a new one, and a
        # command id is only ever one workspace's (the same id from two workspaces is two
        # commands; counting calls per id over the whole sequence took them for one).
        if (
            isinstance(cmd, PasskeyConfirm)
            and before is not None
            and before.workspace_id == cmd.workspace_id
            and cmd.command_id in {o.command_id for o in before.recent}
        ):
            assert calls == 0, f"{cmd.command_id} is remembered, yet the provider was called"

        # versions never go down, and rise by exactly one per status event
        if before is not None and record is not None:
            assert record.version >= before.version
            bumped = record.version - before.version
            assert bumped == (1 if d.status_event is not None and d.verdict != "duplicate" else 0)
        if d.status_event is not None and d.verdict != "duplicate" and before is not None:
            ev = d.status_event
            # only transitions the machine allows (or a same-status auth_status refresh,
            # or a registration, which is administrative)
            if not isinstance(cmd, RegisterAccount) and ev.previous_status != ev.status:
                event = (
                    "confirm_passkey"
                    if isinstance(cmd, PasskeyConfirm)
                    else (f"observe_{ev.status}")
                )
                assert next_status(event, ev.previous_status or "") == ev.status

        # nothing is ever left in flight after a command is settled
        assert record is None or record.in_flight is None

        # workspace isolation: a foreign workspace never changes the record, and never
        # receives anything but 404 for a confirm
        if record is not None and owner is None and not record.deregistered:
            owner = record.workspace_id
        if (
            before is not None
            and not before.deregistered
            and getattr(cmd, "workspace_id", before.workspace_id) != before.workspace_id
        ):
            assert record == before
            if isinstance(cmd, PasskeyConfirm):
                assert d.reply is not None and d.reply.http_status == 404
        if record is not None and not record.deregistered:
            owner = record.workspace_id

        # a repeated command id is answered exactly as the first time (while remembered)
        if isinstance(cmd, PasskeyConfirm) and d.reply is not None:
            key = (cmd.command_id, cmd.workspace_id)
            if d.verdict == "duplicate":
                assert key in first_reply
                assert d.reply == first_reply[key]
                assert record == before
            else:
                first_reply[key] = d.reply  # the answer the window remembers


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=1000))
def test_expiry_only_after_deadline(offset: float) -> None:
    rec = AccountRecord(
        account_id="acc",
        workspace_id="ws_a",
        status="passkey_confirmation",
        version=1,
        auth_status="passkey_confirmation",
        updated_at=T0,
        provider="simulator",
        provider_account_ref="ref",
    )
    cmd = PasskeyConfirm(
        command_id="c",
        request_id="r",
        workspace_id="ws_a",
        account_id="acc",
        issued_at=datetime.fromtimestamp(T0, UTC),
    )
    intent = decide(rec, cmd, now=T0, policy=POLICY).record
    assert intent is not None
    sent = settle_confirm(
        intent,
        ProviderAuthState("passkey_confirmation_sent", "passkey_confirmation_sent"),
        now=T0,
        policy=POLICY,
    ).record
    assert sent is not None and sent.follow_up is not None
    d = expire(sent, now=T0 + offset, policy=POLICY)
    if T0 + offset < sent.follow_up.deadline_at:
        assert d.verdict == "ignored"
    else:
        assert d.record is not None and d.record.status == "failed"
