"""The account flow: one ``transitions`` machine shared by every account, and the pure
decision around it (I/O is ``worker.auth.execute``'s), so the decision table is testable row by
row (docs/architecture.md, "The account flow", "The confirm decision table"; versioning:
"Design decisions"). ``docs/flow.md`` draws the machine (``worker.documents.flowchart``)."""

from __future__ import annotations

import zlib
from collections.abc import Container
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeAlias

from transitions import Machine

from worker.contract.catalogue import ServiceError
from worker.contract.compact_ids import compact_id
from worker.contract.messages import (
    AccountRecord,
    AuthData,
    AuthError,
    AuthStatusChanged,
    Command,
    DeregisterAccount,
    ErrorBody,
    FollowUp,
    GetAuthState,
    InFlight,
    ObserveAuthState,
    Outcome,
    PasskeyConfirm,
    RegisterAccount,
    Reply,
    ReplyBody,
    event_id,
    request_id_of,
    rfc3339,
    workspace_id_of,
)

# ---------------------------------------------------------------------------------------------
# Statuses and the machine
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Decision types
# ---------------------------------------------------------------------------------------------

Call = Literal["confirm_passkey", "redrive_confirm"]
Verdict = Literal["ok", "error", "duplicate", "ignored"]


@dataclass(frozen=True, slots=True)
class Policy:
    """The knobs the decision depends on; built from settings at start-up."""

    providers: Container[str]
    dedup_window: int = 8
    follow_up_poll_s: float = 2.0
    follow_up_poll_max_s: float = 30.0
    follow_up_deadline_s: float = 300.0
    command_deadline_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do: the record to persist (None: unchanged), the outputs, and whether the
    provider must be called before the command can be settled (then the outputs are empty and
    ``record`` carries the write-ahead intent)."""

    verdict: Verdict
    record: AccountRecord | None = None
    reply: Reply | None = None
    status_event: AuthStatusChanged | None = None
    error_event: AuthError | None = None
    call: Call | None = None
    error: ServiceError | None = None


# ---------------------------------------------------------------------------------------------
# Outputs, derived from an Outcome so a replay re-sends byte-identical messages
# ---------------------------------------------------------------------------------------------


def error_of(code: str, http_status: int, numeric_code: int | None) -> ServiceError:
    """Rebuild a catalogued error from its compact form (message from the catalogue)."""
    err = ServiceError.of(code, http_status=http_status)
    if numeric_code is not None and numeric_code != err.numeric_code:
        err = err.refine(numeric_code)
    return err


def outputs(
    outcome: Outcome,
    *,
    account_id: str,
    workspace_id: str | None,
    with_reply: bool,
) -> tuple[Reply | None, AuthStatusChanged | None, AuthError | None]:
    """The reply and events of one outcome. Pure function of its inputs: replays match."""
    when = rfc3339(outcome.at)
    command_id, request_id = outcome.command_id, outcome.request_id  # expanded once
    reply = status_event = error_event = None
    if outcome.code is not None:
        err = error_of(outcome.code, outcome.http_status, outcome.numeric_code)
        body = ErrorBody(code=err.code, numeric_code=err.numeric_code, message=err.message)
        error_event = AuthError(
            event_id=event_id("error", account_id, command_id or ""),
            account_id=account_id,
            workspace_id=workspace_id,
            command_id=command_id,
            request_id=request_id,
            http_status=outcome.http_status,
            error=body,
            occurred_at=when,
        )
        reply_body = ReplyBody(request_id=request_id or "", error=body)
    else:
        data = AuthData(
            account_id=account_id, status=outcome.status, auth_status=outcome.auth_status
        )
        reply_body = ReplyBody(request_id=request_id or "", data=data)
    if outcome.changed and workspace_id is not None:
        status_event = AuthStatusChanged(
            event_id=event_id("status", account_id, outcome.version),
            account_id=account_id,
            workspace_id=workspace_id,
            previous_status=outcome.previous_status,
            status=outcome.status,
            auth_status=outcome.auth_status,
            version=outcome.version,
            command_id=command_id,
            request_id=request_id,
            occurred_at=when,
        )
    if with_reply:
        reply = Reply(
            command_id=command_id or "",
            request_id=request_id or "",
            account_id=account_id,
            http_status=outcome.http_status,
            body=reply_body,
            version=outcome.version,
        )
    return reply, status_event, error_event


def _remember(record: AccountRecord, outcome: Outcome, window: int) -> tuple[Outcome, ...]:
    if outcome.cid is None:
        return record.recent
    return (*record.recent, outcome)[-window:]


def _recorded(
    record: AccountRecord, outcome: Outcome, policy: Policy, **changes: Any
) -> AccountRecord:
    """``record`` with ``changes``, ``outcome`` remembered in its window and its time as the
    record's: one copy per decision."""
    recent = _remember(record, outcome, policy.dedup_window)
    return replace(record, **changes, recent=recent, updated_at=outcome.at)


