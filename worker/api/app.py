"""Composition root of a front-end process, ``python -m worker api`` (docs/architecture.md, "The
front-end")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from worker.api.cors import CorsPolicy
from worker.api.event_types import EVENT_TYPES_PATH, event_type_routes
from worker.api.idempotency import CLAIM_MARGIN_S, IdempotencyKeys
from worker.api.keys import KeyStore
from worker.api.metrics import ApiMetrics, KeyUsageCollector, ReplyReaderSeries
from worker.api.middleware import FrontDoor
from worker.api.portal.page import page_routes
from worker.api.portal.revocations import PortalRevocations
from worker.api.portal.sessions import PORTAL_SESSION, PORTAL_SESSIONS, PortalSessions
from worker.api.portal.tokens import PortalTokens
from worker.api.presence import Presence
from worker.api.reading import ACCOUNT_ID_RULE
from worker.api.replies import ReplyRouter
from worker.api.request_rate import RateLimiter
from worker.api.routes import (
    API_ROUTES,
    EXCEPTION_HANDLERS,
    ApiRoutes,
    on_service_error,
)
from worker.api.server import (
    CLOSE_BUDGET_S,
    CLOSE_STEP_FLOOR_S,
    ApiRuntime,
    serve_runtime,
    shutdown_hard_limit,
)
from worker.api.webhooks.account_events import AccountEvents, CursorCodec
from worker.api.webhooks.delivery_log_scan import DeliveryLogScan
from worker.api.webhooks.follow_routes import FOLLOW_ROUTES, FollowRoutes
from worker.api.webhooks.quotas import EndpointLimits
from worker.api.webhooks.replay import ReplayRunner
from worker.api.webhooks.replay_status import ReplayBoard
from worker.api.webhooks.routes import WEBHOOK_ROUTES, WebhookClients, WebhookRoutes
from worker.api.webhooks.sends import DeliverySends
from worker.engine.broker_health import BrokerHealth
from worker.engine.kafka import KafkaConfig, build_consumer, build_producer
from worker.engine.metrics import TailSkips
from worker.engine.tail import SharedConsumer
from worker.runtime.logs import get_logger
from worker.runtime.metrics import API_PREFIX
from worker.runtime.probes import Probes
from worker.runtime.process import on_stop_signals
from worker.runtime.shutdown import CloseBudget, graceful_then_forced
from worker.settings import Settings
from worker.startup import prologue
from worker.webhooks.announcer import Announcer
from worker.webhooks.endpoint_writes import EndpointStore
from worker.webhooks.endpoints import EndpointsTail
from worker.webhooks.replay_scan import ReplayScan
from worker.webhooks.secrets_box import SecretsBox
from worker.webhooks.targets import TargetPolicy

__all__ = [
    "ACCOUNT_ID_RULE",
    "ApiRuntime",
    "DocumentRoutes",
    "FrontEndApps",
    "api_runtime",
    "build_app",
    "rate_limiter",
    "serve_api",
]

log = get_logger(__name__)

DocumentRoutes = Callable[[EndpointLimits, TargetPolicy], Sequence[Route]]
"""The routes serving documents of a front-end, built with its field limits and target policy
(``GET /openapi.json``): the entry point passes them in, since the document builders sit above
the front-end (docs/architecture.md, "Where each concept lives in the code")."""

VIEW_FETCH_MIN_WAIT_MS: Final = 50
"""The shortest fetch wait of the consumer the read models share (webhook.endpoints, through
``worker.engine.tail.SharedConsumer``) and of the deliveries scan's. Replies wait
``KAFKA_FETCH_MAX_WAIT_MS``, which Kafka cuts short when a reply arrives;
a broker that, when a pass finds nothing, looks again only after half the remaining wait
needs a short one (the dev stack sets it for
the front-end), and the read models, which tolerate a few more milliseconds of lag, poll less
often than that (figures: bench/README.md)."""


def _view_reader(kafka: KafkaConfig) -> AIOKafkaConsumer:
    """A consumer of the read models and scans, waiting at least ``VIEW_FETCH_MIN_WAIT_MS``."""
    return build_consumer(
        kafka, fetch_max_wait_ms=max(kafka.fetch_max_wait_ms, VIEW_FETCH_MIN_WAIT_MS)
    )


@dataclass(frozen=True)
class FrontEndApps:
    """What one front-end serves: ``api`` on the public port, ``side_door`` (``/metrics``,
    ``/healthz``, ``/readyz``) on ``API_METRICS_PORT``, and the metrics both record to."""

    api: Starlette
    side_door: Starlette
    metrics: ApiMetrics


def rate_limiter(settings: Settings, presence: Presence | None = None) -> RateLimiter | None:
    """The per-workspace token buckets, or ``None`` when ``API_RATE_LIMIT_PER_S`` is 0; with
    ``presence``, each process takes its share (rate and burst over the live replicas)."""
    if settings.api_rate_limit_per_s <= 0:
        return None
    return RateLimiter(
        settings.api_rate_limit_per_s,
        settings.api_rate_limit_burst,
        replicas=None if presence is None else presence.live,
    )


def portal_tokens(settings: Settings) -> PortalTokens | None:
    """The portal tokens' signer from ``API_PORTAL_SECRET``, else from ``WEBHOOK_SECRETS_KEY``
    (the derivation's label keeps the two uses apart), else ``None`` (no portal)."""
    secret = settings.api_portal_secret or settings.webhook_secrets_key
    if secret is None:
        return None
    return PortalTokens(secret.get_secret_value(), max_ttl_s=settings.api_portal_session_ttl_s)


def build_app(
    settings: Settings,
    *,
    producer: Any,
    replies: ReplyRouter,
    keys: KeyStore,
    registry: CollectorRegistry,
    webhooks: WebhookClients | None = None,
    broker: BrokerHealth | None = None,
    presence: Presence | None = None,
    documents: DocumentRoutes | None = None,
    idempotency: IdempotencyKeys | None = None,
    portal_revocations: PortalRevocations | None = None,
) -> FrontEndApps:
    """The front-end's apps over clients the caller built and started, metrics on
    ``registry`` (one app per registry). ``None`` means: ``webhooks``, not configured (their
    routes answer 500); ``presence``, limits of this process alone; ``portal_revocations``,
    this process's own; ``documents``, no document served."""
    metrics = ApiMetrics(registry)
    metrics.pending_replies.set_function(lambda: float(replies.pending))
    registry.register(ReplyReaderSeries(replies))
    registry.register(KeyUsageCollector(keys.last_used))
    revocations = (
        PortalRevocations(None, ttl_s=settings.api_portal_session_ttl_s)
        if portal_revocations is None
        else portal_revocations
    )
    api = ApiRoutes(
        producer=producer,
        replies=replies,
        keys=keys,
        metrics=metrics,
        commands_topic=settings.topics.commands,
        reply_timeout_s=settings.api_reply_timeout_s,
        long_poll_max_s=settings.api_long_poll_max_s,
        long_poll_slots=settings.api_max_connections // 2,
        webhook_tails=None if webhooks is None else webhooks.tails,
        broker=broker or BrokerHealth(),
        rate_limiter=rate_limiter(settings, presence),
        presence=presence,
        portal=portal_tokens(settings),
        idempotency=idempotency,
        portal_revocations=revocations,
    )
    metrics.ready.set_function(lambda: 1.0 if api.readiness()[0] else 0.0)
    limits = EndpointLimits.of(settings)
    policy = TargetPolicy.of(settings)
    follow = FollowRoutes(
        clients=webhooks,
        admitted_workspace=api.admitted_workspace,
        wait_s=settings.webhook_store_timeout_s,
        refused=lambda quota: metrics.quota_refusals.labels(quota).inc(),
    )
    hooks = WebhookRoutes(
        clients=webhooks,
        admitted_workspace=api.admitted_workspace,
        policy=policy,
        wait_s=settings.webhook_store_timeout_s,
        limits=limits,
        endpoints_per_workspace=settings.webhook_endpoints_per_workspace,
        metrics=metrics,
        sends_per_minute=settings.webhook_sends_per_minute,
        replicas=None if presence is None else presence.live,
    )
    if webhooks is not None:
        replays = webhooks.replays
        metrics.replays_in_flight.set_function(lambda: float(replays.active))
    probes = Probes(registry, health=api.health, readiness=api.readiness)
    sessions = PortalSessions(
        admitted_workspace=api.admitted_workspace,
        keys=keys,
        tokens=api.portal,
        revocations=revocations,
        ttl_s=settings.api_portal_session_ttl_s,
        public_base_url=settings.api_public_base_url,
    )
    routes = [
        *api.routes(),
        *hooks.routes(),
        *sessions.routes(),
        *page_routes(),
        *event_type_routes(api.admitted_workspace),
        *follow.routes(),
        *probes.health_routes(),
        *(documents(limits, policy) if documents is not None else ()),
    ]
    front_door = Middleware(
        FrontDoor,
        metrics=metrics,
        cors=CorsPolicy(frozenset(settings.api_cors_origins)),
        routes=routes,
        preflight_routes=(
            *API_ROUTES,
            *WEBHOOK_ROUTES,
            PORTAL_SESSIONS,
            PORTAL_SESSION,
            EVENT_TYPES_PATH,
            *FOLLOW_ROUTES,
        ),
        body_timeout_s=settings.api_body_timeout_s,
        direct_routes=API_ROUTES,
        on_service_error=on_service_error,
    )
    app = Starlette(routes=routes, middleware=[front_door], exception_handlers=EXCEPTION_HANDLERS)
    # "/v1/accounts/x/auth/" is not a route: 404, never a redirect.
    app.router.redirect_slashes = False
    return FrontEndApps(api=app, side_door=Starlette(routes=probes.routes()), metrics=metrics)


def webhook_clients(
    settings: Settings,
    kafka: KafkaConfig,
    producer: Any,
    broker: BrokerHealth,
    shared: SharedConsumer,
    presence: Presence,
) -> WebhookClients | None:
    """The unstarted webhook clients, or ``None`` (logged) without ``WEBHOOK_SECRETS_KEY``, which
    seals and opens the endpoints' secrets; a malformed key stops the process, never shown."""
    key = settings.webhook_secrets_key
    if key is None:
        log.error(
            "api_webhooks_not_configured",
            detail="WEBHOOK_SECRETS_KEY is unset; the webhook-endpoint routes answer 500",
        )
        return None
    topics = settings.topics
    endpoints = EndpointsTail(shared.share(), topics.webhook_endpoints)
    store = EndpointStore(
        producer=producer,
        topic=topics.webhook_endpoints,
        registry=endpoints.registry,
        cipher=SecretsBox(key.get_secret_value()),
        timeout_s=settings.webhook_store_timeout_s,
        overlap_s=settings.webhook_secret_overlap_s,
        health=broker,
    )
    deliveries = DeliveryLogScan(
        lambda: _view_reader(kafka),
        topics.webhook_deliveries,
        window=settings.webhook_deliveries_scan_records,
        timeout_s=settings.webhook_deliveries_scan_timeout_s,
    )
    board = ReplayBoard(presence)
    scan = ReplayScan(
        consumer_factory=lambda: _view_reader(kafka),
        producer=producer,
        topics=topics,
        health=broker,
    )
    replays = ReplayRunner(
        scan=scan,
        max_running=settings.webhook_replay_max_running,
        max_queued=settings.webhook_replay_max_queued,
        per_workspace=settings.webhook_replays_per_workspace,
        board=board,
    )
    events = AccountEvents(lambda: _view_reader(kafka), topics=topics)
    return WebhookClients(
        endpoints=endpoints,
        store=store,
        deliveries=deliveries,
        replays=replays,
        announcer=Announcer(producer, topics.webhook_replays, broker),
        events=events,
        cursors=CursorCodec(key.get_secret_value().encode()),
        sends=DeliverySends(
            producer, topics.webhook_replays, log_topic=topics.webhook_deliveries, health=broker
        ),
    )


@contextlib.asynccontextmanager
async def api_runtime(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    keys: KeyStore | None = None,
    documents: DocumentRoutes | None = None,
) -> AsyncIterator[ApiRuntime]:
    """Build and start the front-end's clients from ``settings``; stop them on exit.
    ``documents``: as ``build_app``'s."""
    webhooks_on = settings.webhook_secrets_key is not None
    begun = await prologue(settings, "api", registry, webhooks=webhooks_on)
    registry, broker, kafka = begun.registry, begun.health, begun.kafka
    if keys is None:
        keys = KeyStore.from_file(
            settings.api_keys_file, reload_interval_s=settings.api_keys_reload_s
        )
    if not len(keys):
        log.warning("api_no_keys", keys_file=str(settings.api_keys_file))
    topics = settings.topics
    # No linger: whatever one loop iteration appends leaves in one request (the long-polls
    # due at one grid boundary, docs/architecture.md "Long-polls"), and alone a record is
    # cheaper without the linger's timer (bench/README.md, "An acknowledged produce").
    producer = build_producer(kafka, linger_ms=0)
    replies = ReplyRouter(
        build_consumer(kafka),
        topics.replies,
        partition=settings.api_reply_partition,
        spread=settings.api_reply_partitions,
        gap_hold_s=kafka.offset_gap_hold_s,
    )
    # The read models share one consumer (the replies keep their own, whose fetches bound each
    # round trip's latency on a broker that holds a fetch for its wait).
    shared = SharedConsumer(_view_reader(kafka))
    presence = Presence(shared.share(), topics.api_presence, producer, health=broker)
    idempotency = IdempotencyKeys(
        shared.share(),
        topics.api_idempotency,
        producer,
        replica_id=presence.replica_id,
        per_workspace=settings.api_idempotency_keys_per_workspace,
        keys_max=settings.api_idempotency_keys_max,
        claim_ttl_s=settings.api_reply_timeout_s + CLAIM_MARGIN_S,
        health=broker,
    )
    revocations = PortalRevocations(presence, ttl_s=settings.api_portal_session_ttl_s)
    webhooks = webhook_clients(settings, kafka, producer, broker, shared, presence)
    apps = build_app(
        settings,
        producer=producer,
        replies=replies,
        keys=keys,
        registry=registry,
        webhooks=webhooks,
        broker=broker,
        presence=presence,
        documents=documents,
        idempotency=idempotency,
        portal_revocations=revocations,
    )
    # Each client's close, in start order, named for the log; closed in reverse, all within
    # one budget (``worker.runtime.shutdown.CloseBudget``).
    started: list[tuple[str, Callable[[], Awaitable[object]]]] = []
    try:
        clients: list[tuple[str, Any]] = [
            ("producer", producer),
            ("replies", replies),
            ("presence", presence),  # stopped before the producer: it tombstones this replica
            ("idempotency", idempotency),
            ("portal_revocations", revocations),
        ]
        if webhooks is not None:
            clients += [(tail.name, tail) for tail in webhooks.tails]
            clients += [("deliveries", webhooks.deliveries)]
            clients += [("replay_board", webhooks.replays.board)]
        for name, client in clients:
            await client.start()
            started.append((f"{name}_stop", client.stop))
        if webhooks is not None:
            started.append(("replays_stop", webhooks.replays.stop))  # stopped first: it produces
        runtime = ApiRuntime(
            settings,
            apps.api,
            producer,
            replies,
            keys,
            registry,
            webhooks,
            broker=broker,
            side_door=apps.side_door,
            metrics=apps.metrics,
            presence=presence,
            idempotency=idempotency,
        )
        registry.register(TailSkips(API_PREFIX, lambda: runtime.tails))
        yield runtime
    finally:
        budget = CloseBudget(CLOSE_BUDGET_S, floor_s=CLOSE_STEP_FLOOR_S)
        for name, stop in reversed(started):
            await budget.step(stop(), name)


async def serve_api(
    settings: Settings,
    *,
    install_signals: bool = True,
    stop: asyncio.Event | None = None,
    registry: CollectorRegistry | None = None,
    keys: KeyStore | None = None,
    on_started: Callable[[ApiRuntime], None] | None = None,
    documents: DocumentRoutes | None = None,
) -> None:
    """One front-end process until SIGTERM/SIGINT, ``stop`` or cancellation: in-flight requests
    finish (up to the reply timeout), then the Kafka clients close within one budget
    (docs/architecture.md, "Bounded shutdown"). Raises if a Kafka tail dies, so the process
    exits non-zero rather than serve stale data. ``settings.api_port`` 0 picks a free port
    (``runtime.base_url`` when ``on_started`` is called)."""
    stop = stop if stop is not None else asyncio.Event()
    # Installed for the whole run, close steps included: a second signal exits at once (130).
    on_signal = graceful_then_forced(stop.set, hard_limit_s=shutdown_hard_limit(settings))
    with on_stop_signals(on_signal, enabled=install_signals):
        async with api_runtime(
            settings, registry=registry, keys=keys, documents=documents
        ) as runtime:
            await serve_runtime(runtime, stop, on_started)
