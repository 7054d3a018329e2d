"""The OpenAPI table of the delivery routes: an endpoint's delivery log (paged, filtered), one
delivery with its attempts, a resend of one, and a test send; with examples, and the links the
stateful fuzzer follows: from each answer that names a delivery (a test send's, the log's first,
one delivery's) to reading it, resending it and the log, with both the endpoint id and the
delivery id. A resend's answer has no links: an operation with links is one the stateful phase
may also start a scenario with, with a made-up endpoint id (a 404 that tests nothing new)."""

from __future__ import annotations

from typing import Any, Final

from worker.api.webhooks.delivery_bodies import (
    DeliveryDetailResponse,
    DeliveryPageResponse,
    QueuedResponse,
    TestSendBody,
)
from worker.api.webhooks.delivery_log import (
    CURSOR_MAX_CHARS,
    CURSOR_PATTERN,
    PAGE_DEFAULT,
    PAGE_MAX,
    STATUSES,
)
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
    preflight,
)
from worker.documents.openapi.webhook_parts import webhook_failures, webhook_operation

_WEBHOOK_ID: Final = "msg_5d41402abc4b2a76b9719d911017c592"
_EXAMPLE_ATTEMPT: Final = {
    "at": "2026-01-01T00:00:00.120Z",
    "status": 500,
    "latency_ms": 84,
    "response_excerpt": "<html><body>upstream error</body></html>",
    "response_truncated": False,
    "error_kind": None,
}
_EXAMPLE_DELIVERY: Final = {
    "delivery_id": _WEBHOOK_ID,
    "webhook_id": _WEBHOOK_ID,
    "event_id": "0f8c2a4e-58e2-5b8e-9a53-4c1c6e1f2b7d",
    "event_type": EVENT_STATUS_CHANGED,
    "account_id": "acc_demo_1",
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
_RID: Final = "req_example_1"
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
_DELIVERY_ID: Final = {
    "name": "delivery_id",
    "in": "path",
    "required": True,
    "description": "A `delivery_id` the endpoint's log shows (`msg_...`, maybe followed by"
    " `.` and a replay, resend or test id). Another endpoint's or workspace's answers 404"
    " like an unknown one.",
    "schema": {"type": "string", "pattern": ID_PATTERN, "maxLength": 128, "minLength": 1},
}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_LIST_PARAMETERS: Final = (
    _query(
        "status",
        "Only deliveries in this state now.",
        {"type": "string", "enum": list(STATUSES)},
    ),
    _query(
        "event_type",
        "Only deliveries of this event type.",
        {"type": "string", "minLength": 1, "maxLength": 128, "examples": list(EVENT_TYPES)},
    ),
    _query(
        "account_id",
        "Only deliveries of this account.",
        {"type": "string", "pattern": ID_PATTERN, "maxLength": 128},
    ),
    _query(
        "since",
        "Only deliveries that first appear in the log at or after this RFC 3339 date-time.",
        {"type": "string", "format": "date-time", "examples": ["2026-01-01T00:00:00Z"]},
    ),
    _query(
        "until",
        "Only deliveries that first appear in the log before this RFC 3339 date-time.",
        {"type": "string", "format": "date-time", "examples": ["2026-01-02T00:00:00Z"]},
    ),
    _query(
        "limit",
        f"Deliveries per page (default {PAGE_DEFAULT}).",
        {"type": "integer", "minimum": 1, "maximum": PAGE_MAX, "default": PAGE_DEFAULT},
    ),
    _query(
        "cursor",
        "The `next_cursor` of the previous page; absent for the first page.",
        {"type": "string", "pattern": CURSOR_PATTERN, "maxLength": CURSOR_MAX_CHARS},
    ),
)


def _two_ids(operation_id: str) -> dict[str, Any]:
    """The preflight of a route with both ``endpoint_id`` and ``delivery_id`` in its path."""
    operation = preflight(operation_id, "endpoint_id")
    first = operation["parameters"][0]
    operation["parameters"].insert(1, {**first, "name": "delivery_id"})
    return operation


def _with(operation: dict[str, Any], *parameters: dict[str, Any]) -> dict[str, Any]:
    operation["parameters"] = [*operation["parameters"], *parameters]
    return operation


def _links(response: dict[str, Any], *, pointer: str, endpoint: str) -> dict[str, Any]:
    """``response`` with links from the delivery at ``pointer`` (of the endpoint at
    ``endpoint``, a runtime expression) to reading and resending it."""
    parameters = {"endpoint_id": endpoint, "delivery_id": f"$response.body#{pointer}"}
    return {
        **response,
        "links": {
            "GetWebhookDelivery": {"operationId": "getWebhookDelivery", "parameters": parameters},
            "ResendWebhookDelivery": {
                "operationId": "resendWebhookDelivery",
                "parameters": parameters,
            },
            "ListWebhookDeliveries": {
                "operationId": "listWebhookDeliveries",
                "parameters": {"endpoint_id": endpoint},
            },
        },
    }


def _queued_example(kind: str) -> dict[str, Any]:
    send = "rs_" if kind == "resend" else "ts_"
    return {
        "request_id": _RID,
        "data": {
            "delivery_id": f"{_WEBHOOK_ID}.{send}7c9e6679742545e2b0c0a4a1c4c2f4d1",
            "webhook_id": _WEBHOOK_ID,
            "event_id": "0f8c2a4e-58e2-5b8e-9a53-4c1c6e1f2b7d",
            "event_type": EVENT_STATUS_CHANGED,
            "account_id": "acc_demo_1" if kind == "resend" else "acc_test_send",
            "endpoint_id": "ep_0123456789abcdef0123456789abcdef",
            "kind": kind,
        },
    }


def delivery_paths() -> dict[str, Any]:
    """``GET .../deliveries``, ``GET .../deliveries/{delivery_id}``, ``POST .../resend``,
    ``POST .../test``."""
    read_failures = (
        *webhook_failures(
            "get_webhook_endpoint_failed",
            bad_request="Malformed `endpoint_id`, a malformed query parameter (`status` not"
            f" one of its values, `limit` not 1 to {PAGE_MAX}, a date-time that is not RFC"
            " 3339), or a `cursor` not of the form this route answers.",
        ),
        _SCAN_BUSY,
    )
    page_example = {
        "request_id": _RID,
        "data": [_EXAMPLE_DELIVERY],
        "next_cursor": "c1.0.0.5000.4213.0",
    }
    detail_example = {
        "request_id": _RID,
        "data": {
            **_EXAMPLE_DELIVERY,
            "attempts_detail": [
                _EXAMPLE_ATTEMPT,
                {**_EXAMPLE_ATTEMPT, "status": 200, "response_excerpt": "ok"},
            ],
            "body": '{"type":"account.auth_status_changed","timestamp":'
            '"2026-01-01T00:00:00.000Z","data":{}}',
        },
    }
    return {
        WEBHOOK_DELIVERIES: {
            "get": _with(
                webhook_operation(
                    "listWebhookDeliveries",
                    "The endpoint's delivery log",
                    "The endpoint's deliveries, newest first, each with its latest state,"
                    " filtered and paged by an opaque `cursor`. The pages of one cursor read"
                    " the same stretch of the log: deliveries that arrive meanwhile do not"
                    " shift them (no repeats, no gaps); a request without `cursor` sees them."
                    " The log covers the endpoint's recent deliveries (the last"
                    " `WEBHOOK_DELIVERIES_SCAN_RECORDS` records of its log partition).",
                    one_endpoint=True,
                    portal=True,
                    ok_status="200",
                    ok=_links(
                        json_response(
                            "One page of deliveries.", DeliveryPageResponse, example=page_example
                        ),
                        pointer="/data/0/delivery_id",
                        endpoint="$request.path.endpoint_id",
                    ),
                    failures=read_failures,
                ),
                *_LIST_PARAMETERS,
            ),
            "options": preflight("preflightWebhookDeliveries", "endpoint_id"),
        },
        WEBHOOK_DELIVERY: {
            "get": _with(
                webhook_operation(
                    "getWebhookDelivery",
                    "One delivery with every attempt",
                    "Its latest state, every attempt the log holds (time, status, latency,"
                    " the first bytes of the answer, the error kind) and the exact body sent.",
                    one_endpoint=True,
                    portal=True,
                    ok_status="200",
                    ok=_links(
                        json_response(
                            "The delivery.", DeliveryDetailResponse, example=detail_example
                        ),
                        pointer="/data/delivery_id",
                        endpoint="$request.path.endpoint_id",
                    ),
                    failures=(
                        *webhook_failures(
                            "get_webhook_endpoint_failed",
                            bad_request="Malformed `endpoint_id` or `delivery_id`.",
                        ),
                        _SCAN_BUSY,
                    ),
                ),
                _DELIVERY_ID,
            ),
            "options": _two_ids("preflightWebhookDelivery"),
        },
        WEBHOOK_RESEND: {
            "post": _with(
                webhook_operation(
                    "resendWebhookDelivery",
                    "Send one delivery again",
                    "Queued at once behind the account's newer events, with the same"
                    " `webhook-id` and the same body (a Standard Webhooks redelivery: receivers"
                    " de-duplicate on the id), through the normal delivery path (signing with"
                    " the current secrets, retries, the log). Answers the new delivery's id.",
                    one_endpoint=True,
                    portal=True,
                    ok_status="202",
                    ok=json_response("Queued.", QueuedResponse, example=_queued_example("resend")),
                    failures=(
                        *webhook_failures(
                            "update_webhook_endpoint_failed",
                            bad_request="Malformed `endpoint_id` or `delivery_id`; a body that"
                            " is not empty or a JSON object; a delivery the log holds no body"
                            " for (logged before bodies were, or a note about the endpoint).",
                        ),
                        _SCAN_BUSY,
                        _SENDS,
                    ),
                    body=EMPTY_BODY,
                ),
                _DELIVERY_ID,
            ),
            "options": _two_ids("preflightResendWebhookDelivery"),
        },
        WEBHOOK_TEST: {
            "post": webhook_operation(
                "sendWebhookTest",
                "Send a test event",
                "Queues an example event of `event_type` (the same model as the real ones,"
                ' marked `"test": true` at the top level of the body, beside `type`,'
                " `timestamp` and `data`) for the endpoint alone, whatever types it"
                " subscribes to, through the normal delivery path (the endpoint's gate,"
                " signing, retries, the log). Its account is `acc_test_send`.",
                one_endpoint=True,
                portal=True,
                ok_status="202",
                ok=_links(
                    json_response("Queued.", QueuedResponse, example=_queued_example("test")),
                    pointer="/data/delivery_id",
                    endpoint="$response.body#/data/endpoint_id",
                ),
                failures=(
                    *webhook_failures(
                        "update_webhook_endpoint_failed",
                        bad_request="Malformed `endpoint_id`; a missing or invalid body"
                        " (`event_type` not one the service sends, unknown fields).",
                    ),
                    _SENDS,
                ),
                body=json_body(TestSendBody, "Which event to send.", required=True),
            ),
            "options": preflight("preflightSendWebhookTest", "endpoint_id"),
        },
    }
