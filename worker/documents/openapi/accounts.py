"""The OpenAPI table of an account's routes: the Passkey confirmation, the state query (poll or
long-poll) and the account's event history, with what each can answer."""

from __future__ import annotations

from typing import Any, Final

from worker.api.bodies import AuthResponse, AuthState, AuthStateResponse
from worker.api.idempotency import KEY_MAX_CHARS, KEY_RULE, REPLAYED_HEADER
from worker.api.routes import ACCOUNT_AUTH, PASSKEY_CONFIRM
from worker.api.webhooks import account_events
from worker.api.webhooks.follow_bodies import AccountEventsResponse
from worker.api.webhooks.follow_routes import ACCOUNT_EVENTS
from worker.api.webhooks.quotas import TOO_MANY
from worker.contract.messages import MAX_WAIT_MS, AuthData
from worker.documents.openapi.parts import (
    EMPTY_BODY,
    EXAMPLE_RID,
    KEY_CHECK,
    Failure,
    header,
    json_response,
    operation,
    param,
    path_item,
)
from worker.documents.openapi.webhooks import webhook_failures

_NOT_FOUND: Final = Failure(
    "not_found",
    "The account does not exist in the key's workspace (unknown, deregistered or another"
    " workspace's), or the route does not exist.",
)
_CONFIRM_FAILURES: Final = (
    Failure("invalid_request", f"Malformed `account_id` or body, or {KEY_RULE}."),
    Failure("provider_invalid_request"),
    *KEY_CHECK,
    _NOT_FOUND,
    Failure("account_already_authorized"),
    Failure("provider_not_ready", "The status is before the challenge, or `failed`."),
    Failure("account_binding_not_found"),
    Failure("provider_account_mismatch"),
    Failure(
        "run_auth_action_failed",
        "Unexpected failure or no outcome in time; check the account's state before retrying.",
    ),
    Failure("unsupported_by_provider", "The account's provider has no Passkey confirmation."),
    Failure("provider_unavailable", refined=(30010,)),
    Failure("provider_adapter_not_found"),
    Failure("idempotency_key_reused"),
    Failure("idempotency_key_in_progress"),
    Failure("idempotency_keys_exhausted"),
)
_IDEMPOTENCY_KEY: Final = param(
    "Idempotency-Key",
    "header",
    "Optional. A repeat of this request (same workspace, key, account and body byte for"
    " byte) within 24 hours answers the first answer (same status, `request_id` and"
    " `data`; `Idempotent-Replayed: true`) without confirming again, on any front-end"
    " replica. The key with another request answers 409 `idempotency_key_reused`; while"
    " the first request is being answered, 409 `idempotency_key_in_progress`. Keys are the"
    " workspace's own. A 500 keeps nothing: the key can be retried.",
    {
        "type": "string",
        "minLength": 1,
        "maxLength": KEY_MAX_CHARS,
        "pattern": f"^[!-~]{{1,{KEY_MAX_CHARS}}}$",
    },
    example="order-7f3a9c2e",
)
_AUTH_FAILURES: Final = (
    Failure(
        "invalid_request",
        "Malformed `account_id`, or `after_version` / `wait_s` not one value in its range.",
    ),
    *KEY_CHECK,
    _NOT_FOUND,
    Failure(
        "get_auth_state_failed",
        "No worker answered within `wait_s` + `API_REPLY_TIMEOUT_S` (or the front-end is"
        " starting); nothing was changed: retry shortly.",
    ),
)
#: The long-poll's query parameters (``worker.api.long_poll``).
_LONG_POLL: Final = (
    param(
        "after_version",
        "query",
        "The `data.version` the caller saw last. With `wait_s`, the answer comes as soon"
        " as the account's version is above it (within 50 ms if it already is). Without it, a"
        " long-poll waits past the version the account has when the query arrives.",
        {"type": "integer", "minimum": 0, "maximum": 2**53},
        example=0,
    ),
    param(
        "wait_s",
        "query",
        "Seconds to wait for a change past `after_version` (a long-poll). The answer is"
        " the state once the version passes it, or after `wait_s` (never sooner, at most a"
        " tenth of it later) the state as it is then (the same `version`): ask again with it;"
        " let the HTTP client wait `wait_s` + a tenth + a margin. Without it, or 0, the answer"
        " is immediate; a deployment may wait less (`API_LONG_POLL_MAX_S`), then answers"
        " after that long. A long-poll is one request of the workspace's rate limit. When too"
        " many wait at once (per account, per workspace, per worker) it is answered at"
        " once with the current state, never refused.",
        {"type": "number", "minimum": 0, "maximum": MAX_WAIT_MS // 1000},
        example=25,
    ),
)
#: The event history's query parameters: description, schema and example.
_EVENTS_QUERY: Final = {
    "cursor": (
        "The `next_cursor` of the previous page, unchanged.",
        {"type": "string", "minLength": 1, "maxLength": account_events.CURSOR_MAX_CHARS},
        "eyJ2IjoxfQ.AAAAAAAAAAAAAAAAAAAAAA",
    ),
    "limit": (
        f"Events per page, 1-{account_events.MAX_LIMIT} (default {account_events.DEFAULT_LIMIT}).",
        {"type": "integer", "minimum": 1, "maximum": account_events.MAX_LIMIT},
        account_events.DEFAULT_LIMIT,
    ),
    "since": (
        "The first page's start (RFC 3339), within the last 7 days. With `cursor` the cursor"
        " decides where the page starts: `since` may be sent again (as the first page's) and is"
        " then only checked for its form, otherwise ignored.",
        {"type": "string", "format": "date-time"},
        "2026-11-27T09:00:00Z",
    ),
}
_EVENTS_FAILURES: Final = webhook_failures(
    "get_webhook_endpoint_failed",
    "Malformed `account_id`, `limit` or `since`; a `cursor` this service did not issue for"
    " this account; an unknown or repeated query parameter.",
    Failure(
        "not_found",
        "The account has no event in the key's workspace within the window (unknown,"
        " another workspace's, or none yet: the answers are the same).",
    ),
    Failure(account_events.WINDOW_EXCEEDED),
    Failure(
        TOO_MANY,
        "An event-history read of the same workspace is still being answered on this"
        " front-end, every read slot is in use, or the workspace's reads have used"
        " their share of read time for now; retry after `Retry-After` seconds.",
    ),
    not_found=False,
)


def account_paths() -> dict[str, Any]:
    data = {"account_id": "acc_demo_1", "status": "passkey_confirmation_sent"}
    data["auth_status"] = data["status"]
    confirmed = AuthResponse(request_id=EXAMPLE_RID, data=AuthData(**data))
    state = AuthStateResponse(request_id=EXAMPLE_RID, data=AuthState(**data, version=3))
    replayed = header(
        {"type": "string", "const": "true"},
        "`true` on the kept answer of an `Idempotency-Key` sent again (the body is the first"
        " answer's, its `request_id` included).",
        False,
    )
    ok = json_response(
        "Confirmed: `status` and `auth_status` are `passkey_confirmation_sent` (or the current"
        " status when it was already sent).",
        AuthResponse,
        example=confirmed.model_dump(),
    )
    ok["headers"][REPLAYED_HEADER] = replayed
    on_account = ("AccountId", "RequestId")
    events_query = (
        param(name, "query", text, schema, examples={"example": {"value": example}})
        for name, (text, schema, example) in _EVENTS_QUERY.items()
    )
    return {
        **path_item(
            PASSKEY_CONFIRM,
            preflight="preflightPasskeyConfirm",
            post=operation(
                "confirmPasskey",
                "Confirm the pending Passkey challenge of an account",
                "Call it once the account's status is `passkey_confirmation`, then long-poll"
                f" `GET {ACCOUNT_AUTH}` (`after_version`, `wait_s`) until the status is"
                " `authorized` or `failed`. No body is required; an empty body or any JSON"
                " object (ignored) is accepted. On 500 check `GET .../auth` before retrying:"
                " the confirmation may still be applied.",
                _CONFIRM_FAILURES,
                ok={"200": ok},
                params=(*on_account, _IDEMPOTENCY_KEY),
                tag="auth",
                body=dict(EMPTY_BODY),
            ),
        ),
        **path_item(
            ACCOUNT_AUTH,
            preflight="preflightAuth",
            get=operation(
                "getAuthState",
                "Authentication state of an account (poll or long-poll)",
                "Ask until `status` is `authorized` or `failed`, best as a long-poll: pass the"
                " `data.version` of the last answer as `after_version` with `wait_s`, and the"
                " answer comes when the state changes. Answered by the worker that owns the"
                " account: a query sent after a confirmation's 200 shows that confirmation's"
                " outcome or a newer one.",
                _AUTH_FAILURES,
                ok={
                    "200": json_response(
                        "The account's current status and its version.",
                        AuthStateResponse,
                        example=state.model_dump(),
                    )
                },
                params=(*on_account, *_LONG_POLL),
                tag="auth",
            ),
        ),
        **path_item(
            ACCOUNT_EVENTS,
            get=operation(
                "listAccountEvents",
                "An account's status and error events",
                "The account's `account.auth_status_changed` and `account.auth_error` events in"
                " order, each with the `event_id`, `version` and body its webhook carries"
                " (polling and webhooks agree). Start from `since` (default: the start of the"
                " 7-day window) and continue with `next_cursor`; `has_more` says the page"
                " stopped short (a page reads a bounded number of records). 404 when the first"
                " page finds no event of the account in the key's workspace.",
                _EVENTS_FAILURES,
                ok={"200": json_response("A page of events.", AccountEventsResponse)},
                params=("AccountId", *events_query, "RequestId"),
                tag="auth",
            ),
        ),
    }
