"""``FrontDoor``, the ASGI layer every request passes first (request id, ``OPTIONS`` and 405, CORS,
the 500 safety net, the body deadline, metrics, the SERVER span), so 404s, probes and crashes are
covered alike; it calls the API's routes directly (docs/architecture.md, "The front-end")."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping, Sequence
from typing import Any, Final

from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.api.bodies import error_response, new_request_id, valid_id
from worker.api.cors import EXPOSE_HEADERS, CorsPolicy
from worker.api.methods import allow_value, takes
from worker.api.metrics import UNMATCHED_ROUTE, ApiMetrics, method_label
from worker.contract.catalogue import ServiceError
from worker.runtime import tracing
from worker.runtime.logs import get_logger

_UNTRACED: contextlib.nullcontext[Span] = contextlib.nullcontext(INVALID_SPAN)

Endpoint = Callable[[Request], Awaitable[Response]]
#: Answers a ``ServiceError`` a direct route raised (``worker.api.routes.on_service_error``).
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]

#: The request headers the front door reads, each at its first occurrence.
_READ: Final = frozenset(
    {
        b"x-request-id",
        b"origin",
        b"access-control-request-method",
        tracing.TRACEPARENT.encode(),
        tracing.TRACESTATE.encode(),
    }
)
_REQUEST_ID: Final = b"x-request-id"

log = get_logger(__name__)


class FrontDoor:
    """Around the whole app. A request's metrics label is its route's template (``unmatched``
    otherwise), never the raw path; preflights are answered for ``preflight_routes`` only, any
    other ``OPTIONS`` with the path's ``Allow``; ``body_timeout_s`` bounds reading the body from
    the request's start; ``direct_routes`` are called directly (their ``HEAD`` excepted)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: ApiMetrics,
        cors: CorsPolicy,
        routes: Sequence[Route],
        preflight_routes: Collection[str],
        body_timeout_s: float | None = None,
        direct_routes: Collection[str] = (),
        on_service_error: ErrorHandler | None = None,
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
            {
                route.path: (route.path, route.path_regex, route.param_convertors)
                for route in routes
            }.values()
        )
        self._takes = {path: takes(methods) for path, methods in handled.items()}
        self._allow = {path: allow_value(methods) for path, methods in handled.items()}
        self._preflight_routes = frozenset(preflight_routes)
        # The API's own routes get a SERVER span; probe scrapes would only add noise.
        self._traced_routes = self._preflight_routes
        self._span_names: dict[tuple[str, str], str] = {}
        self._direct: dict[tuple[str, str], Endpoint] = {}
        if direct_routes and on_service_error is None:
            raise ValueError("direct_routes need on_service_error")
        self._on_service_error = on_service_error
        for route in routes:
            if route.path in direct_routes:
                for method in route.methods or ():
                    if method != "HEAD":
                        self._direct.setdefault((route.path, method), route.endpoint)
        # Children of the request metrics, by label values (all bounded: see ApiMetrics).
        self._counted: dict[tuple[str, str, int], Any] = {}
        self._timed: dict[tuple[str, str], Any] = {}

    def _match(self, path: str) -> tuple[str | None, dict[str, Any]]:
        for template, pattern, convertors in self._templates:
            match = pattern.match(path)
            if match:
                params = match.groupdict()
                for name, value in params.items():
                    params[name] = convertors[name].convert(value)
                return template, params
        return None, {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        if self.body_timeout_s is not None:
            receive = _receive_until(receive, self.body_timeout_s, started)
        seen = _read_headers(scope["headers"])
        request_id = _request_id(seen)
        scope.setdefault("state", {})["request_id"] = request_id
        template, params = self._match(scope["path"])
        # The route's template: a portal session's scope is checked against it (routes.py).
        scope["state"]["route"] = template
        method: str = scope["method"]
        reply = _Stamped(send, request_id, self.cors, self._cors_origin(method, seen))
        traced = template in self._traced_routes and method != "OPTIONS"
        active = self._server_span(template, method, request_id, seen) if traced else _UNTRACED
        with active as span:
            try:
                if template is not None and (
                    method == "OPTIONS" or method not in self._takes[template]
                ):
                    response = self._not_for_the_app(
                        template, method, request_id, Headers(scope=scope)
                    )
                    await response(scope, receive, reply.send)
                elif (endpoint := self._direct.get((template or "", method))) is not None:
                    scope["endpoint"] = endpoint
                    scope["path_params"] = params
                    await self._call(endpoint, scope, receive, reply.send)
                else:
                    await self.app(scope, receive, reply.send)
            except Exception:
                log.exception("api_unhandled_error", request_id=request_id, route=template)
                if reply.started:
                    raise
                code = "get_auth_state_failed" if method == "GET" else "run_auth_action_failed"
                await error_response(request_id, ServiceError.of(code))(scope, receive, reply.send)
            finally:
                self._count(template or UNMATCHED_ROUTE, method, reply.status, started)
                if span.is_recording():
                    span.set_attribute("http.response.status_code", reply.status)
                    if reply.status >= 500:
                        span.set_status(Status(StatusCode.ERROR))

    def _cors_origin(self, method: str, seen: Mapping[bytes, bytes]) -> str | None:
        """The caller's ``Origin`` when it may read the response (not on a preflight, which sets
        its own headers)."""
        raw_origin = seen.get(b"origin")
        if not raw_origin:
            return None
        if method == "OPTIONS" and b"access-control-request-method" in seen:
            return None
        origin = raw_origin.decode("latin-1")
        return origin if self.cors.origin_allowed(origin) else None

    async def _call(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        """A direct route: what Starlette's ``request_response`` and exception layer do for
        it, minus the routing done already."""
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except ServiceError as exc:
            assert self._on_service_error is not None
            response = await self._on_service_error(request, exc)
        await response(scope, receive, send)

    def _server_span(
        self, template: str | None, method: str, request_id: str, seen: Mapping[bytes, bytes]
    ) -> Any:
        """The SERVER span continuing the caller's ``traceparent`` (or a new trace)."""
        key = (template or "", method)
        name = self._span_names.get(key)
        if name is None:
            name = self._span_names[key] = f"{method} {template}"
        traceparent = seen.get(b"traceparent")
        tracestate = seen.get(b"tracestate")
        return tracing.span_from(
            None if traceparent is None else traceparent.decode("latin-1"),
            None if tracestate is None else tracestate.decode("latin-1"),
            name,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "http.route": template or "",
                "passkey.request_id": request_id,
            }
            if tracing.recording()
            else None,
        )

    def _count(self, route: str, method: str, status: int, started: float) -> None:
        """The request metrics, through children looked up once per label set."""
        mlabel = method_label(method)
        counted = self._counted.get((route, mlabel, status))
        if counted is None:
            counted = self.metrics.requests.labels(route, mlabel, str(status))
            self._counted[(route, mlabel, status)] = counted
        counted.inc()
        timed = self._timed.get((route, mlabel))
        if timed is None:
            timed = self._timed[(route, mlabel)] = self.metrics.duration.labels(route, mlabel)
        timed.observe(time.perf_counter() - started)

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


def _stamped(
    headers: Sequence[tuple[bytes, bytes]], stamp: tuple[bytes, bytes]
) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``stamp`` in place of any header of its name (``MutableHeaders``'s
    ``__setitem__``, without building one per response)."""
    name = stamp[0]
    out = [header for header in headers if header[0] != name]
    if len(out) == len(headers):
        out.append(stamp)
        return out
    first = next(i for i, header in enumerate(headers) if header[0] == name)
    out.insert(first, stamp)
    return out


def _read_headers(headers: Sequence[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """The headers the front door reads (``_READ``), in one scan of the request's."""
    seen: dict[bytes, bytes] = {}
    for name, value in headers:
        if name in _READ and name not in seen:
            seen[name] = value
    return seen


def _request_id(seen: Mapping[bytes, bytes]) -> str:
    """The caller's ``X-Request-Id`` when valid, else a new one."""
    raw = seen.get(_REQUEST_ID)
    caller = None if raw is None else raw.decode("latin-1")
    return caller if caller and valid_id(caller) else new_request_id()


class _Stamped:
    """The ``send`` a request is answered through: stamps ``X-Request-Id`` (and the CORS
    headers) on the response's start and keeps its status for the metrics and the span
    (500 until a response starts)."""

    __slots__ = ("_cors", "_cors_origin", "_request_id", "_send", "_stamp", "started", "status")

    def __init__(
        self, send: Send, request_id: str, cors: CorsPolicy, cors_origin: str | None
    ) -> None:
        self._send = send
        self._request_id = request_id
        self._stamp = (_REQUEST_ID, request_id.encode("latin-1"))
        self._cors = cors
        self._cors_origin = cors_origin
        self.status = 500
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
            cors_origin = self._cors_origin
            if self._cors.enabled or cors_origin is not None:
                out = MutableHeaders(scope=message)
                out["X-Request-Id"] = self._request_id
                if self._cors.enabled:
                    out.add_vary_header("Origin")
                if cors_origin is not None and "access-control-allow-origin" not in out:
                    out["Access-Control-Allow-Origin"] = cors_origin
                    out["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
            else:
                message["headers"] = _stamped(message.get("headers", ()), self._stamp)
        await self._send(message)


def _receive_until(receive: Receive, timeout_s: float, started: float) -> Receive:
    """``receive`` that raises 408 once ``timeout_s`` have passed since the request's start, so a
    body sent a byte at a time cannot hold a handler; only a ``receive`` that waits is timed."""

    async def receive_in_time() -> Message:
        steps = receive().__await__()
        try:
            first = steps.send(None)
        except StopIteration as done:
            message: Message = done.value
            return message
        left = timeout_s - (time.perf_counter() - started)
        try:
            async with asyncio.timeout(left):
                return await _Resumed(steps, first)
        except TimeoutError:
            raise ServiceError.of(
                "request_timeout", f"The request body did not arrive within {timeout_s:g} s."
            ) from None

    return receive_in_time


class _Resumed:
    """The rest of an awaitable whose first step has run: ``yield from`` spelled out (PEP
    380), so the step it stopped at is awaited under the deadline."""

    __slots__ = ("_first", "_steps")

    def __init__(self, steps: Generator[Any, None, Message], first: Any) -> None:
        self._steps = steps
        self._first = first

    def __await__(self) -> Generator[Any, None, Message]:
        steps, step = self._steps, self._first
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:
                try:
                    step = steps.throw(exc)
                except StopIteration as done:
                    message: Message = done.value
                    return message
            else:
                try:
                    step = steps.send(sent)
                except StopIteration as done:
                    message = done.value
                    return message
