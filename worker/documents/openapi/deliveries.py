"""The OpenAPI table of the delivery routes, with the links a stateful fuzzer follows from each
answer naming a delivery; a resend's answer has none, since a scenario may start from it with a
made-up endpoint id (a 404 that tests nothing new)."""

from __future__ import annotations

from typing import Any, Final

from worker.api.webhooks import delivery_bodies
from worker.api.webhooks import delivery_log as log
from worker.api.webhooks.delivery_routes import WEBHOOK_DELIVERY, WEBHOOK_RESEND, WEBHOOK_TEST
from worker.api.webhooks.quotas import TOO_MANY
from worker.api.webhooks.routes import WEBHOOK_DELIVERIES
from worker.api.webhooks.sends import SENDS_PER_MINUTE
from worker.contract.messages import ID_PATTERN
from worker.contract.webhook_endpoints import EVENT_STATUS_CHANGED, EVENT_TYPES
from worker.documents.openapi.parts import (
    EMPTY_BODY,
    Failure,
    json_body,
    json_response,
    linked,
    operation,
    param,
    path_item,
)
from worker.documents.openapi.webhooks import ON_ENDPOINT, webhook_failures

_WEBHOOK_ID: Final = "msg_5d41402abc4b2a76b9719d911017c592"
_RID: Final = "req_example_1"
_EXAMPLE_ATTEMPT: Final = {
    "at": "2026-01-01T00:00:00.120Z",
    "status": 500,
    "latency_ms": 84,
    "response_excerpt": "<html><body>upstream error</body></html>",
    "response_truncated": False,
    "error_kind": None,
}
_EXAMPLE_EVENT: Final = {
    "webhook_id": _WEBHOOK_ID,
    "event_id": "0f8c2a4e-58e2-5b8e-9a53-4c1c6e1f2b7d",
    "event_type": EVENT_STATUS_CHANGED,
    "account_id": "acc_demo_1",
}
_EXAMPLE_DELIVERY: Final = {
    "delivery_id": _WEBHOOK_ID,
    **_EXAMPLE_EVENT,
    "version": 3,
    "status": "succeeded",
    "attempts": 2,
    "last_status": 200,
    "last_error": None,
    "next_attempt_at": None,
    "created_at": "2026-01-01T00:00:00.200Z",
    "updated_at": "2026-01-01T00:00:05.400Z",
    "replay_id": None,
    "test": False,
}
_SCAN_BUSY: Final = Failure(
    TOO_MANY,
    "No deliveries scan for the workspace now, answered at once: one of the same workspace"
    " is still being answered on this front-end (one at a time per workspace), every scan"
    " slot is in use, or the workspace's scans have used their share of scan time for now;"
    " retry after `Retry-After` seconds.",
)
_SENDS: Final = Failure(
    TOO_MANY,
    "The workspace queued its `WEBHOOK_SENDS_PER_MINUTE` resends and test sends (default"
    f" {SENDS_PER_MINUTE}, a burst of a third of it) of the minute, across the live"
    " front-ends; nothing was queued, retry after `Retry-After` seconds.",
)
_ID_SCHEMA: Final = {"type": "string", "pattern": ID_PATTERN, "maxLength": 128}
_ON_DELIVERY: Final = (
    *ON_ENDPOINT,
    param(
        "delivery_id",
        "path",
        "A `delivery_id` the endpoint's log shows (`msg_...`, maybe followed by `.` and a"
        " replay, resend or test id). Another endpoint's or workspace's answers 404 like an"
        " unknown one.",
        {**_ID_SCHEMA, "minLength": 1},
    ),
)
_LIST_QUERY: Final = {
    "status": (
        "Only deliveries in this state now.",
        {"type": "string", "enum": list(log.STATUSES)},
    ),
    "event_type": (
        "Only deliveries of this event type.",
        {"type": "string", "minLength": 1, "maxLength": 128, "examples": list(EVENT_TYPES)},
    ),
    "account_id": ("Only deliveries of this account.", _ID_SCHEMA),
    "since": (
        "Only deliveries that first appear in the log at or after this RFC 3339 date-time.",
        {"type": "string", "format": "date-time", "examples": ["2026-01-01T00:00:00Z"]},
    ),
    "until": (
        "Only deliveries that first appear in the log before this RFC 3339 date-time.",
        {"type": "string", "format": "date-time", "examples": ["2026-01-02T00:00:00Z"]},
    ),
    "limit": (
        f"Deliveries per page (default {log.PAGE_DEFAULT}).",
        {"type": "integer", "minimum": 1, "maximum": log.PAGE_MAX, "default": log.PAGE_DEFAULT},
    ),
    "cursor": (
        "The `next_cursor` of the previous page; absent for the first page.",
        {"type": "string", "pattern": log.CURSOR_PATTERN, "maxLength": log.CURSOR_MAX_CHARS},
    ),
}


def _to_delivery(response: dict[str, Any], pointer: str, endpoint: str) -> dict[str, Any]:
    """``response`` with links from the delivery at ``pointer`` (of the endpoint at
    ``endpoint``, a runtime expression) to reading and resending it, and to the log."""
    to_it = {"endpoint_id": endpoint, "delivery_id": f"$response.body#{pointer}"}
    return linked(
        response,
        getWebhookDelivery=to_it,
        resendWebhookDelivery=to_it,
        listWebhookDeliveries={"endpoint_id": endpoint},
    )


