"""The API front-end: the seed's §4/§5 contract over HTTP, backed by Kafka (design.md §8).

``build_app`` wires an app from clients built elsewhere; ``api_runtime`` builds and starts
those clients from settings; ``serve_api`` runs everything under uvicorn until SIGTERM/SIGINT
(``python -m worker api``).

Every request passes the ``FrontDoor`` middleware first: it picks the request id (a valid
caller ``X-Request-Id`` or ``req_<uuid4 hex>``), answers CORS preflights, stamps
``X-Request-Id`` (and CORS headers) on every response, turns unexpected exceptions into the
seed's 500 error body, and records the request metrics. The checks then run in the contract's
order: route (404), API key (401), ``account_id`` format (400), body (400), then the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import uvicorn
from aiokafka.errors import KafkaError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.api.keys import KeyStore
from worker.api.metrics import UNMATCHED_ROUTE, ApiMetrics, method_label
from worker.api.openapi import ACCOUNT_AUTH, API_ROUTES, PASSKEY_CONFIRM, openapi_document
from worker.api.replies import ReplyError, ReplyRouter
from worker.api.view import AuthStateView
from worker.catalogue import ServiceError
from worker.eventloop import running_loop_name
from worker.kafka import build_consumer, build_producer, ensure_topics
from worker.logs import get_logger
from worker.messages import ID_PATTERN, PasskeyConfirm
from worker.settings import Settings

log = get_logger(__name__)

OPS_ROUTES: Final = ("/metrics", "/healthz", "/readyz", "/openapi.json")
CORS_METHODS: Final = ("GET", "POST")
CORS_HEADERS: Final = ("X-Api-Key", "Content-Type", "X-Request-Id")
CORS_MAX_AGE_S: Final = 600
MAX_BODY_BYTES: Final = 64 * 1024
ACCOUNT_ID_RULE: Final = (
    "account_id must be 1-128 characters: a letter or digit, then letters, digits,"
    " '.', '_', ':', '@' or '-'"
)

REPLY_FETCH_MAX_WAIT_MS: Final = 10
"""How long the broker may hold an empty fetch of auth.replies. Kafka answers a fetch as soon
as data arrives, so this only bounds idle polling there; the embedded broker (Tansu) holds
every fetch for the full wait, so it is added to each reply's latency (measured: 100 ms →
p50 53 ms per confirm, 10 ms → p50 14 ms)."""
VIEW_FETCH_MAX_WAIT_MS: Final = 50
"""The same for auth.state: the polling route tolerates a few more milliseconds of lag."""

_ID_RE: Final = re.compile(ID_PATTERN)
_ROUTE_RES: Final = tuple(
    (template, re.compile("^" + template.replace("{account_id}", "[^/]+") + "$"))
    for template in (*API_ROUTES, *OPS_ROUTES)
)


def route_template(path: str) -> str | None:
    """The route template ``path`` belongs to (the metrics label), or ``None``."""
    for template, pattern in _ROUTE_RES:
        if pattern.match(path):
            return template
    return None


def valid_id(value: str) -> bool:
    """The account-id rule (``worker.messages.ID_PATTERN``), matched against the whole value."""
    return _ID_RE.fullmatch(value) is not None


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def error_body(request_id: str, err: ServiceError) -> dict[str, Any]:
    """The seed's failure envelope: exactly ``{request_id, error: {code, numeric_code,
    message}}``."""
    return {"request_id": request_id, "error": err.body()}


def error_response(request_id: str, err: ServiceError) -> JSONResponse:
    return JSONResponse(error_body(request_id, err), status_code=err.http_status)


def _request_id(request: Request) -> str:
    rid: str = request.state.request_id
    return rid


# --------------------------------------------------------------------------------------------
# CORS
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    """Allowlisted origins (exact match; ``*`` allows any), fixed methods and headers."""

    origins: frozenset[str]

    @property
    def enabled(self) -> bool:
        return bool(self.origins)

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin in self.origins

    def preflight_refusal(
        self, origin: str, method: str, requested_headers: str | None
    ) -> str | None:
        """Why a preflight is refused, or ``None`` when it is allowed."""
        if not self.origin_allowed(origin):
            return f"Origin {origin[:200]!r} is not allowed."
        if method not in CORS_METHODS:
            return f"Method {method[:40]!r} is not allowed; allowed: {', '.join(CORS_METHODS)}."
        allowed = {h.lower() for h in CORS_HEADERS}
        requested = [h.strip().lower() for h in (requested_headers or "").split(",")]
        refused = sorted({h for h in requested if h and h not in allowed})
        if refused:
            return (
                f"Request headers {', '.join(refused)[:200]} are not allowed;"
                f" allowed: {', '.join(CORS_HEADERS)}."
            )
        return None


# --------------------------------------------------------------------------------------------
# The front door: request id, CORS, error safety net, metrics
# --------------------------------------------------------------------------------------------


class FrontDoor:
    """Pure ASGI middleware around the whole app (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics, cors: CorsPolicy) -> None:
        self.app = app
        self.metrics = metrics
        self.cors = cors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = Headers(scope=scope)
        caller_rid = headers.get("x-request-id")
        request_id = caller_rid if caller_rid and valid_id(caller_rid) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        template = route_template(scope["path"])
        method: str = scope["method"]
        origin = headers.get("origin")
        request_method = headers.get("access-control-request-method")
        # Actual cross-origin requests from allowed origins may read the response; a
        # preflight sets its own headers (none when refused).
        preflight = method == "OPTIONS" and origin is not None and request_method is not None
        cors_origin = (
            origin if origin and not preflight and self.cors.origin_allowed(origin) else None
        )
        status = 500
        response_started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = message["status"]
                out = MutableHeaders(scope=message)
                out["X-Request-Id"] = request_id
                if self.cors.enabled:
                    out.add_vary_header("Origin")
                if cors_origin is not None and "access-control-allow-origin" not in out:
                    out["Access-Control-Allow-Origin"] = cors_origin
                    out["Access-Control-Expose-Headers"] = "X-Request-Id"
            await send(message)

        try:
            if preflight:
                assert origin is not None and request_method is not None
                response = self._preflight(template, request_id, origin, request_method, headers)
                await response(scope, receive, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        except Exception:
            log.exception("api_unhandled_error", request_id=request_id, route=template)
            if response_started:
                raise
            code = "get_auth_state_failed" if method == "GET" else "run_auth_action_failed"
            await error_response(request_id, ServiceError.of(code))(scope, receive, send_wrapper)
        finally:
            route = template or UNMATCHED_ROUTE
            mlabel = method_label(method)
            self.metrics.requests.labels(route, mlabel, str(status)).inc()
            self.metrics.duration.labels(route, mlabel).observe(time.perf_counter() - started)

    def _preflight(
        self,
        template: str | None,
        request_id: str,
        origin: str,
        request_method: str,
        headers: Headers,
    ) -> Response:
        if template not in API_ROUTES:
            return error_response(request_id, ServiceError.of("not_found"))
        refusal = self.cors.preflight_refusal(
            origin, request_method, headers.get("access-control-request-headers")
        )
        if refusal is not None:
            return error_response(
                request_id, ServiceError.of("cors_forbidden", f"CORS preflight refused: {refusal}")
            )
        return Response(
            status_code=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": ", ".join(CORS_METHODS),
                "Access-Control-Allow-Headers": ", ".join(CORS_HEADERS),
                "Access-Control-Max-Age": str(CORS_MAX_AGE_S),
            },
        )


