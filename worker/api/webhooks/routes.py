"""The webhook-endpoint management routes and their checks, in the contract's order
(docs/api.md, "Webhook endpoints"). Reads come from the replica's registry, writes are
acknowledged then applied to it (read-your-writes), serialised per endpoint on a replica."""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Final, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from worker.api.bodies import json_response
from worker.api.metrics import ApiMetrics
from worker.api.reading import ACCOUNT_ID_RULE, check_body, path_id, request_id_of
from worker.api.webhooks import creates
from worker.api.webhooks.bodies import (
    CreateEndpointBody,
    EndpointData,
    EndpointListResponse,
    EndpointResponse,
    EndpointSecretResponse,
    EndpointWithSecret,
    ReplayAcceptedResponse,
    ReplayBody,
    ReplayData,
    UpdateEndpointBody,
    json_object_body,
)
from worker.api.webhooks.clients import WebhookClients
from worker.api.webhooks.creates import NewEndpoint, is_pending
from worker.api.webhooks.delivery_routes import (
    DELIVERY_ROUTES,
    WEBHOOK_DELIVERY,
    WEBHOOK_RESEND,
    WEBHOOK_TEST,
    DeliveryRoutes,
)
from worker.api.webhooks.guard import READ, UPDATE, WebhookHandlers
from worker.api.webhooks.quotas import EndpointLimits, EndpointQuota
from worker.api.webhooks.sends import SendBudget
from worker.api.webhooks.urls import url_form_allowed, url_rule_text
from worker.contract.catalogue import ServiceError
from worker.contract.operational_events import enabled_record
from worker.contract.webhook_endpoints import EndpointRecord
from worker.runtime.logs import get_logger
from worker.webhooks.targets import BlockedTarget, TargetPolicy, validate_url

log = get_logger(__name__)

WEBHOOK_ENDPOINTS: Final = "/v1/webhook-endpoints"
WEBHOOK_ENDPOINT: Final = "/v1/webhook-endpoints/{endpoint_id}"
WEBHOOK_DEACTIVATE: Final = "/v1/webhook-endpoints/{endpoint_id}/deactivate"
WEBHOOK_ACTIVATE: Final = "/v1/webhook-endpoints/{endpoint_id}/activate"
WEBHOOK_ROTATE: Final = "/v1/webhook-endpoints/{endpoint_id}/rotate-secret"
WEBHOOK_EXPIRE_PREVIOUS: Final = "/v1/webhook-endpoints/{endpoint_id}/expire-previous-secret"
WEBHOOK_DELIVERIES: Final = "/v1/webhook-endpoints/{endpoint_id}/deliveries"
WEBHOOK_REPLAY: Final = "/v1/webhook-endpoints/{endpoint_id}/replay"
WEBHOOK_ROUTES: Final = (
    WEBHOOK_ENDPOINTS,
    WEBHOOK_ENDPOINT,
    WEBHOOK_DEACTIVATE,
    WEBHOOK_ACTIVATE,
    WEBHOOK_ROTATE,
    WEBHOOK_EXPIRE_PREVIOUS,
    WEBHOOK_DELIVERIES,
    WEBHOOK_REPLAY,
    *DELIVERY_ROUTES,
)
ENDPOINT_ID_RULE: Final = ACCOUNT_ID_RULE.replace("account_id", "endpoint_id", 1)

UNCONFIRMED: Final = (
    "The change was not confirmed in time and may still be applied; read the webhook"
    " endpoints before retrying."
)

Written = TypeVar("Written")
Write = Callable[[WebhookClients, EndpointRecord], Awaitable[Written]]


