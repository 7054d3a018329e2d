"""The OpenAPI tables of following the webhooks: a replay's state and its cancellation, and an
account's event history (``worker.api.webhooks.follow_routes``)."""

from __future__ import annotations

from typing import Any, Final

from worker.api.webhooks.account_events import (
    CURSOR_MAX_CHARS,
    DEFAULT_LIMIT,
    MAX_LIMIT,
    WINDOW_EXCEEDED,
)
from worker.api.webhooks.follow_bodies import AccountEventsResponse, ReplayStatusResponse
from worker.api.webhooks.follow_routes import (
    ACCOUNT_EVENTS,
    REPLAY_ID_RULE,
    WEBHOOK_REPLAY_CANCEL,
    WEBHOOK_REPLAY_STATUS,
)
from worker.api.webhooks.quotas import TOO_MANY
from worker.api.webhooks.replay_status import KEPT_FOR_S, KEPT_PER_WORKSPACE, REPLAY_ID_RE
from worker.documents.openapi.parts import Failure, json_response, preflight
from worker.documents.openapi.webhook_parts import (
    OPTIONAL_BODY,
    webhook_failures,
    webhook_operation,
)

_REPLAY_ID: Final = {
    "name": "replay_id",
    "in": "path",
    "required": True,
    "description": f"The `replay_id` the replay request answered; {REPLAY_ID_RULE}. A replay of"
    " another endpoint or workspace answers 404 like an unknown one.",
    "schema": {"type": "string", "pattern": REPLAY_ID_RE.pattern},
    "examples": {"replay": {"value": "rp_0f1e2d3c4b5a69788796a5b4c3d2e1f0"}},
}
_REPLAY_NOT_FOUND: Final = Failure(
    "not_found",
    "The endpoint or the replay does not exist in the key's workspace (unknown, of another"
    " endpoint or workspace, or no longer kept: the answers are the same), or the route does"
    " not exist.",
)
_CANCEL_BAD_REQUEST: Final = OPTIONAL_BODY.replace("`endpoint_id`", "`endpoint_id` or `replay_id`")
_KEPT: Final = (
    f"A workspace's newest {KEPT_PER_WORKSPACE} replays are kept, each for"
    f" {KEPT_FOR_S / 3600:g} hours after its last change."
)


def _query(name: str, description: str, schema: dict[str, Any], example: Any) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
        "examples": {"example": {"value": example}},
    }


def _preflight(operation_id: str) -> dict[str, Any]:
    """``OPTIONS`` on a route with two path parameters (``preflight`` names one)."""
    operation = preflight(operation_id, "endpoint_id")
    endpoint_id = operation["parameters"][0]
    operation["parameters"] = [
        *operation["parameters"],
        {**endpoint_id, "name": "replay_id"},
    ]
    return operation


def _replay_operation(operation_id: str, summary: str, description: str, **kw: Any) -> Any:
    operation = webhook_operation(operation_id, summary, description, one_endpoint=True, **kw)
    operation["parameters"].insert(1, _REPLAY_ID)
    return operation


def replay_links(response: dict[str, Any]) -> dict[str, Any]:
    """``response`` (a replay's 202) with links to following and cancelling that replay."""
    parameters = {
        "endpoint_id": "$response.body#/data/endpoint_id",
        "replay_id": "$response.body#/data/replay_id",
    }
    links = {
        "GetWebhookReplay": {"operationId": "getWebhookReplay", "parameters": parameters},
        "CancelWebhookReplay": {"operationId": "cancelWebhookReplay", "parameters": parameters},
    }
    return {**response, "links": links}