def _settle(
    outcome: Outcome,
    *,
    account_id: str,
    workspace_id: str | None,
    with_reply: bool,
    verdict: Verdict,
    new_record: AccountRecord | None,
) -> Decision:
    """Package an outcome: the record to persist (``_recorded``) and the outputs."""
    reply, status_event, error_event = outputs(
        outcome, account_id=account_id, workspace_id=workspace_id, with_reply=with_reply
    )
    err = (
        error_of(outcome.code, outcome.http_status, outcome.numeric_code) if outcome.code else None
    )
    return Decision(
        verdict=verdict,
        record=new_record,
        reply=reply,
        status_event=status_event,
        error_event=error_event,
        error=err,
    )


def is_owner(record: AccountRecord, cmd: Command) -> bool:
    """Whether ``cmd`` comes from the workspace that owns ``record`` (a command that names no
    workspace, the provider's observation, is the system's own). Anything another workspace
    sends must leave the record, its dedup window and its in-flight confirm alone and be
    answered exactly as for an account that does not exist."""
    workspace = workspace_id_of(cmd)
    return workspace is None or workspace == record.workspace_id


def _workspace_of(cmd: Command, record: AccountRecord | None) -> str | None:
    workspace = workspace_id_of(cmd)
    return workspace or (record.workspace_id if record is not None else None)


def _standstill(
    record: AccountRecord | None,
    *,
    command_id: str,
    request_id: str | None,
    now: float,
    err: ServiceError | None = None,
) -> Outcome:
    """The outcome of a command that leaves the auth state as it is: an error, or a
    deregistration."""
    return Outcome(
        cid=compact_id(command_id),
        rid=None if request_id is None else compact_id(request_id),
        http_status=err.http_status if err else 200,
        code=err.code if err else None,
        numeric_code=err.numeric_code if err else None,
        status=record.status if record else "",
        auth_status=record.auth_status if record else "",
        version=record.version if record else 0,
        at=now,
    )


def _failure(
    record: AccountRecord | None,
    cmd: Command,
    err: ServiceError,
    now: float,
    policy: Policy,
) -> Decision:
    """A failed command: error reply (confirm only) and error event; state unchanged. With a
    record, the outcome is remembered in its window; without one (unknown or foreign
    account) nothing is written."""
    outcome = _standstill(
        record,
        command_id=cmd.command_id,
        request_id=request_id_of(cmd),
        now=now,
        err=err,
    )
    remembered = None if record is None else _recorded(record, outcome, policy)
    return _settle(
        outcome,
        account_id=cmd.account_id,
        workspace_id=_workspace_of(cmd, record),
        with_reply=isinstance(cmd, PasskeyConfirm),
        verdict="error",
        new_record=remembered,
    )


