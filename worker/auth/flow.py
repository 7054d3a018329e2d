"""What every decision of the account flow is made of: the ``Policy`` it depends on, the
``Decision`` it returns, the outcome it records in the account's dedup window, and the
decisions that are not a command's (the provider's report, the follow-up's expiry and next
poll). Pure: I/O is ``worker.auth.execute``'s, so the decision table is testable row by row
(docs/architecture.md, "The account flow", "The confirm decision table"; versioning: "Design
decisions"). The commands' decisions are ``worker.auth.commands``'s; which status may follow
which, ``worker.auth.machine``'s."""

from __future__ import annotations

import math
import zlib
from collections.abc import Container
from dataclasses import dataclass, replace
from typing import Any, Literal

from worker.auth.answers import error_of, outputs
from worker.auth.machine import SENT, next_status
from worker.contract.catalogue import ServiceError
from worker.contract.compact_ids import compact_id
from worker.contract.messages import (
    AccountRecord,
    AuthError,
    AuthStatusChanged,
    Command,
    FollowUp,
    InFlight,
    Outcome,
    PasskeyConfirm,
    Reply,
    request_id_of,
    workspace_id_of,
)

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
    accounts_per_workspace: int | None = None
    """The workspace account quota (``WORKER_ACCOUNTS_PER_WORKSPACE``), enforced per partition
    (``partition_quota``); ``None``: no quota."""


@dataclass(frozen=True, slots=True)
class Headcount:
    """What a ``register_account`` is decided against: the live (not deregistered) accounts
    its workspace holds on the command's partition, and how many partitions the commands
    topic has (the store holds one partition's accounts only)."""

    live: int
    partitions: int


def joins(before: AccountRecord | None, decision: Decision) -> bool:
    """Whether ``decision`` makes a new live account (none, or a deregistered one, before)."""
    after = decision.record
    new = before is None or before.deregistered
    return new and after is not None and not after.deregistered


def partition_quota(quota: int, partitions: int) -> int:
    """A workspace's share of ``quota`` on one of ``partitions``: the mean ``m = quota /
    partitions`` plus four standard deviations of how keys spread (binomial: at most
    ``sqrt(m)``) plus 4 for small quotas, never more than the quota. Account ids hash to
    partitions unevenly, so an exact ``ceil(m)`` would refuse a workspace still under its
    quota on its fullest partition; with this headroom that happens with a probability of the
    order of 1e-5 per partition, and the workspace can hold at most ``partitions`` times this in
    all (docs/architecture.md, "Resource bounds")."""
    mean = quota / max(1, partitions)
    return min(quota, math.ceil(mean + 4 * math.sqrt(mean) + 4))


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
# Settling an outcome: the record to persist and the outputs (``worker.auth.answers``)
# ---------------------------------------------------------------------------------------------


def _remember(record: AccountRecord, outcome: Outcome, window: int) -> tuple[Outcome, ...]:
    if outcome.cid is None:
        return record.recent
    return (*record.recent, outcome)[-window:]


def recorded(
    record: AccountRecord, outcome: Outcome, policy: Policy, **changes: Any
) -> AccountRecord:
    """``record`` with ``changes``, ``outcome`` remembered in its window and its time as the
    record's: one copy per decision."""
    recent = _remember(record, outcome, policy.dedup_window)
    return replace(record, **changes, recent=recent, updated_at=outcome.at)


def settle(
    outcome: Outcome,
    *,
    account_id: str,
    workspace_id: str | None,
    with_reply: bool,
    verdict: Verdict,
    new_record: AccountRecord | None,
) -> Decision:
    """Package an outcome: the record to persist (``recorded``) and the outputs."""
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


def standstill(
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


def failure(
    record: AccountRecord | None,
    cmd: Command,
    err: ServiceError,
    now: float,
    policy: Policy,
) -> Decision:
    """A failed command: error reply (confirm only) and error event; state unchanged. With a
    record, the outcome is remembered in its window; without one (unknown or foreign
    account) nothing is written."""
    outcome = standstill(
        record,
        command_id=cmd.command_id,
        request_id=request_id_of(cmd),
        now=now,
        err=err,
    )
    remembered = None if record is None else recorded(record, outcome, policy)
    return settle(
        outcome,
        account_id=cmd.account_id,
        workspace_id=_workspace_of(cmd, record),
        with_reply=isinstance(cmd, PasskeyConfirm),
        verdict="error",
        new_record=remembered,
    )


def transition(
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
    new = recorded(
        record,
        outcome,
        policy,
        status=status,
        auth_status=auth_status,
        version=version,
        in_flight=in_flight,
        follow_up=follow_up,
    )
    return settle(
        outcome,
        account_id=record.account_id,
        workspace_id=record.workspace_id,
        with_reply=with_reply,
        verdict="ok",
        new_record=new,
    )


# ---------------------------------------------------------------------------------------------
# Decisions that are not a command's: the provider's report, the follow-up
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
    return transition(
        record,
        status=status,
        auth_status=auth_status,
        command_id=command_id,
        request_id=None,
        now=now,
        policy=policy,
        with_reply=False,
    )


def expire(record: AccountRecord, *, now: float, policy: Policy) -> Decision:
    """The follow-up deadline passed without a final status: the flow ends failed."""
    dest = next_status("expire", record.status)
    if dest is None or record.follow_up is None or now < record.follow_up.deadline_at:
        return Decision(verdict="ignored")
    return transition(
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