# --------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------


def _route(path: str, endpoint: Callable[[Request], Awaitable[Response]], method: str) -> Route:
    """A route for exactly one method. Starlette adds HEAD to every GET route; the contract
    (and the OpenAPI document) has none, so HEAD stays "any other method": 404 not_found."""
    route = Route(path, endpoint, methods=[method])
    assert route.methods is not None
    route.methods.discard("HEAD")
    return route


def _not_ready_message(what: str) -> str:
    return f"The service is starting or degraded ({what} not ready); nothing was changed."


def build_app(
    settings: Settings,
    *,
    producer: Any,
    replies: ReplyRouter,
    view: AuthStateView,
    keys: KeyStore,
    registry: CollectorRegistry,
) -> Starlette:
    """The front-end app over clients built (and started) by the caller.

    ``producer`` is a started ``AIOKafkaProducer``; ``replies`` and ``view`` are started by the
    caller too. Metrics are registered on ``registry`` (one app per registry).
    """
    metrics = ApiMetrics(registry)
    metrics.pending_replies.set_function(lambda: float(replies.pending))
    metrics.ready.set_function(lambda: 1.0 if replies.ready and view.caught_up else 0.0)
    commands_topic = settings.topics.commands
    reply_timeout_s = settings.api_reply_timeout_s
    document = openapi_document()

    async def on_service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        return error_response(_request_id(request), exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        # Routing raises 404 (no route) and 405 (route without this method); the seed has one
        # answer for both: 404 not_found, "the route does not exist".
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400:
            return error_response(_request_id(request), ServiceError.of("invalid_request"))
        return error_response(_request_id(request), ServiceError.of("not_found"))

    def authenticate(request: Request) -> str:
        raw = request.headers.get("x-api-key")
        if raw is None or not raw.strip():
            raise ServiceError.of("missing_api_key", "The X-Api-Key request header is missing.")
        workspace_id = keys.resolve(raw.strip())
        if workspace_id is None:
            raise ServiceError.of(
                "invalid_api_key", "The API key is not recognised or has been disabled."
            )
        return workspace_id

    def check_account_id(account_id: str) -> None:
        if not valid_id(account_id):
            raise ServiceError.of("invalid_request", f"Invalid path parameter: {ACCOUNT_ID_RULE}.")

    async def check_body(request: Request) -> None:
        """No body is required; an empty body, or any JSON object (ignored), is accepted."""
        size = 0
        chunks: list[bytes] = []
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise ServiceError.of(
                    "invalid_request", f"The request body exceeds {MAX_BODY_BYTES} bytes."
                )
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            return
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            raise ServiceError.of(
                "invalid_request", "The request body cannot be decoded as JSON."
            ) from None
        if not isinstance(value, dict):
            raise ServiceError.of(
                "invalid_request", "The request body must be a JSON object or empty."
            )

    async def passkey_confirm(request: Request) -> Response:
        account_id: str = request.path_params["account_id"]
        deadline = time.monotonic() + reply_timeout_s
        request_id = _request_id(request)
        workspace_id = authenticate(request)
        check_account_id(account_id)
        await check_body(request)
        if not replies.ready and not await replies.wait_caught_up(deadline - time.monotonic()):
            raise ServiceError.of("run_auth_action_failed", _not_ready_message("reply consumer"))
        now = datetime.now(UTC)
        command = PasskeyConfirm(
            command_id=str(uuid.uuid4()),
            request_id=request_id,
            workspace_id=workspace_id,
            account_id=account_id,
            issued_at=now,
            deadline=now + timedelta(seconds=reply_timeout_s),
        )
        check_hint = (
            f"Check GET /v1/accounts/{account_id}/auth before retrying: the confirmation may"
            " still be applied."
        )
        try:
            with replies.expect(command.command_id, request_id) as pending:
                try:
                    await asyncio.wait_for(
                        producer.send_and_wait(
                            commands_topic,
                            command.model_dump_json().encode(),
                            key=account_id.encode(),
                        ),
                        timeout=max(deadline - time.monotonic(), 0.001),
                    )
                except (KafkaError, TimeoutError) as exc:
                    log.error(
                        "api_command_send_failed",
                        request_id=request_id,
                        command_id=command.command_id,
                        error=repr(exc),
                    )
                    raise ServiceError.of(
                        "run_auth_action_failed",
                        f"The confirmation could not be queued in time. {check_hint}",
                    ) from None
                reply = await pending.wait(deadline - time.monotonic())
        except ReplyError as exc:
            log.error("api_reply_failed", request_id=request_id, error=str(exc))
            raise ServiceError.of(
                "run_auth_action_failed", f"The confirmation outcome is unknown. {check_hint}"
            ) from None
        if reply is None:
            metrics.reply_timeouts.inc()
            log.warning(
                "api_reply_timeout",
                request_id=request_id,
                command_id=command.command_id,
                account_id=account_id,
                timeout_s=reply_timeout_s,
            )
            raise ServiceError.of(
                "run_auth_action_failed",
                f"No outcome within {reply_timeout_s:g} s. {check_hint}",
            )
        if not 200 <= reply.http_status <= 599:
            log.error("api_reply_bad_status", request_id=request_id, status=reply.http_status)
            raise ServiceError.of("run_auth_action_failed", check_hint)
        return JSONResponse(reply.body, status_code=reply.http_status)

    async def account_auth(request: Request) -> Response:
        account_id: str = request.path_params["account_id"]
        request_id = _request_id(request)
        workspace_id = authenticate(request)
        check_account_id(account_id)
        if not view.caught_up and not await view.wait_caught_up(reply_timeout_s):
            raise ServiceError.of(
                "get_auth_state_failed",
                "The authentication state is not available yet; retry shortly.",
            )
        if not view.running:
            raise ServiceError.of(
                "get_auth_state_failed", "The authentication state is not available."
            )
        entry = view.lookup(account_id, workspace_id)
        if entry is None:
            raise ServiceError.of("not_found", "The account does not exist in this workspace.")
        return JSONResponse(
            {
                "request_id": request_id,
                "data": {
                    "account_id": account_id,
                    "status": entry.status,
                    "auth_status": entry.auth_status,
                },
            }
        )

    async def prometheus_metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_: Request) -> Response:
        ok = replies.running and view.running
        return JSONResponse({"status": "ok" if ok else "failed"}, status_code=200 if ok else 503)

    async def readyz(_: Request) -> Response:
        state = {"state_view": view.caught_up and view.running, "replies": replies.ready}
        ok = all(state.values())
        return JSONResponse({"ready": ok, **state}, status_code=200 if ok else 503)

    async def openapi_json(_: Request) -> Response:
        return JSONResponse(document)

    # Starlette, not FastAPI: the OpenAPI document is written by hand (worker/api/openapi.py)
    # and every check is explicit, so FastAPI's dependency solving and its extra middleware
    # layers were pure per-request cost (about a third of the front-end's CPU samples).
    app = Starlette(
        routes=[
            _route(PASSKEY_CONFIRM, passkey_confirm, "POST"),
            _route(ACCOUNT_AUTH, account_auth, "GET"),
            _route("/metrics", prometheus_metrics, "GET"),
            _route("/healthz", healthz, "GET"),
            _route("/readyz", readyz, "GET"),
            _route("/openapi.json", openapi_json, "GET"),
        ],
        middleware=[
            Middleware(
                FrontDoor,
                metrics=metrics,
                cors=CorsPolicy(frozenset(settings.api_cors_origins)),
            )
        ],
        exception_handlers={
            ServiceError: on_service_error,
            StarletteHTTPException: on_http_error,
        },
    )
    # "/v1/accounts/x/auth/" is not a route: 404, never a redirect.
    app.router.redirect_slashes = False
    return app


