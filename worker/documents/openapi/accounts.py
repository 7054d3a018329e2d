"""The OpenAPI table of an account's routes: the Passkey confirmation and the state query (poll
or long-poll), with what each can answer."""

from __future__ import annotations

from typing import Any, Final

from worker.api.bodies import AuthResponse, AuthState, AuthStateResponse
from worker.api.idempotency import KEY_MAX_CHARS, KEY_RULE, REPLAYED_HEADER
from worker.api.routes import ACCOUNT_AUTH, PASSKEY_CONFIRM
from worker.contract.messages import MAX_WAIT_MS, AuthData
from worker.documents.openapi.parts import (
    BODY_TIMEOUT,
    EMPTY_BODY,
    EXAMPLE_RID,
    KEY_CHECK,
    Failure,
    error_responses,
    json_response,
    preflight,
)

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
    BODY_TIMEOUT,
    Failure("idempotency_key_reused"),
    Failure("idempotency_key_in_progress"),
    Failure("idempotency_keys_exhausted"),
)
#: ``Idempotency-Key`` of the confirm (``worker.api.idempotency``).
_IDEMPOTENCY_KEY: Final = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": (
        "Optional. A repeat of this request (same workspace, key, account and body byte for"
        " byte) within 24 hours answers the first answer (same status, `request_id` and"
        " `data`; `Idempotent-Replayed: true`) without confirming again, on any front-end"
        " replica. The key with another request answers 409 `idempotency_key_reused`; while"
        " the first request is being answered, 409 `idempotency_key_in_progress`. Keys are the"
        " workspace's own. A 500 keeps nothing: the key can be retried."
    ),
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": KEY_MAX_CHARS,
        "pattern": f"^[!-~]{{1,{KEY_MAX_CHARS}}}$",
    },
    "example": "order-7f3a9c2e",
}
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
    {
        "name": "after_version",
        "in": "query",
        "required": False,
        "description": (
            "The `data.version` the caller saw last. With `wait_s`, the answer comes as soon"
            " as the account's version is above it (at once if it already is). Without it, a"
            " long-poll waits past the version the account has when the query arrives."
        ),
        "schema": {"type": "integer", "minimum": 0, "maximum": 2**53},
        "example": 0,
    },
    {
        "name": "wait_s",
        "in": "query",
        "required": False,
        "description": (
            "Seconds to wait for a change past `after_version` (a long-poll). The answer is"
            " the state once the version passes it, or after `wait_s` the state as it is then"
            " (the same `version`): ask again with it. Without it, or 0, the answer is"
            " immediate; a deployment may wait less (`API_LONG_POLL_MAX_S`), then answers"
            " after that long. A long-poll is one request of the workspace's rate limit. When too"
            " many wait at once (per account, per workspace, per worker) it is answered at"
            " once with the current state, never refused."
        ),
        "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_MS // 1000},
        "example": 25,
    },
)


def _auth_ok(description: str) -> dict[str, Any]:
    example = AuthResponse(
        request_id=EXAMPLE_RID,
        data=AuthData(
            account_id="acc_demo_1",
            status="passkey_confirmation_sent",
            auth_status="passkey_confirmation_sent",
        ),
    )
    return json_response(description, AuthResponse, example=example.model_dump())


def _state_ok(description: str) -> dict[str, Any]:
    example = AuthStateResponse(
        request_id=EXAMPLE_RID,
        data=AuthState(
            account_id="acc_demo_1",
            status="passkey_confirmation_sent",
            auth_status="passkey_confirmation_sent",
            version=3,
        ),
    )
    return json_response(description, AuthStateResponse, example=example.model_dump())


def _replayable(response: dict[str, Any]) -> dict[str, Any]:
    """A confirm's answer, which a repeated ``Idempotency-Key`` gets again."""
    response["headers"][REPLAYED_HEADER] = {
        "required": False,
        "description": "`true` on the kept answer of an `Idempotency-Key` sent again (the"
        " body is the first answer's, its `request_id` included).",
        "schema": {"type": "string", "const": "true"},
    }
    return response


def account_paths() -> dict[str, Any]:
    """``POST .../passkey-confirm`` and ``GET .../auth`` (``worker.api.routes``)."""
    parameters = [
        {"$ref": "#/components/parameters/AccountId"},
        {"$ref": "#/components/parameters/RequestId"},
    ]
    return {
        PASSKEY_CONFIRM: {
            "post": {
                "operationId": "confirmPasskey",
                "summary": "Confirm the pending Passkey challenge of an account",
                "description": (
                    "Call it once the account's status is `passkey_confirmation`, then"
                    f" long-poll `GET {ACCOUNT_AUTH}` (`after_version`, `wait_s`) until the"
                    " status is `authorized` or `failed`."
                    " No body is required; an empty body or any JSON object (ignored) is"
                    " accepted. On 500 check `GET .../auth` before retrying: the"
                    " confirmation may still be applied."
                ),
                "tags": ["auth"],
                "security": [{"ApiKey": []}],
                "parameters": [*parameters, _IDEMPOTENCY_KEY],
                "requestBody": dict(EMPTY_BODY),
                "responses": {
                    "200": _replayable(
                        _auth_ok(
                            "Confirmed: `status` and `auth_status` are"
                            " `passkey_confirmation_sent` (or the current status when it was"
                            " already sent)."
                        )
                    ),
                    **error_responses(_CONFIRM_FAILURES),
                },
            },
            "options": preflight("preflightPasskeyConfirm", "account_id"),
        },
        ACCOUNT_AUTH: {
            "get": {
                "operationId": "getAuthState",
                "summary": "Authentication state of an account (poll or long-poll)",
                "description": (
                    "Ask until `status` is `authorized` or `failed`, best as a long-poll:"
                    " pass the `data.version` of the last answer as `after_version` with"
                    " `wait_s`, and the answer comes when the state changes. Answered by"
                    " the worker that owns the account: a query sent after a"
                    " confirmation's 200 shows that confirmation's outcome or a newer one."
                ),
                "tags": ["auth"],
                "security": [{"ApiKey": []}],
                "parameters": [*parameters, *_LONG_POLL],
                "responses": {
                    "200": _state_ok("The account's current status and its version."),
                    **error_responses(_AUTH_FAILURES),
                },
            },
            "options": preflight("preflightAuth", "account_id"),
        },
    }