def _transition(
    record: AccountRecord,
    *,
    status: str,
    auth_status: str,
    command_id: str | None,
    request_id: str | None,
    now: float,
    policy: Policy,
    with_reply: bool,
    in_flight: InFlight | None = None,
) -> Decision:
    """Move the record to (status, auth_status); one version, one status event."""
    changed = (status, auth_status) != (record.status, record.auth_status)
    version = record.version + 1 if changed else record.version
    follow_up = record.follow_up
    if status == SENT and (changed or follow_up is None):
        follow_up = FollowUp(
            deadline_at=now + policy.follow_up_deadline_s,
            next_poll_at=now + policy.follow_up_poll_s,
        )
    elif status != SENT:
        follow_up = None
    outcome = Outcome(
        cid=None if command_id is None else compact_id(command_id),
        rid=None if request_id is None else compact_id(request_id),
        http_status=200,
        previous_status=record.status or None,
        status=status,
        auth_status=auth_status,
        version=version,
        changed=changed,
        at=now,
    )
    new = _recorded(
        record,
        outcome,
        policy,
        status=status,
        auth_status=auth_status,
        version=version,
        in_flight=in_flight,
        follow_up=follow_up,
    )
    return _settle(
        outcome,
        account_id=record.account_id,
        workspace_id=record.workspace_id,
        with_reply=with_reply,
        verdict="ok",
        new_record=new,
    )


# ---------------------------------------------------------------------------------------------
# The decisions
# ---------------------------------------------------------------------------------------------


def replay(record: AccountRecord, command_id: str, *, with_reply: bool) -> Decision | None:
    """The original outputs of a command seen before, or None if it is not in the window."""
    cid = compact_id(command_id)
    for outcome in record.recent:
        if outcome.cid == cid:
            reply, status_event, error_event = outputs(
                outcome,
                account_id=record.account_id,
                workspace_id=record.workspace_id,
                with_reply=with_reply,
            )
            return Decision(
                verdict="duplicate",
                reply=reply,
                status_event=status_event,
                error_event=error_event,
            )
    return None


def decide(record: AccountRecord | None, cmd: Command, *, now: float, policy: Policy) -> Decision:
    """Apply one command to one account record (docs/architecture.md, "The confirm decision
    table"). Pure."""
    if isinstance(cmd, PasskeyConfirm):
        return _confirm(record, cmd, now, policy)
    if isinstance(cmd, ObserveAuthState):
        return _observe_command(record, cmd, now, policy)
    if isinstance(cmd, RegisterAccount):
        return _register(record, cmd, now, policy)
    if isinstance(cmd, GetAuthState):
        return answer_query(record, cmd)
    return _deregister(record, cmd, now, policy)


def answer_query(record: AccountRecord | None, cmd: GetAuthState) -> Decision:
    """The reply to a ``get_auth_state`` query, from the record as it is: never a provider
    call, a record, an event or a dedup entry (a query changes nothing, so answering it twice
    is harmless). Unknown, deregistered and another workspace's accounts answer the same 404,
    as ``GET .../auth`` always did. ``version`` is the record's, so the reply says how new the
    answer is."""
    if record is None or record.deregistered or not is_owner(record, cmd):
        err = ServiceError.of("not_found")
        body = ErrorBody(code=err.code, numeric_code=err.numeric_code, message=err.message)
        reply = Reply(
            command_id=cmd.command_id,
            request_id=cmd.request_id,
            account_id=cmd.account_id,
            http_status=err.http_status,
            body=ReplyBody(request_id=cmd.request_id, error=body),
        )
        return Decision(verdict="error", reply=reply, error=err)
    data = AuthData(
        account_id=record.account_id, status=record.status, auth_status=record.auth_status
    )
    reply = Reply(
        command_id=cmd.command_id,
        request_id=cmd.request_id,
        account_id=cmd.account_id,
        http_status=200,
        body=ReplyBody(request_id=cmd.request_id, data=data),
        version=record.version,
    )
    return Decision(verdict="ok", reply=reply)