# --------------------------------------------------------------------------------------------
# Composition root and process entry point
# --------------------------------------------------------------------------------------------


@dataclass
class ApiRuntime:
    """Everything one front-end process runs; ``base_url`` is set once the server listens."""

    settings: Settings
    app: Starlette
    producer: Any
    replies: ReplyRouter
    view: AuthStateView
    keys: KeyStore
    registry: CollectorRegistry
    base_url: str | None = None

    @property
    def url(self) -> str:
        """``base_url`` of a listening front-end."""
        if self.base_url is None:
            raise RuntimeError("the front-end is not listening yet")
        return self.base_url


@contextlib.asynccontextmanager
async def api_runtime(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    keys: KeyStore | None = None,
) -> AsyncIterator[ApiRuntime]:
    """Build and start the front-end's clients from ``settings``; stop them on exit."""
    await ensure_topics(settings)
    keys = keys if keys is not None else KeyStore.from_file(settings.api_keys_file)
    if not len(keys):
        log.warning("api_no_keys", keys_file=str(settings.api_keys_file))
    registry = registry if registry is not None else CollectorRegistry()
    topics = settings.topics
    producer = build_producer(settings)
    replies = ReplyRouter(
        build_consumer(settings, fetch_max_wait_ms=REPLY_FETCH_MAX_WAIT_MS), topics.replies
    )
    view = AuthStateView(
        build_consumer(settings, fetch_max_wait_ms=VIEW_FETCH_MAX_WAIT_MS), topics.state
    )
    app = build_app(
        settings, producer=producer, replies=replies, view=view, keys=keys, registry=registry
    )
    started: list[Callable[[], Any]] = []
    try:
        await producer.start()
        started.append(producer.stop)
        await replies.start()
        started.append(replies.stop)
        await view.start()
        started.append(view.stop)
        yield ApiRuntime(settings, app, producer, replies, view, keys, registry)
    finally:
        for stop in reversed(started):
            with contextlib.suppress(Exception):
                await stop()


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture: ``serve_api`` owns SIGTERM/SIGINT (uvicorn's
    handlers would replace the event loop's and re-raise the signal after shutdown)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve_api(
    settings: Settings,
    *,
    install_signals: bool = True,
    stop: asyncio.Event | None = None,
    registry: CollectorRegistry | None = None,
    keys: KeyStore | None = None,
    on_started: Callable[[ApiRuntime], None] | None = None,
) -> None:
    """One front-end process until SIGTERM/SIGINT, ``stop`` or cancellation.

    Shutdown: stop accepting connections, let in-flight requests finish (up to the reply
    timeout), then close the Kafka clients. Raises if a Kafka tail dies, so the process exits
    non-zero rather than serving stale data. ``settings.api_port`` 0 picks a free port; the
    address is in ``runtime.base_url`` when ``on_started`` is called. ``keys`` replaces the
    store read from ``settings.api_keys_file``.
    """
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if install_signals else ()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        async with api_runtime(settings, registry=registry, keys=keys) as runtime:
            await _serve(runtime, stop, on_started)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


