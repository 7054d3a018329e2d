"""The integrator's delivery routes on one endpoint (docs/api.md), each behind
``WebhookRoutes.endpoint_of``; reads take a scan slot (else 429 at once), sends a ``SendBudget``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from worker.api.bodies import json_response, valid_id
from worker.api.reading import invalid_path, invalid_query, request_id_of
from worker.api.webhooks.bodies import json_object_body
from worker.api.webhooks.clients import WebhookClients
from worker.api.webhooks.delivery_bodies import (
    DeliveryDetail,
    DeliveryDetailResponse,
    DeliveryItem,
    DeliveryPageResponse,
    QueuedData,
    QueuedResponse,
    TestSendBody,
)
from worker.api.webhooks.delivery_log import (
    PAGE_DEFAULT,
    PAGE_MAX,
    STATUSES,
    Delivery,
    Filters,
    decode_cursor,
    find,
    page,
)
from worker.api.webhooks.delivery_log_scan import DeliveryScanFailed, LogSlice
from worker.api.webhooks.guard import READ, UPDATE
from worker.api.webhooks.quotas import DELIVERY_SCANS, busy
from worker.api.webhooks.sends import SendBudget, new_send_id
from worker.contract.catalogue import ServiceError
from worker.contract.delivery_log import webhook_id
from worker.contract.webhook_endpoints import EndpointRecord
from worker.contract.webhook_events import EventCopy, parse_rfc3339
from worker.runtime.admission import NoRoom
from worker.runtime.logs import get_logger
from worker.webhooks.samples import sample_event

log = get_logger(__name__)

WEBHOOK_DELIVERY: Final = "/v1/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}"
WEBHOOK_RESEND: Final = "/v1/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/resend"
WEBHOOK_TEST: Final = "/v1/webhook-endpoints/{endpoint_id}/test"
DELIVERY_ROUTES: Final = (WEBHOOK_DELIVERY, WEBHOOK_RESEND, WEBHOOK_TEST)
DELIVERY_NOT_FOUND: Final = (
    "The delivery does not exist in this endpoint's recent log (or the endpoint in this workspace)."
)
UNAVAILABLE: Final = "The deliveries are not available right now; retry shortly."
SEND_TIMEOUT_S: Final = 10.0
"""How long a send waits for the broker's ack before answering that it is unconfirmed."""

EndpointOf = Callable[..., Awaitable[tuple[WebhookClients, str, EndpointRecord]]]


def filters_of(request: Request) -> tuple[Filters, int, str | None]:
    """The list's filters, page size and cursor from the query; 400 for any malformed one."""
    query = request.query_params
    status = query.get("status")
    if status is not None and status not in STATUSES:
        raise invalid_query(f"status must be one of {', '.join(STATUSES)}")
    event_type = query.get("event_type")
    if event_type is not None and not 0 < len(event_type) <= 128:
        raise invalid_query("event_type must be 1 to 128 characters")
    account_id = query.get("account_id")
    if account_id is not None and not valid_id(account_id):
        raise invalid_query("account_id must match the identifier format")
    since, until = (_instant(query.get(name), name) for name in ("since", "until"))
    limit_text = query.get("limit")
    limit = PAGE_DEFAULT
    if limit_text is not None:
        if not (limit_text.isascii() and limit_text.isdigit() and len(limit_text) <= 3):
            raise invalid_query(f"limit must be an integer from 1 to {PAGE_MAX}")
        limit = int(limit_text)
        if not 1 <= limit <= PAGE_MAX:
            raise invalid_query(f"limit must be an integer from 1 to {PAGE_MAX}")
    filters = Filters(status, event_type, account_id, since, until)
    return filters, limit, query.get("cursor")


