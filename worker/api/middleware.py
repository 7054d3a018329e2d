"""``FrontDoor``: the pure ASGI middleware every request passes first.

It picks the request id (a valid caller ``X-Request-Id`` or ``req_<uuid4 hex>``), answers a
known path's ``OPTIONS`` (a CORS preflight, or the route's methods) and a method the route does
not take (405 ``method_not_allowed`` with ``Allow``: ``worker.api.methods``), stamps
``X-Request-Id`` (and CORS headers) on every response, turns unexpected exceptions into the
seed's 500 error body, bounds the time the app waits for the request body (408
``request_timeout``; the connection side is ``worker.api.protocol``), records the request
metrics, and continues the caller's W3C ``traceparent`` (or starts a trace) in a SERVER span
for the API's routes (``worker.tracing``; probes, ``OPTIONS`` and unmatched paths are not
traced). Doing this in one layer around the app, rather than per handler, covers 404s, 405s,
probes and crashes alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Sequence

from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker import tracing
from worker.api.bodies import error_response, new_request_id, valid_id
from worker.api.cors import EXPOSE_HEADERS, CorsPolicy
from worker.api.methods import allow_value, takes
from worker.api.metrics import UNMATCHED_ROUTE, ApiMetrics, method_label
from worker.catalogue import ServiceError
from worker.logs import get_logger

_UNTRACED: contextlib.nullcontext[Span] = contextlib.nullcontext(INVALID_SPAN)

log = get_logger(__name__)


class FrontDoor:
    """Around the whole app (see the module docstring).

    ``routes`` are the app's routes: a request's metrics label is the template of the one its
    path matches (``unmatched`` otherwise), never the raw path, and the methods of the routes
    sharing a template are what that path takes. Preflights are answered for the templates in
    ``preflight_routes`` only; an ``OPTIONS`` to another known path, or without the preflight
    headers, is answered with the path's ``Allow``. ``body_timeout_s`` bounds, from the
    request's start, how long reading its body may take (``None``: unbounded).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: ApiMetrics,
        cors: CorsPolicy,
        routes: Sequence[Route],
        preflight_routes: Collection[str],
        body_timeout_s: float | None = None,
    ) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.metrics = metrics
        self.cors = cors
        handled: dict[str, set[str]] = {}
        for route in routes:
            handled.setdefault(route.path, set()).update(route.methods or ())
        # One entry per template, in the routes' order (first match wins, as in the router).
        self._templates = tuple(
            {route.path: (route.path, route.path_regex) for route in routes}.values()
        )
        self._takes = {path: takes(methods) for path, methods in handled.items()}
        self._allow = {path: allow_value(methods) for path, methods in handled.items()}
        self._preflight_routes = frozenset(preflight_routes)
        # The API's own routes get a SERVER span; probe scrapes would only add noise.
        self._traced_routes = self._preflight_routes

    def route_template(self, path: str) -> str | None:
        """The route template ``path`` belongs to (the metrics label), or ``None``."""
        for template, pattern in self._templates:
            if pattern.match(path):
                return template
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        if self.body_timeout_s is not None:
            receive = _receive_until(receive, self.body_timeout_s)
        headers = Headers(scope=scope)
        caller_rid = headers.get("x-request-id")
        request_id = caller_rid if caller_rid and valid_id(caller_rid) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        template = self.route_template(scope["path"])
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
                    out["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
            await send(message)

        traced = template in self._traced_routes and method != "OPTIONS"
        active = (
            tracing.span(
                f"{method} {template}",
                kind=SpanKind.SERVER,
                parent=tracing.context_from_traceparent(
                    headers.get(tracing.TRACEPARENT), headers.get(tracing.TRACESTATE)
                ),
                attributes={
                    "http.request.method": method,
                    "http.route": template or "",
                    "passkey.request_id": request_id,
                },
            )
            if traced
            else _UNTRACED
        )
        with active as span:
            try:
                if template is not None and (
                    method == "OPTIONS" or method not in self._takes[template]
                ):
                    response = self._not_for_the_app(template, method, request_id, headers)
                    await response(scope, receive, send_wrapper)
                else:
                    await self.app(scope, receive, send_wrapper)
            except Exception:
                log.exception("api_unhandled_error", request_id=request_id, route=template)
                if response_started:
                    raise
                code = "get_auth_state_failed" if method == "GET" else "run_auth_action_failed"
                await error_response(request_id, ServiceError.of(code))(
                    scope, receive, send_wrapper
                )
            finally:
                route = template or UNMATCHED_ROUTE
                mlabel = method_label(method)
                self.metrics.requests.labels(route, mlabel, str(status)).inc()
                self.metrics.duration.labels(route, mlabel).observe(time.perf_counter() - started)
                if span.is_recording():
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))

    def _not_for_the_app(
        self, template: str, method: str, request_id: str, headers: Headers
    ) -> Response:
        """A known path's ``OPTIONS`` (a preflight on an API route, else the path's methods)
        or a method it does not take (405): answered here, before any key check."""
        allow = {"Allow": self._allow[template]}
        if method != "OPTIONS":
            return error_response(
                request_id,
                ServiceError.of(
                    "method_not_allowed",
                    f"The route does not take {method[:20]}; it takes {allow['Allow']}.",
                ),
                headers=allow,
            )
        origin = headers.get("origin")
        request_method = headers.get("access-control-request-method")
        if origin is None or request_method is None or template not in self._preflight_routes:
            return Response(status_code=204, headers=allow)
        refusal = self.cors.preflight_refusal(
            origin, request_method, headers.get("access-control-request-headers")
        )
        if refusal is not None:
            return error_response(
                request_id, ServiceError.of("cors_forbidden", f"CORS preflight refused: {refusal}")
            )
        return Response(status_code=204, headers=allow | self.cors.preflight_headers(origin))


def _receive_until(receive: Receive, timeout_s: float) -> Receive:
    """``receive`` that raises 408 ``request_timeout`` once ``timeout_s`` have passed since
    now (the request's start): a body sent a byte at a time must not hold a handler."""
    deadline = asyncio.get_running_loop().time() + timeout_s

    async def receive_in_time() -> Message:
        try:
            async with asyncio.timeout_at(deadline):
                return await receive()
        except TimeoutError:
            raise ServiceError.of(
                "request_timeout", f"The request body did not arrive within {timeout_s:g} s."
            ) from None

    return receive_in_time