def _confirm(
    record: AccountRecord | None, cmd: PasskeyConfirm, now: float, policy: Policy
) -> Decision:
    # Never reveal another workspace's account: foreign and unknown answer the same 404 and
    # the same error event (attributed to the caller), and the dedup window is only
    # consulted for the owner's commands.
    if record is None or not is_owner(record, cmd):
        return _failure(None, cmd, ServiceError.of("not_found"), now, policy)
    if record.in_flight is not None and record.in_flight.command_id == cmd.command_id:
        # Replayed after a crash during the provider call: ask the provider, then settle.
        return Decision(verdict="ok", record=record, call="redrive_confirm")
    seen = replay(record, cmd.command_id, with_reply=True)
    if seen is not None:
        return seen
    if record.deregistered:
        return _failure(None, cmd, ServiceError.of("not_found"), now, policy)
    if record.status == SENT:
        return _transition(
            record,
            status=SENT,
            auth_status=record.auth_status,
            command_id=cmd.command_id,
            request_id=cmd.request_id,
            now=now,
            policy=policy,
            with_reply=True,
        )
    if record.status == AUTHORIZED:
        return _failure(record, cmd, ServiceError.of("account_already_authorized"), now, policy)
    if record.status != CHALLENGE:
        return _failure(record, cmd, ServiceError.of("provider_not_ready"), now, policy)
    if not record.provider or not record.provider_account_ref:
        return _failure(record, cmd, ServiceError.of("account_binding_not_found"), now, policy)
    if record.provider not in policy.providers:
        return _failure(record, cmd, ServiceError.of("provider_adapter_not_found"), now, policy)
    deadline = cmd.deadline.timestamp() if cmd.deadline else now + policy.command_deadline_s
    if deadline <= now:
        return _failure(record, cmd, ServiceError.of("run_auth_action_failed"), now, policy)
    intent = InFlight(
        command_id=cmd.command_id, request_id=cmd.request_id, started_at=now, deadline=deadline
    )
    return Decision(
        verdict="ok",
        record=replace(record, in_flight=intent, updated_at=now),
        call="confirm_passkey",
    )


class ProviderView(Protocol):
    """What the decision needs of a provider's answer about the account's flow (the adapter's
    ``ProviderAuthState``); a protocol, so the decision imports nothing of the provider's."""

    @property
    def status(self) -> str: ...

    @property
    def auth_status(self) -> str: ...


#: What a provider call came to: its view of the flow, or the catalogued error it maps to.
ProviderOutcome: TypeAlias = ProviderView | ServiceError


def settle_confirm(
    record: AccountRecord,
    result: ProviderOutcome,
    *,
    now: float,
    policy: Policy,
) -> Decision:
    """Finish the in-flight confirm with the provider's answer: its view of the flow, or a
    catalogued error. Clears the write-ahead intent."""
    intent = record.in_flight
    if intent is None:
        raise ValueError(f"account {record.account_id} has no confirm in flight")
    if isinstance(result, ServiceError):
        outcome = _standstill(
            record,
            command_id=intent.command_id,
            request_id=intent.request_id,
            now=now,
            err=result,
        )
        return _settle(
            outcome,
            account_id=record.account_id,
            workspace_id=record.workspace_id,
            with_reply=True,
            verdict="error",
            new_record=_recorded(record, outcome, policy, in_flight=None),
        )
    dest = next_status("confirm_passkey", record.status) or SENT
    return _transition(
        record,
        status=dest,
        auth_status=result.auth_status or dest,
        command_id=intent.command_id,
        request_id=intent.request_id,
        now=now,
        policy=policy,
        with_reply=True,
        in_flight=None,
    )


def observe(
    record: AccountRecord,
    status: str,
    auth_status: str,
    *,
    command_id: str | None,
    now: float,
    policy: Policy,
) -> Decision:
    """The provider reports (status, auth_status): take the machine's transition, if any.

    A report of the current status only refreshes auth_status; a report the machine forbids
    (a stale or out-of-order signal) is ignored and changes nothing.
    """
    if status == record.status:
        if auth_status == record.auth_status:
            return Decision(verdict="ignored")
    elif next_status(f"observe_{status}", record.status) is None:
        return Decision(verdict="ignored")
    return _transition(
        record,
        status=status,
        auth_status=auth_status,
        command_id=command_id,
        request_id=None,
        now=now,
        policy=policy,
        with_reply=False,
    )


def _observe_command(
    record: AccountRecord | None, cmd: ObserveAuthState, now: float, policy: Policy
) -> Decision:
    if record is None or record.deregistered:
        return _failure(None, cmd, ServiceError.of("not_found"), now, policy)
    seen = replay(record, cmd.command_id, with_reply=False)
    if seen is not None:
        return seen
    if cmd.status not in STATUSES:
        return _failure(record, cmd, ServiceError.of("invalid_request"), now, policy)
    return observe(
        record, cmd.status, cmd.auth_status, command_id=cmd.command_id, now=now, policy=policy
    )