def _instant(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_rfc3339(value)
    except ValueError:
        raise invalid_query(f"{name} must be an RFC 3339 date-time") from None


class DeliveryRoutes:
    """The handlers; ``endpoint_of`` is ``WebhookRoutes.endpoint_of``."""

    def __init__(self, *, endpoint_of: EndpointOf, budget: SendBudget) -> None:
        self._endpoint_of = endpoint_of
        self.budget = budget

    async def _read(
        self, clients: WebhookClients, workspace_id: str, record: EndpointRecord, **at: int | None
    ) -> LogSlice:
        try:
            return await clients.deliveries.read(record.id, owner=workspace_id, **at)
        except NoRoom as exc:
            raise busy(DELIVERY_SCANS, "deliveries scan", exc) from None
        except DeliveryScanFailed:
            raise ServiceError.of(READ, UNAVAILABLE) from None

    async def list_deliveries(self, request: Request) -> Response:
        clients, workspace_id, record = await self._endpoint_of(request, READ)
        filters, limit, cursor_text = filters_of(request)
        cursor = None
        if cursor_text is not None:
            cursor = decode_cursor(cursor_text, window=clients.deliveries.window)
        found = await self._read(
            clients,
            workspace_id,
            record,
            upto=None if cursor is None else cursor.hi,
            lo=None if cursor is None else cursor.lo,
        )
        shown, following = page(
            found, filters, before=None if cursor is None else cursor.before, limit=limit
        )
        body = DeliveryPageResponse(
            request_id=request_id_of(request),
            data=[DeliveryItem.of(d) for d in shown],
            next_cursor=None if following is None else following.encode(),
        )
        return json_response(body)

    async def _delivery(
        self, request: Request, failure: str, *, body: bool = False
    ) -> tuple[WebhookClients, EndpointRecord, Delivery]:
        clients, workspace_id, record = await self._endpoint_of(request, failure, body=body)
        wanted: str = request.path_params["delivery_id"]
        if not valid_id(wanted):
            raise invalid_path("delivery_id must be a delivery id this endpoint's log shows")
        found = await self._read(clients, workspace_id, record, upto=None, lo=None)
        delivery = find(found, wanted)
        if delivery is None or delivery.latest.workspace_id != workspace_id:
            raise ServiceError.of("not_found", DELIVERY_NOT_FOUND)
        return clients, record, delivery

    async def get(self, request: Request) -> Response:
        _, _, delivery = await self._delivery(request, READ)
        data = DeliveryDetail.of_detail(delivery)
        return json_response(DeliveryDetailResponse(request_id=request_id_of(request), data=data))

    async def resend(self, request: Request) -> Response:
        clients, record, delivery = await self._delivery(request, UPDATE, body=True)
        latest = delivery.latest
        if delivery.body is None or not latest.account_id:
            raise ServiceError.of(
                "invalid_request",
                "The delivery cannot be resent: the log holds no body for it (logged before"
                " bodies were, or a note about the endpoint). Replay its events instead.",
            )
        self.budget.spend(record.workspace_id)
        copy = EventCopy(
            event_type=latest.event_type,
            event_id=latest.event_id,
            account_id=latest.account_id,
            workspace_id=record.workspace_id,
            version=latest.version,
            occurred_at=latest.occurred_at or latest.updated_at,
            body=delivery.body,
        )
        return await self._queue(request, clients, record, copy, "resend")

    async def test(self, request: Request) -> Response:
        clients, _, record = await self._endpoint_of(request, UPDATE)
        body = await json_object_body(request, TestSendBody)
        self.budget.spend(record.workspace_id)
        event = sample_event(body.event_type, workspace_id=record.workspace_id, now=time.time())
        copy = EventCopy.of(event, record.workspace_id)
        return await self._queue(request, clients, record, copy, "test")

    async def _queue(
        self,
        request: Request,
        clients: WebhookClients,
        record: EndpointRecord,
        copy: EventCopy,
        kind: str,
    ) -> Response:
        send_id = new_send_id("resend" if kind == "resend" else "test")
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await clients.sends.queue(record, copy, send_id)
        except TimeoutError:
            raise ServiceError.of(
                UPDATE,
                "The send was not confirmed in time and may still be delivered; read the"
                " delivery log before retrying.",
            ) from None
        hook_id = webhook_id(copy.event_id, record.id)
        log.info(
            "webhook_send_queued",
            kind=kind,
            send_id=send_id,
            endpoint_id=record.id,
            workspace_id=record.workspace_id,
            webhook_id=hook_id,
        )
        data = QueuedData(
            delivery_id=f"{hook_id}.{send_id}",
            webhook_id=hook_id,
            event_id=copy.event_id,
            event_type=copy.event_type,
            account_id=copy.account_id,
            endpoint_id=record.id,
            kind="resend" if kind == "resend" else "test",
        )
        return json_response(QueuedResponse(request_id=request_id_of(request), data=data), 202)


__all__ = [
    "DELIVERY_ROUTES",
    "WEBHOOK_DELIVERY",
    "WEBHOOK_RESEND",
    "WEBHOOK_TEST",
    "DeliveryRoutes",
]