def _queued(kind: str) -> dict[str, Any]:
    send, account = ("rs_", "acc_demo_1") if kind == "resend" else ("ts_", "acc_test_send")
    data = {
        "delivery_id": f"{_WEBHOOK_ID}.{send}7c9e6679742545e2b0c0a4a1c4c2f4d1",
        **_EXAMPLE_EVENT,
        "account_id": account,
        "endpoint_id": "ep_0123456789abcdef0123456789abcdef",
        "kind": kind,
    }
    example = {"request_id": _RID, "data": data}
    return json_response("Queued.", delivery_bodies.QueuedResponse, example=example)


def delivery_paths() -> dict[str, Any]:
    page = {"request_id": _RID, "data": [_EXAMPLE_DELIVERY], "next_cursor": "c1.0.0.5000.4213.0"}
    attempts = [_EXAMPLE_ATTEMPT, {**_EXAMPLE_ATTEMPT, "status": 200, "response_excerpt": "ok"}]
    body = '{"type":"account.auth_status_changed","timestamp":"2026-01-01T00:00:00.000Z","data":{}}'
    detail = {
        "request_id": _RID,
        "data": {**_EXAMPLE_DELIVERY, "attempts_detail": attempts, "body": body},
    }
    in_path = "$request.path.endpoint_id"
    query = (param(name, "query", *spec) for name, spec in _LIST_QUERY.items())
    return {
        **path_item(
            WEBHOOK_DELIVERIES,
            get=operation(
                "listWebhookDeliveries",
                "The endpoint's delivery log",
                "The endpoint's deliveries, newest first, each with its latest state,"
                " filtered and paged by an opaque `cursor`. The pages of one cursor read"
                " the same stretch of the log: deliveries that arrive meanwhile do not"
                " shift them (no repeats, no gaps); a request without `cursor` sees them."
                " The log covers the endpoint's recent deliveries (the last"
                " `WEBHOOK_DELIVERIES_SCAN_RECORDS` records of its log partition).",
                webhook_failures(
                    "get_webhook_endpoint_failed",
                    "Malformed `endpoint_id`, a malformed query parameter (`status` not one"
                    f" of its values, `limit` not 1 to {log.PAGE_MAX}, a date-time"
                    " that is not RFC 3339), or a `cursor` not of the form this route"
                    " answers.",
                    _SCAN_BUSY,
                ),
                ok={
                    "200": _to_delivery(
                        json_response(
                            "One page of deliveries.",
                            delivery_bodies.DeliveryPageResponse,
                            example=page,
                        ),
                        "/data/0/delivery_id",
                        in_path,
                    )
                },
                params=(*ON_ENDPOINT, *query),
            ),
        ),
        **path_item(
            WEBHOOK_DELIVERY,
            get=operation(
                "getWebhookDelivery",
                "One delivery with every attempt",
                "Its latest state, every attempt the log holds (time, status, latency, the"
                " first bytes of the answer, the error kind) and the exact body sent.",
                webhook_failures(
                    "get_webhook_endpoint_failed",
                    "Malformed `endpoint_id` or `delivery_id`.",
                    _SCAN_BUSY,
                ),
                ok={
                    "200": _to_delivery(
                        json_response(
                            "The delivery.", delivery_bodies.DeliveryDetailResponse, example=detail
                        ),
                        "/data/delivery_id",
                        in_path,
                    )
                },
                params=_ON_DELIVERY,
            ),
        ),
        **path_item(
            WEBHOOK_RESEND,
            post=operation(
                "resendWebhookDelivery",
                "Send one delivery again",
                "Queued at once behind the account's newer events, with the same `webhook-id`"
                " and the same body (a Standard Webhooks redelivery: receivers de-duplicate on"
                " the id), through the normal delivery path (signing with the current secrets,"
                " retries, the log). Answers the new delivery's id.",
                webhook_failures(
                    "update_webhook_endpoint_failed",
                    "Malformed `endpoint_id` or `delivery_id`; a body that is not empty or a"
                    " JSON object; a delivery the log holds no body for (logged before"
                    " bodies were, or a note about the endpoint).",
                    _SCAN_BUSY,
                    _SENDS,
                ),
                ok={"202": _queued("resend")},
                params=_ON_DELIVERY,
                body=EMPTY_BODY,
            ),
        ),
        **path_item(
            WEBHOOK_TEST,
            post=operation(
                "sendWebhookTest",
                "Send a test event",
                "Queues an example event of `event_type` (the same model as the real ones,"
                ' marked `"test": true` at the top level of the body, beside `type`,'
                " `timestamp` and `data`) for the endpoint alone, whatever types it"
                " subscribes to, through the normal delivery path (the endpoint's gate,"
                " signing, retries, the log). Its account is `acc_test_send`.",
                webhook_failures(
                    "update_webhook_endpoint_failed",
                    "Malformed `endpoint_id`; a missing or invalid body (`event_type` not"
                    " one the service sends, unknown fields).",
                    _SENDS,
                ),
                ok={
                    "202": _to_delivery(
                        _queued("test"), "/data/delivery_id", "$response.body#/data/endpoint_id"
                    )
                },
                params=ON_ENDPOINT,
                body=json_body(delivery_bodies.TestSendBody, "Which event to send."),
            ),
        ),
    }
