"""One running front-end process (``ApiRuntime``) and its server loop; a dead Kafka reader or an
outage past its tolerance ends the process rather than serve stale data (docs/api.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from worker.api.keys import KeyStore
from worker.api.metrics import ApiMetrics
from worker.api.protocol import ConnectionLimits, limited_protocol
from worker.api.replies import ReplyRouter
from worker.api.webhooks.routes import WebhookClients
from worker.engine.broker_health import BrokerHealth, metadata_probe
from worker.engine.tail import TopicTail
from worker.runtime.eventloop import running_loop_name
from worker.runtime.logs import get_logger
from worker.runtime.serving import EmbeddedServer, serving
from worker.settings import Settings

log = get_logger(__name__)


@dataclass
class ApiRuntime:
    """Everything one front-end process runs; ``base_url`` and ``metrics_url`` are set once the
    server listens."""

    settings: Settings
    app: Starlette
    producer: Any
    replies: ReplyRouter
    keys: KeyStore
    registry: CollectorRegistry
    webhooks: WebhookClients | None
    broker: BrokerHealth
    side_door: Starlette
    metrics: ApiMetrics
    #: The replicas' presence (``worker.api.presence``) and ``Idempotency-Key``s.
    presence: TopicTail
    idempotency: TopicTail
    base_url: str | None = None
    metrics_url: str | None = None

    @property
    def tails(self) -> tuple[TopicTail, ...]:
        """Every Kafka reader whose end stops the process."""
        extra = () if self.webhooks is None else self.webhooks.tails
        return (self.replies, self.presence, self.idempotency, *extra)

    @property
    def url(self) -> str:
        if self.base_url is None:
            raise RuntimeError("the front-end is not listening yet")
        return self.base_url


async def _listen(server: uvicorn.Server, settings: Settings) -> None:
    """``server.serve()``, with uvicorn's ``sys.exit`` on a bind failure turned into an error
    (a ``SystemExit`` escaping a task would stop the whole event loop)."""
    try:
        await server.serve()
    except SystemExit:
        raise RuntimeError(
            f"the API could not listen on {settings.api_host}:{settings.api_port}"
        ) from None


#: What the front-end's close steps share after the server stops (its Kafka readers, the
#: presence tombstone, the producer's flush); each step is given what is left of it, and at
#: least ``CLOSE_STEP_FLOOR_S`` (``worker.runtime.shutdown.CloseBudget``).
CLOSE_BUDGET_S = 8.0
CLOSE_STEP_FLOOR_S = 0.2
#: The most close steps ``worker.api.app.api_runtime`` has (every reader and writer of a
#: front-end with webhooks; tests/api/test_api_shutdown.py counts them).
MAX_CLOSE_STEPS = 12


def http_grace_s(settings: Settings) -> int:
    """How long the server lets in-flight requests finish on a stop: the longest wait for a
    reply, and a margin to write it."""
    return int(settings.api_reply_timeout_s) + 2


def shutdown_hard_limit(settings: Settings) -> float:
    """Seconds from SIGTERM to the front-end's forced exit (``worker.runtime.shutdown``): the
    server's grace, the close budget with each step's floor, and a margin; each is bounded on
    its own, so only a stuck server or loop reaches it. Kubernetes'
    ``terminationGracePeriodSeconds`` must exceed it plus the pre-stop sleep
    (tests/deploy/test_manifests.py), so the process ends by its own hand."""
    return http_grace_s(settings) + CLOSE_BUDGET_S + MAX_CLOSE_STEPS * CLOSE_STEP_FLOOR_S + 1.0


def connection_limits(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(
        max_head_bytes=settings.api_max_header_bytes,
        max_headers=settings.api_max_headers,
        head_timeout_s=settings.api_head_timeout_s,
        body_timeout_s=settings.api_body_timeout_s,
        max_connections=settings.api_max_connections,
        max_connections_per_client=settings.api_max_connections_per_client,
    )


async def serve_runtime(
    runtime: ApiRuntime, stop: asyncio.Event, on_started: Callable[[ApiRuntime], None] | None
) -> None:
    """Serve ``runtime.app`` (and its side door) until ``stop``, a server failure or a Kafka
    reader's end."""
    settings = runtime.settings
    async with serving(
        runtime.side_door,
        host=settings.api_metrics_host,
        port=settings.api_metrics_port,
        name="api-metrics",
    ) as metrics_url:
        runtime.metrics_url = metrics_url
        await _serve_api(runtime, stop, on_started)


async def _serve_api(
    runtime: ApiRuntime, stop: asyncio.Event, on_started: Callable[[ApiRuntime], None] | None
) -> None:
    settings = runtime.settings
    refusals = runtime.metrics.refusals
    server = EmbeddedServer(
        uvicorn.Config(
            runtime.app,
            host=settings.api_host,
            port=settings.api_port,
            http=limited_protocol(
                connection_limits(settings),
                lambda reason: refusals.labels(reason).inc(),
            ),
            ws="none",
            log_config=None,  # uvicorn's records go through worker.runtime.logs like every other
            log_level="info" if settings.api_access_log else "warning",
            access_log=settings.api_access_log,
            lifespan="off",
            timeout_graceful_shutdown=http_grace_s(settings),
        )
    )
    serving = asyncio.create_task(_listen(server, settings), name="api-http")
    stopping = asyncio.create_task(stop.wait(), name="api-stop")
    probe = metadata_probe(runtime.producer.client, settings.topics.commands)
    outage = asyncio.create_task(runtime.broker.monitor(probe), name="api-kafka-monitor")
    watched: set[asyncio.Future[Any]] = {
        serving,
        stopping,
        outage,
        *(t.task for t in runtime.tails),
    }
    try:
        while not server.started:
            if serving.done():
                break
            await asyncio.sleep(0.01)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            runtime.base_url = f"http://{settings.api_host}:{port}"
            log.info(
                "api_started",
                url=runtime.base_url,
                metrics_url=runtime.metrics_url,
                bootstrap=settings.bootstrap,
                event_loop=running_loop_name(),
            )
            if on_started is not None:
                on_started(runtime)
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        outage.cancel()
        server.should_exit = True
        try:
            await serving
        finally:
            log.info("api_stopped")
    for tail in runtime.tails:
        if tail.failure is not None:
            raise RuntimeError(f"{tail.name} failed") from tail.failure
    if outage.done() and not outage.cancelled() and outage.exception() is not None:
        outage.result()  # BrokerOutageExceeded