class WebhookRoutes(WebhookHandlers):
    """The handlers (``WebhookHandlers``); ``limits`` and ``endpoints_per_workspace`` are the
    quotas (``worker.api.webhooks.quotas``), whose refusals ``metrics`` counts."""

    NOT_YET = "The webhook endpoints are not available yet; retry shortly."
    DOWN = "The webhook endpoints are not available."

    def __init__(
        self,
        *,
        clients: WebhookClients | None,
        admitted_workspace: Callable[[Request], str],
        policy: TargetPolicy,
        wait_s: float,
        limits: EndpointLimits,
        endpoints_per_workspace: int,
        metrics: ApiMetrics,
        sends_per_minute: int,
        replicas: Callable[[], int] | None,
    ) -> None:
        super().__init__(
            clients=clients,
            admitted_workspace=admitted_workspace,
            wait_s=wait_s,
            refused=lambda quota: metrics.quota_refusals.labels(quota).inc(),
        )
        self.policy = policy
        self.limits = limits
        self.metrics = metrics
        self.quota = (
            None
            if clients is None
            else EndpointQuota(
                clients.store.registry,
                endpoints_per_workspace,
                positions=clients.endpoints.positions,
                partitions=lambda: len(clients.endpoints.partitions),
            )
        )
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self.delivery_log = DeliveryRoutes(
            endpoint_of=self.endpoint_of,
            budget=SendBudget(sends_per_minute, replicas=replicas),
        )

    def routes(self) -> list[Route]:
        route = self.route
        deliveries = self.delivery_log  # worker.api.webhooks.delivery_routes
        off = "deactivate_webhook_endpoint_failed"
        return [
            route(WEBHOOK_ENDPOINTS, self.create, "POST", "create_webhook_endpoint_failed"),
            route(WEBHOOK_ENDPOINTS, self.list_endpoints, "GET", "list_webhook_endpoints_failed"),
            route(WEBHOOK_ENDPOINT, self.get, "GET", READ),
            route(WEBHOOK_ENDPOINT, self.update, "PATCH", UPDATE),
            route(WEBHOOK_ENDPOINT, self.delete, "DELETE", "delete_webhook_endpoint_failed"),
            route(WEBHOOK_DEACTIVATE, partial(self.set_status, "inactive", off), "POST", off),
            route(WEBHOOK_ACTIVATE, partial(self.set_status, "active", UPDATE), "POST", UPDATE),
            route(WEBHOOK_ROTATE, self.rotate, "POST", UPDATE),
            route(WEBHOOK_EXPIRE_PREVIOUS, self.expire_previous, "POST", UPDATE),
            route(WEBHOOK_REPLAY, self.replay, "POST", UPDATE),
            route(WEBHOOK_DELIVERIES, deliveries.list_deliveries, "GET", READ),
            route(WEBHOOK_DELIVERY, deliveries.get, "GET", READ),
            route(WEBHOOK_RESEND, deliveries.resend, "POST", UPDATE),
            route(WEBHOOK_TEST, deliveries.test, "POST", UPDATE),
        ]

    async def endpoint_of(
        self, request: Request, failure: str, *, body: bool = False
    ) -> tuple[WebhookClients, str, EndpointRecord]:
        """``_current`` and the endpoint of the key's workspace (the one 404 otherwise)."""
        clients, workspace_id, endpoint_id = await self._current(request, failure, body=body)
        return clients, workspace_id, self._find(clients, workspace_id, endpoint_id)

    # -- checks ------------------------------------------------------------------------------

    def _secrets_dropped(self, reason: str, before: EndpointRecord, after: EndpointRecord) -> None:
        """Count the secrets ``before`` held unexpired that ``after`` no longer holds."""
        now = time.time()
        kept = {s.ciphertext for s in after.secrets}
        dropped = sum(
            1
            for s in before.secrets
            if (s.expires_at is None or s.expires_at > now) and s.ciphertext not in kept
        )
        if dropped:
            self.metrics.secrets_dropped.labels(reason).inc(dropped)

    def _check_url(self, url: str) -> None:
        """The SSRF check of ``worker.webhooks.targets``, then the form the API document
        publishes (``worker.api.webhooks.urls``); the message names the reason, never the URL
        (it may hold a token)."""
        try:
            validate_url(url, self.policy)
        except BlockedTarget as exc:
            raise ServiceError.of(
                "invalid_request", f"The url is not allowed as a webhook target: {exc.reason}."
            ) from None
        allow_http = self.policy.allow_http
        if not url_form_allowed(url, allow_http=allow_http):
            raise ServiceError.of(
                "invalid_request",
                "The url is not allowed as a webhook target: url_form_not_allowed (it must be"
                f" {url_rule_text(allow_http=allow_http)}).",
            )

    @contextlib.asynccontextmanager
    async def _exclusive(self, workspace_id: str, endpoint_id: str) -> AsyncIterator[None]:
        """One write at a time per endpoint in this replica; the lock lives while used. Keyed
        by the caller's workspace too, so another workspace's requests naming the id never
        queue behind the owner's."""
        key = (workspace_id, endpoint_id)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            yield

    async def _locked(
        self, request: Request, failure: str, write: Write[Written]
    ) -> tuple[str, EndpointRecord, Written]:
        """The write routes' path: ``_current`` with an empty body, then ``write`` on the
        endpoint found under its write lock, confirmed: the workspace, the endpoint before,
        what ``write`` returned."""
        clients, workspace_id, endpoint_id = await self._current(request, failure, body=True)
        async with self._exclusive(workspace_id, endpoint_id):
            current = self._find(clients, workspace_id, endpoint_id)
            return workspace_id, current, await _confirmed(write(clients, current))

    async def _current(
        self, request: Request, failure: str, *, body: bool = False
    ) -> tuple[WebhookClients, str, str]:
        """The common head of the routes on one endpoint: key, configured, optional body,
        registry ready. The caller looks the endpoint up (under the write lock for writes)."""
        clients, workspace_id = self._caller(request, failure)
        endpoint_id = path_id(request, "endpoint_id")
        if body:
            await check_body(request)
        await self._ready(failure, clients.endpoints)
        return clients, workspace_id, endpoint_id

    # -- collection --------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        failure = "create_webhook_endpoint_failed"
        clients, workspace_id = self._caller(request, failure)
        body = await json_object_body(request, CreateEndpointBody)
        self.limits.check(url=body.url, description=body.description, event_types=body.event_types)
        self._check_url(body.url)
        event_types = None if body.event_types is None else tuple(dict.fromkeys(body.event_types))
        # The quota counts the registry: a replica still reading it would count too few.
        await self._ready(failure, clients.endpoints)
        assert self.quota is not None  # built with the clients
        new = NewEndpoint(
            body.url, event_types, body.description, body.rate_limit, body.auto_recover
        )
        record, secret = await creates.create(
            clients.store, self.quota, workspace_id, new, wait_s=self.wait_s
        )
        log.info("webhook_endpoint_created", endpoint_id=record.id, workspace_id=workspace_id)
        return _with_secret(request, record, secret, status_code=201)

    async def list_endpoints(self, request: Request) -> Response:
        clients, workspace_id = self._caller(request, "list_webhook_endpoints_failed")
        await self._ready("list_webhook_endpoints_failed", clients.endpoints)
        records = [
            r for r in clients.store.registry.of_workspace(workspace_id) if not is_pending(r)
        ]
        return json_response(
            EndpointListResponse(
                request_id=request_id_of(request), data=[EndpointData.of(r) for r in records]
            )
        )

    # -- one endpoint ------------------------------------------------------------------------

    async def get(self, request: Request) -> Response:
        clients, workspace_id, endpoint_id = await self._current(request, READ)
        return _endpoint(request, self._find(clients, workspace_id, endpoint_id))

    async def update(self, request: Request) -> Response:
        failure = UPDATE
        clients, workspace_id = self._caller(request, failure)
        endpoint_id = path_id(request, "endpoint_id")
        body = await json_object_body(request, UpdateEndpointBody)
        changes = body.changes()
        if not changes:
            raise ServiceError.of(
                "invalid_request",
                "The request body must change at least one of url, event_types, description,"
                " rate_limit, auto_recover.",
            )
        self.limits.check(
            url=changes.get("url"),
            description=changes.get("description"),
            event_types=body.event_types if "event_types" in changes else None,
        )
        if "url" in changes:
            self._check_url(changes["url"])
        await self._ready(failure, clients.endpoints)
        async with self._exclusive(workspace_id, endpoint_id):
            current = self._find(clients, workspace_id, endpoint_id)
            record = await _confirmed(clients.store.update(current, **changes))
        self._secrets_dropped("trimmed", current, record)
        log.info("webhook_endpoint_updated", endpoint_id=record.id, fields=sorted(changes))
        return _endpoint(request, record)

    async def set_status(self, status: str, failure: str, request: Request) -> Response:
        """``.../deactivate`` and ``.../activate``."""

        async def write(clients: WebhookClients, current: EndpointRecord) -> EndpointRecord:
            if status == "active" and current.status == "disabled":
                # Before the write, under the id of the revision it writes (no second id).
                announced = clients.announcer.announce(enabled_record(current))
                await asyncio.wait_for(announced, self.wait_s)  # else the route's 500
            return await clients.store.set_status(current, status)

        _, current, record = await self._locked(request, failure, write)
        self._secrets_dropped("trimmed", current, record)
        log.info("webhook_endpoint_status_set", endpoint_id=record.id, status=record.status)
        return _endpoint(request, record)

    async def delete(self, request: Request) -> Response:
        workspace_id, current, _ = await self._locked(
            request, "delete_webhook_endpoint_failed", lambda c, e: c.store.delete(e)
        )
        log.info("webhook_endpoint_deleted", endpoint_id=current.id, workspace_id=workspace_id)
        return Response(status_code=204)

    async def rotate(self, request: Request) -> Response:
        workspace_id, current, (record, secret) = await self._locked(
            request, UPDATE, lambda c, e: c.store.rotate(e)
        )
        self._secrets_dropped("rotated", current, record)
        log.info("webhook_secret_rotated", endpoint_id=record.id, workspace_id=workspace_id)
        return _with_secret(request, record, secret, status_code=200)

    async def expire_previous(self, request: Request) -> Response:
        """Only the current secret signs from now on (ends a rotation's overlap early)."""
        workspace_id, current, record = await self._locked(
            request, UPDATE, lambda c, e: c.store.expire_previous(e)
        )
        self._secrets_dropped("expired", current, record)
        log.info(
            "webhook_previous_secret_expired", endpoint_id=record.id, workspace_id=workspace_id
        )
        return _endpoint(request, record)

    async def replay(self, request: Request) -> Response:
        failure = UPDATE
        clients, workspace_id = self._caller(request, failure)
        endpoint_id = path_id(request, "endpoint_id")
        body = await json_object_body(request, ReplayBody)
        await self._ready(failure, clients.endpoints)
        record = self._find(clients, workspace_id, endpoint_id)
        replay_id = await clients.replays.begin(record, body.since)
        since = body.since.isoformat(timespec="microseconds").replace("+00:00", "Z")
        log.info("webhook_replay_started", replay_id=replay_id, endpoint_id=record.id, since=since)
        data = ReplayData(replay_id=replay_id, endpoint_id=record.id, since=since)
        return json_response(
            ReplayAcceptedResponse(request_id=request_id_of(request), data=data), 202
        )


async def _confirmed(write: Awaitable[Written]) -> Written:
    """``write``, with the store's catalogued 500 told the way the caller needs it: a produce
    that timed out may still reach the topic (the producer keeps the record), so the outcome
    is unknown, not "nothing happened"."""
    try:
        return await write
    except ServiceError as exc:
        raise ServiceError.of(exc.code, UNCONFIRMED) from None


def _endpoint(request: Request, record: EndpointRecord) -> Response:
    return json_response(
        EndpointResponse(request_id=request_id_of(request), data=EndpointData.of(record))
    )


def _with_secret(
    request: Request, record: EndpointRecord, secret: str, *, status_code: int
) -> Response:
    data = EndpointWithSecret(**EndpointData.of(record).model_dump(), secret=secret)
    body = EndpointSecretResponse(request_id=request_id_of(request), data=data)
    response = json_response(body, status_code)
    response.headers["Cache-Control"] = "no-store"  # a secret: no cache keeps it
    return response


__all__ = ["WEBHOOK_ROUTES", "WebhookClients", "WebhookRoutes"]
