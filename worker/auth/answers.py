"""Replies and error events: the one place the worker builds them, so a decided command, a
query and a dead-lettered record answer in the same shape (docs/api.md, "Errors";
docs/architecture.md, "Failure handling"). ``outputs`` derives a decision's messages from its
``Outcome``, so a replay re-sends byte-identical ones."""

from __future__ import annotations

from worker.contract.catalogue import ServiceError
from worker.contract.messages import (
    AuthData,
    AuthError,
    AuthStatusChanged,
    ErrorBody,
    Outcome,
    Reply,
    ReplyBody,
    event_id,
    rfc3339,
)


def error_of(code: str, http_status: int, numeric_code: int | None) -> ServiceError:
    """Rebuild a catalogued error from its compact form (message from the catalogue)."""
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


def error_event(
    error: ErrorBody,
    *,
    event_id: str,
    account_id: str,
    workspace_id: str | None,
    command_id: str | None,
    request_id: str | None,
    http_status: int,
    occurred_at: str,
) -> AuthError:
    """The error event on auth.errors of one failed command (or dead-lettered record)."""
    return AuthError(
        event_id=event_id,
        account_id=account_id,
        workspace_id=workspace_id,
        command_id=command_id,
        request_id=request_id,
        http_status=http_status,
        error=error,
        occurred_at=occurred_at,
    )


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
    status_event = failed = None
    answer: AuthData | ErrorBody
    if outcome.code is not None:
        answer = error_body(error_of(outcome.code, outcome.http_status, outcome.numeric_code))
        failed = error_event(
            answer,
            event_id=event_id("error", account_id, command_id or ""),
            account_id=account_id,
            workspace_id=workspace_id,
            command_id=command_id,
            request_id=request_id,
            http_status=outcome.http_status,
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
    answered = None
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