def expire(record: AccountRecord, *, now: float, policy: Policy) -> Decision:
    """The follow-up deadline passed without a final status: the flow ends failed."""
    dest = next_status("expire", record.status)
    if dest is None or record.follow_up is None or now < record.follow_up.deadline_at:
        return Decision(verdict="ignored")
    return _transition(
        record,
        status=dest,
        auth_status=dest,
        command_id=None,
        request_id=None,
        now=now,
        policy=policy,
        with_reply=False,
    )


def reschedule(record: AccountRecord, *, now: float, policy: Policy) -> AccountRecord:
    """The next follow-up poll, after one that did not resolve the flow."""
    if record.follow_up is None:
        return record
    polls = record.follow_up.polls + 1
    follow_up = replace(
        record.follow_up,
        next_poll_at=now + poll_interval(record.account_id, polls, policy),
        polls=polls,
    )
    return replace(record, follow_up=follow_up, updated_at=now)


def poll_interval(account_id: str, polls: int, policy: Policy) -> float:
    """Seconds to the next poll after ``polls`` unresolved ones: the poll interval doubling
    up to ``follow_up_poll_max_s``, minus up to a quarter of jitter. A flow the user leaves
    open costs a handful of calls instead of one per interval until the deadline, and
    accounts confirmed together spread out. The jitter is a hash of (account, poll), not a
    random draw, so the decision stays pure and a replay schedules the same poll."""
    ceiling = max(policy.follow_up_poll_s, policy.follow_up_poll_max_s)
    interval = min(ceiling, policy.follow_up_poll_s * 2.0 ** min(polls, 32))
    spread = zlib.crc32(f"{account_id}:{polls}".encode()) / 2**32
    return interval * (1.0 - 0.25 * spread)


def _register(
    record: AccountRecord | None, cmd: RegisterAccount, now: float, policy: Policy
) -> Decision:
    if record is not None and record.workspace_id != cmd.workspace_id and not record.deregistered:
        return _failure(None, cmd, ServiceError.of("invalid_request"), now, policy)
    if record is not None and record.workspace_id == cmd.workspace_id:
        seen = replay(record, cmd.command_id, with_reply=False)
        if seen is not None:
            return seen
    if cmd.status not in STATUSES:
        return _failure(record, cmd, ServiceError.of("invalid_request"), now, policy)
    # A re-registration keeps the version count, the auth state unless it was deregistered,
    # and the dedup window of the same workspace.
    live = record if record is not None and not record.deregistered else None
    same = record if record is not None and record.workspace_id == cmd.workspace_id else None
    base = AccountRecord(
        account_id=cmd.account_id,
        workspace_id=cmd.workspace_id,
        status=live.status if live else "",
        auth_status=live.auth_status if live else "",
        version=record.version if record else 0,
        updated_at=now,
        provider=cmd.provider,
        provider_account_ref=cmd.provider_account_ref,
        recent=same.recent if same else (),
    )
    decision = _transition(
        base,
        status=cmd.status,
        auth_status=cmd.status,
        command_id=cmd.command_id,
        request_id=None,
        now=now,
        policy=policy,
        with_reply=False,
    )
    return decision


def _deregister(
    record: AccountRecord | None, cmd: DeregisterAccount, now: float, policy: Policy
) -> Decision:
    # Another workspace's account is ignored exactly like an unknown one: an error event
    # here would tell the caller's webhooks that the id exists elsewhere.
    if record is None or record.deregistered or not is_owner(record, cmd):
        return Decision(verdict="ignored")
    seen = replay(record, cmd.command_id, with_reply=False)
    if seen is not None:
        return seen
    outcome = _standstill(record, command_id=cmd.command_id, request_id=None, now=now)
    gone = _recorded(record, outcome, policy, deregistered=True, in_flight=None, follow_up=None)
    return _settle(
        outcome,
        account_id=record.account_id,
        workspace_id=record.workspace_id,
        with_reply=False,
        verdict="ok",
        new_record=gone,
    )
