"""The decision for each command on auth.commands (docs/architecture.md, "The confirm decision
table"): ``decide`` names every command type, and mypy proves none is left out. Pure: the I/O
around it is ``worker.auth.execute``'s."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, TypeAlias, assert_never

from worker.auth.answers import error_body, reply
from worker.auth.flow import (
    Decision,
    Headcount,
    Policy,
    failure,
    is_owner,
    observe,
    partition_quota,
    recorded,
    replay,
    settle,
    standstill,
    transition,
)
from worker.auth.machine import AUTHORIZED, CHALLENGE, SENT, STATUSES, next_status
from worker.contract.catalogue import ServiceError
from worker.contract.messages import (
    AccountRecord,
    AuthData,
    Command,
    DeregisterAccount,
    GetAuthState,
    InFlight,
    ObserveAuthState,
    PasskeyConfirm,
    RegisterAccount,
)


def decide(
    record: AccountRecord | None,
    cmd: Command,
    *,
    now: float,
    policy: Policy,
    headcount: Headcount | None = None,
) -> Decision:
    """Apply one command to one account record (docs/architecture.md, "The confirm decision
    table"). Pure. ``headcount`` is what a ``register_account`` is held to the workspace's
    account quota by (``None``: not counted)."""
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


def answer_query(record: AccountRecord | None, cmd: GetAuthState) -> Decision:
    """The reply to a ``get_auth_state`` query, from the record as it is: never a provider
    call, a record, an event or a dedup entry (a query changes nothing, so answering it twice
    is harmless). Unknown, deregistered and another workspace's accounts answer the same 404,
    as ``GET .../auth`` answers them. ``version`` is the record's, so the reply says how new the
    answer is."""
    if record is None or record.deregistered or not is_owner(record, cmd):
        err = ServiceError.of("not_found")
        failed = reply(
            error_body(err),
            command_id=cmd.command_id,
            request_id=cmd.request_id,
            account_id=cmd.account_id,
            http_status=err.http_status,
        )
        return Decision(verdict="error", reply=failed, error=err)
    data = AuthData(
        account_id=record.account_id, status=record.status, auth_status=record.auth_status
    )
    answered = reply(
        data,
        command_id=cmd.command_id,
        request_id=cmd.request_id,
        account_id=cmd.account_id,
        http_status=200,
        version=record.version,
    )
    return Decision(verdict="ok", reply=answered)


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
    seen = replay(record, cmd.command_id, with_reply=True)
    if seen is not None:
        return seen
    if record.deregistered:
        return failure(None, cmd, ServiceError.of("not_found"), now, policy)
    if record.status == SENT:
        return transition(
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
        return failure(record, cmd, ServiceError.of("account_already_authorized"), now, policy)
    if record.status != CHALLENGE:
        return failure(record, cmd, ServiceError.of("provider_not_ready"), now, policy)
    if not record.provider or not record.provider_account_ref:
        return failure(record, cmd, ServiceError.of("account_binding_not_found"), now, policy)
    if record.provider not in policy.providers:
        return failure(record, cmd, ServiceError.of("provider_adapter_not_found"), now, policy)
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
        outcome = standstill(
            record,
            command_id=intent.command_id,
            request_id=intent.request_id,
            now=now,
            err=result,
        )
        return settle(
            outcome,
            account_id=record.account_id,
            workspace_id=record.workspace_id,
            with_reply=True,
            verdict="error",
            new_record=recorded(record, outcome, policy, in_flight=None),
        )
    dest = next_status("confirm_passkey", record.status) or SENT
    return transition(
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


def _observe_command(
    record: AccountRecord | None, cmd: ObserveAuthState, now: float, policy: Policy
) -> Decision:
    if record is None or record.deregistered:
        return failure(None, cmd, ServiceError.of("not_found"), now, policy)
    seen = replay(record, cmd.command_id, with_reply=False)
    if seen is not None:
        return seen
    if cmd.status not in STATUSES:
        return failure(record, cmd, ServiceError.of("invalid_request"), now, policy)
    return observe(
        record, cmd.status, cmd.auth_status, command_id=cmd.command_id, now=now, policy=policy
    )


def _register(
    record: AccountRecord | None,
    cmd: RegisterAccount,
    now: float,
    policy: Policy,
    headcount: Headcount | None,
) -> Decision:
    if record is not None and record.workspace_id != cmd.workspace_id and not record.deregistered:
        return failure(None, cmd, ServiceError.of("invalid_request"), now, policy)
    if record is not None and record.workspace_id == cmd.workspace_id:
        seen = replay(record, cmd.command_id, with_reply=False)
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
    decision = transition(
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


def _over_quota(policy: Policy, headcount: Headcount | None) -> bool:
    """Whether the workspace holds its share of the quota on this partition already."""
    quota = policy.accounts_per_workspace
    if quota is None or headcount is None:
        return False
    return headcount.live >= partition_quota(quota, headcount.partitions)


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
    outcome = standstill(record, command_id=cmd.command_id, request_id=None, now=now)
    gone = recorded(record, outcome, policy, deregistered=True, in_flight=None, follow_up=None)
    return settle(
        outcome,
        account_id=record.account_id,
        workspace_id=record.workspace_id,
        with_reply=False,
        verdict="ok",
        new_record=gone,
    )