async def _listen(server: uvicorn.Server, settings: Settings) -> None:
    """``server.serve()``, with uvicorn's ``sys.exit`` on a bind failure turned into an error
    (a ``SystemExit`` escaping a task would stop the whole event loop)."""
    try:
        await server.serve()
    except SystemExit:
        raise RuntimeError(
            f"the API could not listen on {settings.api_host}:{settings.api_port}"
        ) from None


async def _serve(
    runtime: ApiRuntime, stop: asyncio.Event, on_started: Callable[[ApiRuntime], None] | None
) -> None:
    settings = runtime.settings
    server = _Server(
        uvicorn.Config(
            runtime.app,
            host=settings.api_host,
            port=settings.api_port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(settings.api_reply_timeout_s) + 2,
        )
    )
    serving = asyncio.create_task(_listen(server, settings), name="api-http")
    stopping = asyncio.create_task(stop.wait(), name="api-stop")
    watched: set[asyncio.Future[Any]] = {
        serving,
        stopping,
        runtime.replies.task,
        runtime.view.task,
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
                bootstrap=settings.bootstrap,
                event_loop=running_loop_name(),
            )
            if on_started is not None:
                on_started(runtime)
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        server.should_exit = True
        try:
            await serving
        finally:
            log.info("api_stopped")
    for tail in (runtime.replies, runtime.view):
        if tail.failure is not None:
            raise RuntimeError(f"{tail.name} failed") from tail.failure