def follow_paths() -> dict[str, Any]:
    """``GET .../replays/{replay_id}``, ``POST .../replays/{replay_id}/cancel``,
    ``GET /v1/accounts/{account_id}/events``."""
    status = json_response("The replay.", ReplayStatusResponse)
    cancel = _replay_operation(
        "cancelWebhookReplay",
        "Cancel a replay",
        "202: the cancellation is asked for; the replica running the replay stops it within"
        " about a second (`state` becomes `cancelled`; events already handed to the"
        " dispatcher are still delivered). 200: the replay had already ended, it is unchanged.",
        ok_status="202",
        ok=json_response("The cancellation is asked for.", ReplayStatusResponse),
        failures=(
            *webhook_failures(
                "update_webhook_endpoint_failed",
                bad_request=_CANCEL_BAD_REQUEST,
                not_found=False,
            ),
            _REPLAY_NOT_FOUND,
        ),
    )
    cancel["responses"] = {
        "200": json_response("The replay had already ended: unchanged.", ReplayStatusResponse),
        **cancel["responses"],
    }
    return {
        WEBHOOK_REPLAY_STATUS: {
            "get": _replay_operation(
                "getWebhookReplay",
                "A replay's state and counts",
                "The state (`queued`, `running`, `done`, `cancelled`, `failed`) and counts of a"
                " replay started by `POST .../replay`, from any front-end replica. " + _KEPT,
                ok_status="200",
                ok=status,
                failures=(
                    *webhook_failures(
                        "get_webhook_endpoint_failed",
                        bad_request="Malformed `endpoint_id` or `replay_id`.",
                        not_found=False,
                    ),
                    _REPLAY_NOT_FOUND,
                ),
            ),
            "options": _preflight("preflightWebhookReplay"),
        },
        WEBHOOK_REPLAY_CANCEL: {
            "post": cancel,
            "options": _preflight("preflightCancelWebhookReplay"),
        },
        ACCOUNT_EVENTS: {
            "get": _events_operation(),
            "options": preflight("preflightAccountEvents", "account_id"),
        },
    }


def _events_operation() -> dict[str, Any]:
    operation = webhook_operation(
        "listAccountEvents",
        "An account's status and error events",
        "The account's `account.auth_status_changed` and `account.auth_error` events in order,"
        " each with the `event_id`, `version` and body its webhook carries (polling and"
        " webhooks agree). Start from `since` (default: the start of the 7-day window) and"
        " continue with `next_cursor`; `has_more` says the page stopped short (a page reads a"
        " bounded number of records). 404 when the first page finds no event of the account"
        " in the key's workspace.",
        one_endpoint=False,
        ok_status="200",
        ok=json_response("A page of events.", AccountEventsResponse),
        failures=(
            *webhook_failures(
                "get_webhook_endpoint_failed",
                bad_request="Malformed `account_id`, `limit` or `since`; a `cursor` this"
                " service did not issue for this account; an unknown or repeated query"
                " parameter.",
                not_found=False,
            ),
            Failure(
                "not_found",
                "The account has no event in the key's workspace within the window (unknown,"
                " another workspace's, or none yet: the answers are the same).",
            ),
            Failure(WINDOW_EXCEEDED),
            Failure(
                TOO_MANY,
                "An event-history read of the same workspace is still being answered on this"
                " front-end, every read slot is in use, or the workspace's reads have used"
                " their share of read time for now; retry after `Retry-After` seconds.",
            ),
        ),
    )
    operation["tags"] = ["auth"]
    operation["parameters"][:0] = [
        {"$ref": "#/components/parameters/AccountId"},
        _query(
            "cursor",
            "The `next_cursor` of the previous page, unchanged.",
            {"type": "string", "minLength": 1, "maxLength": CURSOR_MAX_CHARS},
            "eyJ2IjoxfQ.AAAAAAAAAAAAAAAAAAAAAA",
        ),
        _query(
            "limit",
            f"Events per page, 1-{MAX_LIMIT} (default {DEFAULT_LIMIT}).",
            {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
            DEFAULT_LIMIT,
        ),
        _query(
            "since",
            "The first page's start (RFC 3339), within the last 7 days. With `cursor` the"
            " cursor decides where the page starts: `since` may be sent again (as the first"
            " page's) and is then only checked for its form, otherwise ignored.",
            {"type": "string", "format": "date-time"},
            "2026-11-27T09:00:00Z",
        ),
    ]
    return operation
