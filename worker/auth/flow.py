"""The worker's whole decision, read top to bottom: per command kind, a pure function of (record,
command, now, policy) to a ``Decision`` with its replies and events; the I/O is
``worker.auth.execute``'s (docs/architecture.md, "The confirm decision table").
Over 500 lines: the decision is one table, read in one place."""

from __future__ import annotations

import math
import zlib
from collections.abc import Container
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeAlias, assert_never

from worker.auth.machine import AUTHORIZED, CHALLENGE, SENT, STATUSES, next_status
from worker.contract.catalogue import ServiceError
from worker.contract.compact_ids import compact_id
from worker.contract.messages import (
    AccountRecord,
    AuthData,
    AuthError,
    AuthStatusChanged,
    Command,
    DecodeFailure,
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
    #: The workspace account quota, enforced per partition (``partition_quota``); None: none.
    accounts_per_workspace: int | None = None


@dataclass(frozen=True, slots=True)
class Headcount:
    """What a ``register_account`` is held to: the workspace's live accounts on the command's
    partition, and the partition count (the store holds one partition's accounts only)."""

    live: int
    partitions: int


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


def decide(
    record: AccountRecord | None,
    cmd: Command,
    *,
    now: float,
    policy: Policy,
    headcount: Headcount | None = None,
) -> Decision:
    """Apply one command to one account record; mypy proves no command type is left out."""
    match cmd:
        case PasskeyConfirm():
            return _confirm(record, cmd, now, policy)
        case ObserveAuthState():
            return _observe_command(record, cmd, now, policy)
        case RegisterAccount():
            return _register(record, cmd, now, policy, headcount)
        case GetAuthState():
            return answer_query(record, cmd)
        case DeregisterAccount():
            return _deregister(record, cmd, now, policy)
        case _:
            assert_never(cmd)


# -- passkey_confirm ------------------------------------------------------------------------


def _confirm(
    record: AccountRecord | None, cmd: PasskeyConfirm, now: float, policy: Policy
) -> Decision:
    # Never reveal another workspace's account: foreign and unknown answer the same 404 and
    # the same error event (attributed to the caller), and the dedup window is only
    # consulted for the owner's commands.
    if record is None or not is_owner(record, cmd):
        return failure(None, cmd, ServiceError.of("not_found"), now, policy)
    if record.in_flight is not None and record.in_flight.command_id == cmd.command_id:
        # Redelivered after a crash during the provider call: ask the provider, then settle.
        return Decision(verdict="ok", record=record, call="redrive_confirm")
    seen = earlier_outputs(record, cmd.command_id, with_reply=True)
    if seen is not None:
        return seen
    if record.deregistered:
        return failure(None, cmd, ServiceError.of("not_found"), now, policy)
    if record.status == SENT:
        return _transition(
            record,
            SENT,
            record.auth_status,
            cmd.command_id,
            cmd.request_id,
            now,
            policy,
            with_reply=True,
        )
    if record.status == AUTHORIZED:
        code = "account_already_authorized"
    elif record.status != CHALLENGE:
        code = "provider_not_ready"
    elif not record.provider or not record.provider_account_ref:
        code = "account_binding_not_found"
    elif record.provider not in policy.providers:
        code = "provider_adapter_not_found"
    else:
        deadline = cmd.deadline.timestamp() if cmd.deadline else now + policy.command_deadline_s
        if deadline <= now:
            return failure(record, cmd, ServiceError.of("run_auth_action_failed"), now, policy)
        intent = InFlight(
            command_id=cmd.command_id, request_id=cmd.request_id, started_at=now, deadline=deadline
        )
        return Decision(
            verdict="ok",
            record=replace(record, in_flight=intent, updated_at=now),
            call="confirm_passkey",
        )
    return failure(record, cmd, ServiceError.of(code), now, policy)


def unsettled_intent(record: AccountRecord | None, cmd: Command) -> bool:
    """Whether ``record`` carries the intent of another confirm than ``cmd`` (one let go
    unsettled, or written by an older version before its owner crashed): it is settled first,
    so ``cmd`` sees the provider's real answer. Not for another workspace's command, which is
    answered as for an unknown account and must not touch the owner's confirm."""
    return (
        record is not None
        and record.in_flight is not None
        and record.in_flight.command_id != cmd.command_id
        and is_owner(record, cmd)
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


@dataclass(frozen=True, slots=True)
class _Seen:
    status: str
    auth_status: str


def redriven(seen: ProviderView) -> ProviderView | None:
    """A re-driven confirm, given the provider's state of the flow: None while the challenge is
    still pending there (confirm again, same idempotency key); past it, our confirm was applied,
    so it is answered as the first attempt would have been (the follow-up reports the rest)."""
    return None if seen.status == CHALLENGE else _Seen(SENT, SENT)


def settle_confirm(
    record: AccountRecord, result: ProviderOutcome, *, now: float, policy: Policy
) -> Decision:
    """Finish the in-flight confirm with the provider's answer; clears the write-ahead intent."""
    intent = record.in_flight
    if intent is None:
        raise ValueError(f"account {record.account_id} has no confirm in flight")
    if isinstance(result, ServiceError):
        return _unchanged(
            record,
            intent.command_id,
            intent.request_id,
            record.account_id,
            record.workspace_id,
            now,
            policy,
            with_reply=True,
            err=result,
            in_flight=None,
        )
    dest = next_status("confirm_passkey", record.status) or SENT
    return _transition(
        record,
        dest,
        result.auth_status or dest,
        intent.command_id,
        intent.request_id,
        now,
        policy,
        with_reply=True,
        in_flight=None,
    )


# -- get_auth_state -------------------------------------------------------------------------


def answer_query(record: AccountRecord | None, cmd: GetAuthState) -> Decision:
    """The reply to a query, from the record as it is: nothing written (answering twice is
    harmless); unknown, deregistered and another workspace's accounts answer the same 404."""
    if record is None or record.deregistered or not is_owner(record, cmd):
        err, version = ServiceError.of("not_found"), None
        answer: AuthData | ErrorBody = error_body(err)
    else:
        err, version = None, record.version
        answer = AuthData(
            account_id=record.account_id, status=record.status, auth_status=record.auth_status
        )
    answered = reply(
        answer,
        command_id=cmd.command_id,
        request_id=cmd.request_id,
        account_id=cmd.account_id,
        http_status=err.http_status if err else 200,
        version=version,
    )
    return Decision(verdict="error" if err else "ok", reply=answered, error=err)


# -- observe_auth_state: the provider's report ----------------------------------------------


def _observe_command(
    record: AccountRecord | None, cmd: ObserveAuthState, now: float, policy: Policy
) -> Decision:
    if record is None or record.deregistered:
        return failure(None, cmd, ServiceError.of("not_found"), now, policy)
    seen = earlier_outputs(record, cmd.command_id, with_reply=False)
    if seen is not None:
        return seen
    if cmd.status not in STATUSES:
        return failure(record, cmd, ServiceError.of("invalid_request"), now, policy)
    return observe(
        record, cmd.status, cmd.auth_status, command_id=cmd.command_id, now=now, policy=policy
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
    """The provider reports (status, auth_status), by command or to a poll: a report of the
    current status only refreshes auth_status; one the machine forbids (stale, out of order)
    is ignored."""
    if status == record.status:
        if auth_status == record.auth_status:
            return Decision(verdict="ignored")
    elif next_status(f"observe_{status}", record.status) is None:
        return Decision(verdict="ignored")
    return _transition(record, status, auth_status, command_id, None, now, policy)


# -- register_account -----------------------------------------------------------------------


def _register(
    record: AccountRecord | None,
    cmd: RegisterAccount,
    now: float,
    policy: Policy,
    headcount: Headcount | None,
) -> Decision:
    if record is not None and record.workspace_id != cmd.workspace_id and not record.deregistered:
        return failure(None, cmd, ServiceError.of("invalid_request"), now, policy)
    same = record if record is not None and record.workspace_id == cmd.workspace_id else None
    if same is not None:
        seen = earlier_outputs(same, cmd.command_id, with_reply=False)
        if seen is not None:
            return seen
    if cmd.status not in STATUSES:
        return failure(record, cmd, ServiceError.of("invalid_request"), now, policy)
    # A re-registration keeps the version count, the auth state unless it was deregistered,
    # and the dedup window of the same workspace.
    live = record if record is not None and not record.deregistered else None
    if live is None and _over_quota(policy, headcount):
        # A new live account past the workspace's share on this partition: refused, and
        # nothing written. Re-registering a live account is never refused.
        return failure(None, cmd, ServiceError.of("workspace_account_quota_exceeded"), now, policy)
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
    return _transition(base, cmd.status, cmd.status, cmd.command_id, None, now, policy)


def _over_quota(policy: Policy, headcount: Headcount | None) -> bool:
    quota = policy.accounts_per_workspace
    if quota is None or headcount is None:
        return False
    return headcount.live >= partition_quota(quota, headcount.partitions)


def partition_quota(quota: int, partitions: int) -> int:
    """A workspace's share of ``quota`` on one of ``partitions``: the mean ``m = quota /
    partitions`` plus four standard deviations of how keys spread (binomial: at most
    ``sqrt(m)``) plus 4 for small quotas, never more than the quota. Account ids hash to
    partitions unevenly, so an exact ``ceil(m)`` would refuse a workspace still under its
    quota on its fullest partition; with this headroom that happens with a probability of the
    order of 1e-5 per partition (docs/architecture.md, "Resource bounds")."""
    mean = quota / max(1, partitions)
    return min(quota, math.ceil(mean + 4 * math.sqrt(mean) + 4))


def joins(before: AccountRecord | None, decision: Decision) -> bool:
    """Whether ``decision`` makes a new live account (none, or a deregistered one, before)."""
    after = decision.record
    new = before is None or before.deregistered
    return new and after is not None and not after.deregistered


# -- deregister_account ---------------------------------------------------------------------


def _deregister(
    record: AccountRecord | None, cmd: DeregisterAccount, now: float, policy: Policy
) -> Decision:
    # Another workspace's account is ignored exactly like an unknown one: an error event
    # here would tell the caller's webhooks that the id exists elsewhere.
    if record is None or record.deregistered or not is_owner(record, cmd):
        return Decision(verdict="ignored")
    seen = earlier_outputs(record, cmd.command_id, with_reply=False)
    if seen is not None:
        return seen
    return _unchanged(
        record,
        cmd.command_id,
        None,
        record.account_id,
        record.workspace_id,
        now,
        policy,
        deregistered=True,
        in_flight=None,
        follow_up=None,
    )


# -- the follow-up --------------------------------------------------------------------------


def expire(record: AccountRecord, *, now: float, policy: Policy) -> Decision:
    """The follow-up deadline passed without a final status: the flow ends failed."""
    dest = next_status("expire", record.status)
    if dest is None or record.follow_up is None or now < record.follow_up.deadline_at:
        return Decision(verdict="ignored")
    return _transition(record, dest, dest, None, None, now, policy)


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
    random draw, so the decision stays pure and a redelivery schedules the same poll."""
    ceiling = max(policy.follow_up_poll_s, policy.follow_up_poll_max_s)
    interval = min(ceiling, policy.follow_up_poll_s * 2.0 ** min(polls, 32))
    spread = zlib.crc32(f"{account_id}:{polls}".encode()) / 2**32
    return interval * (1.0 - 0.25 * spread)


# -- a dead letter --------------------------------------------------------------------------


def dead_lettered(
    command: Command | DecodeFailure,
    err: ServiceError,
    detail: str,
    *,
    event_id: str,
    occurred_at: str,
) -> tuple[AuthError | None, Reply | None]:
    """What a record sent to the DLQ still owes: an error event when its account id could be
    read, and a reply when its caller (command and request ids) could be read too."""
    if isinstance(command, DecodeFailure):
        workspace_id, request_id = command.workspace_id, command.request_id
    else:
        workspace_id, request_id = workspace_id_of(command), request_id_of(command)
    if command.account_id is None:
        return None, None
    body = error_body(err, detail)
    event = AuthError(
        event_id=event_id,
        account_id=command.account_id,
        workspace_id=workspace_id,
        command_id=command.command_id,
        request_id=request_id,
        http_status=err.http_status,
        error=body,
        occurred_at=occurred_at,
    )
    if command.command_id is None or request_id is None:
        return event, None
    answered = reply(
        body,
        command_id=command.command_id,
        request_id=request_id,
        account_id=command.account_id,
        http_status=err.http_status,
    )
    return event, answered


# -- what every decision is made of ---------------------------------------------------------


def is_owner(record: AccountRecord, cmd: Command) -> bool:
    """Whether ``cmd`` comes from the workspace that owns ``record`` (a command naming none, the
    provider's observation, is the system's own)."""
    workspace = workspace_id_of(cmd)
    return workspace is None or workspace == record.workspace_id


def earlier_outputs(record: AccountRecord, command_id: str, *, with_reply: bool) -> Decision | None:
    """A redelivered command's outputs, re-sent identically from its outcome in the dedup
    window; None if it is not there."""
    cid = compact_id(command_id)
    for outcome in record.recent:
        if outcome.cid == cid:
            answered, status_event, error_event = outputs(
                outcome,
                account_id=record.account_id,
                workspace_id=record.workspace_id,
                with_reply=with_reply,
            )
            return Decision(
                verdict="duplicate",
                reply=answered,
                status_event=status_event,
                error_event=error_event,
            )
    return None


def failure(
    record: AccountRecord | None, cmd: Command, err: ServiceError, now: float, policy: Policy
) -> Decision:
    """A failed command: error reply (confirm only) and error event; state unchanged, nothing
    written for an unknown or foreign account."""
    workspace_id = workspace_id_of(cmd) or (record.workspace_id if record is not None else None)
    return _unchanged(
        record,
        cmd.command_id,
        request_id_of(cmd),
        cmd.account_id,
        workspace_id,
        now,
        policy,
        with_reply=isinstance(cmd, PasskeyConfirm),
        err=err,
    )


def _unchanged(
    record: AccountRecord | None,
    command_id: str,
    request_id: str | None,
    account_id: str,
    workspace_id: str | None,
    now: float,
    policy: Policy,
    *,
    with_reply: bool = False,
    err: ServiceError | None = None,
    **changes: Any,
) -> Decision:
    """A command that leaves the auth state as it is (an error, a deregistration): its outcome
    remembered in ``record``'s window (with ``changes``) when there is a record."""
    outcome = Outcome(
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
    kept = None if record is None else _recorded(record, outcome, policy, **changes)
    verdict: Verdict = "error" if err else "ok"
    return _settle(outcome, account_id, workspace_id, with_reply, verdict, kept)


def _transition(
    record: AccountRecord,
    status: str,
    auth_status: str,
    command_id: str | None,
    request_id: str | None,
    now: float,
    policy: Policy,
    *,
    with_reply: bool = False,
    in_flight: InFlight | None = None,
) -> Decision:
    """Move the record to (status, auth_status): one version, one status event; entering
    ``SENT`` starts the follow-up, leaving it ends it."""
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
    return _settle(outcome, record.account_id, record.workspace_id, with_reply, "ok", new)


def _recorded(
    record: AccountRecord, outcome: Outcome, policy: Policy, **changes: Any
) -> AccountRecord:
    """``record`` with ``changes``, ``outcome`` remembered in its window and its time as the
    record's: one copy per decision."""
    recent = record.recent
    if outcome.cid is not None:
        recent = (*recent, outcome)[-policy.dedup_window :]
    return replace(record, **changes, recent=recent, updated_at=outcome.at)


def _settle(
    outcome: Outcome,
    account_id: str,
    workspace_id: str | None,
    with_reply: bool,
    verdict: Verdict,
    record: AccountRecord | None,
) -> Decision:
    answered, status_event, failed = outputs(
        outcome, account_id=account_id, workspace_id=workspace_id, with_reply=with_reply
    )
    err = (
        error_of(outcome.code, outcome.http_status, outcome.numeric_code) if outcome.code else None
    )
    return Decision(verdict, record, answered, status_event, failed, error=err)


# -- the replies and events of an outcome: the one place the worker builds them ---------------


def outputs(
    outcome: Outcome, *, account_id: str, workspace_id: str | None, with_reply: bool
) -> tuple[Reply | None, AuthStatusChanged | None, AuthError | None]:
    """The reply and events of one outcome. A pure function of its inputs, so a redelivered
    command re-sends byte-identical ones."""
    when = rfc3339(outcome.at)
    command_id, request_id = outcome.command_id, outcome.request_id  # expanded once
    status_event = failed = answered = None
    answer: AuthData | ErrorBody
    if outcome.code is not None:
        answer = error_body(error_of(outcome.code, outcome.http_status, outcome.numeric_code))
        failed = AuthError(
            event_id=event_id("error", account_id, command_id or ""),
            account_id=account_id,
            workspace_id=workspace_id,
            command_id=command_id,
            request_id=request_id,
            http_status=outcome.http_status,
            error=answer,
            occurred_at=when,
        )
    else:
        answer = AuthData(
            account_id=account_id, status=outcome.status, auth_status=outcome.auth_status
        )
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
        answered = reply(
            answer,
            command_id=command_id or "",
            request_id=request_id or "",
            account_id=account_id,
            http_status=outcome.http_status,
            version=outcome.version,
        )
    return answered, status_event, failed


def error_of(code: str, http_status: int, numeric_code: int | None) -> ServiceError:
    err = ServiceError.of(code, http_status=http_status)
    if numeric_code is not None and numeric_code != err.numeric_code:
        err = err.refine(numeric_code)
    return err


def error_body(err: ServiceError, detail: str | None = None) -> ErrorBody:
    """The contract's error object of ``err``; ``detail`` (what was wrong with a record the
    worker could not take) follows the catalogue's message."""
    message = err.message if detail is None else f"{err.message}: {detail}"
    return ErrorBody(code=err.code, numeric_code=err.numeric_code, message=message)


def reply(
    answer: AuthData | ErrorBody,
    *,
    command_id: str,
    request_id: str,
    account_id: str,
    http_status: int,
    version: int | None = None,
) -> Reply:
    """The one reply to a caller's command: the account's auth state, or an error."""
    if isinstance(answer, ErrorBody):
        body = ReplyBody(request_id=request_id, error=answer)
    else:
        body = ReplyBody(request_id=request_id, data=answer)
    return Reply(
        command_id=command_id,
        request_id=request_id,
        account_id=account_id,
        http_status=http_status,
        body=body,
        version=version,
    )
