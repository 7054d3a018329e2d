"""OpenTelemetry: one trace from the caller's request through Kafka to the provider and every
webhook; spans are exported when the ``OTEL_*`` variables say so, else each hop only passes the
context on (docs/operations.md, "Tracing")."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from worker import __version__
from worker.runtime.trace_export import export_targets, processor_for

__all__ = [
    "SERVICE_API",
    "SERVICE_WEBHOOKS",
    "SERVICE_WORKER",
    "TRACEPARENT",
    "TRACESTATE",
    "Tracing",
    "add_trace_ids",
    "configure",
    "context_from_headers",
    "context_from_traceparent",
    "current_span",
    "current_traceparent",
    "http_headers",
    "kafka_headers",
    "recording",
    "reset",
    "span",
    "span_from",
]

SERVICE_WORKER: Final = "passkey-worker"
SERVICE_API: Final = "passkey-api"
SERVICE_WEBHOOKS: Final = "passkey-webhooks"
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
TRACESTATE_MAX: Final = 512
"""W3C: propagate at least 512 characters of ``tracestate``; longer ones are cut to that (the
AsyncAPI document promises at most 512)."""

_propagator: Final = TraceContextTextMapPropagator()
_ids: Final = RandomIdGenerator()
ROOT: Final = Context()
"""An explicit empty parent: the span starts a new trace (not the current context's)."""


@dataclass(frozen=True, slots=True)
class Tracing:
    """What ``configure`` set up: the service name and where spans go (empty: nowhere)."""

    service: str
    targets: tuple[str, ...]
    provider: TracerProvider

    @property
    def recording(self) -> bool:
        return bool(self.targets)


@dataclass(slots=True)
class _State:
    recording: bool = False
    tracer: trace.Tracer | None = None
    setup: Tracing | None = None


_state = _State()


def configure(
    default_service: str,
    *,
    environ: Mapping[str, str] | None = None,
    processor: SpanProcessor | None = None,
    set_global: bool = True,
) -> Tracing:
    """Set up tracing for this process, once, before any client is built. ``processor`` is
    added beside those ``OTEL_*`` asks for, and spans are then recorded (tests, the benchmark);
    ``set_global`` makes the provider the API's global one (once per process)."""
    env = os.environ if environ is None else environ
    service = env.get("OTEL_SERVICE_NAME") or default_service
    targets = export_targets(env)
    processors = [processor_for(t) for t in targets]
    if processor is not None:
        processors.append(processor)
        targets = (*targets, f"in-process {type(processor).__name__}")
    resource = Resource.create({"service.name": service, "service.version": __version__})
    provider = TracerProvider(
        resource=resource,
        # Nothing to export: no span is recorded (see ``span``); otherwise OTEL_TRACES_SAMPLER,
        # parent-based always-on by default, so the caller's sampled flag is honoured.
        sampler=None if targets else ALWAYS_OFF,
        shutdown_on_exit=True,
    )
    for processor in processors:
        provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    setup = Tracing(service, targets, provider)
    _state.recording = bool(targets)
    _state.tracer = provider.get_tracer("passkey-auth-worker", __version__)
    _state.setup = setup
    return setup


def reset() -> None:
    """Back to propagating only (tests); flushes and stops the previous provider."""
    if _state.setup is not None:
        _state.setup.provider.shutdown()
    _state.recording = False
    _state.tracer = None
    _state.setup = None


def recording() -> bool:
    return _state.recording


# -- spans -------------------------------------------------------------------------------------


def _fresh() -> _Carried:
    """A new trace, not sampled, carried on unrecorded: its ``traceparent`` written at once
    (it is what goes on), its context read back from it only when asked for."""
    trace_id, span_id = _ids.generate_trace_id(), _ids.generate_span_id()
    return _Carried(None, {TRACEPARENT: f"00-{trace_id:032x}-{span_id:016x}-00"})


class _Carried(NonRecordingSpan):
    """A trace carried through this process unrecorded, its outgoing headers made once for all
    the records and requests of its command or attempt (``http``: as they came, when known).
    A plain ``traceparent`` (``context`` None) is read into its context only when that is asked
    for (a log line, a child span): an attempt sends it on as it came."""

    def __init__(self, context: SpanContext | None, http: dict[str, str] | None = None) -> None:
        super().__init__(context)  # type: ignore[arg-type]
        self._http = http
        self._kafka: list[tuple[str, bytes]] | None = None

    def get_span_context(self) -> SpanContext:
        if self._context is None:
            plain = self._http[TRACEPARENT]
            self._context = SpanContext(
                int(plain[3:35], 16),
                int(plain[36:52], 16),
                is_remote=True,
                trace_flags=TraceFlags(int(plain[53:55], 16)),
            )
        return self._context

    def kafka(self) -> list[tuple[str, bytes]]:
        if self._kafka is None:
            self._kafka = [(k, v.encode("ascii")) for k, v in self.http().items()]
        return self._kafka

    def http(self) -> dict[str, str]:
        if self._http is None:
            self._http = dict(_carried(self._context))
        return self._http


#: The trace carried through this process unrecorded (``_Carried``), made current by ``_Carry``:
#: one context variable instead of an OpenTelemetry context built, attached and detached for
#: every record, request and attempt. Never set while spans are recorded.
_CARRIED: Final[ContextVar[_Carried | None]] = ContextVar("passkey_carried_trace", default=None)


def current_span() -> Span:
    """The current span: the trace carried here unrecorded, else OpenTelemetry's current one."""
    carried = _CARRIED.get()
    return trace.get_current_span() if carried is None else carried


class _Carry:
    """Makes ``span`` the carried trace for the block (recording nothing: no end, no status)."""

    __slots__ = ("_token", "span")

    def __init__(self, span: _Carried) -> None:
        self.span = span
        self._token: Token[_Carried | None] | None = None

    def __enter__(self) -> Span:
        self._token = _CARRIED.set(self.span)
        return self.span

    def __exit__(self, *_: object) -> None:
        if self._token is not None:
            _CARRIED.reset(self._token)
            self._token = None


class _Active:
    """Makes a recorded ``span`` current for the block; ends it and records an escaping
    exception on it. A class rather than ``@contextmanager``: this runs per command."""

    __slots__ = ("_token", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._token: Token[Context] | None = None

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            otel_context.detach(self._token)
        if isinstance(e, Exception) and self.span.is_recording():
            self.span.record_exception(e)
            self.span.set_status(Status(StatusCode.ERROR, type(e).__name__))
        self.span.end()


#: A child span in a process that records nothing: no span at all; the current context, which
#: carries the trace on, stays as it is.
_CURRENT: Final[contextlib.nullcontext[Span]] = contextlib.nullcontext(INVALID_SPAN)


def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: Context | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> _Active | _Carry | contextlib.nullcontext[Span]:
    """A span named ``name`` (low-cardinality: never an id), current inside the block, child of
    ``parent`` (an incoming message's context; ``ROOT``: a new trace) or of the current span.
    Not recording, a span with an incoming ``parent`` carries that context on unchanged."""
    if not _state.recording:
        if parent is None:
            return _CURRENT
        carried = trace.get_current_span(parent)
        if type(carried) is not _Carried:
            incoming = carried.get_span_context()
            carried = _Carried(incoming) if incoming.is_valid else _fresh()
        return _Carry(carried)
    return _Active(_start(name, kind, parent, attributes))


def _start(
    name: str, kind: SpanKind, parent: Context | None, attributes: Mapping[str, Any] | None
) -> Span:
    assert _state.tracer is not None
    return _state.tracer.start_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes,
        record_exception=False,  # ``_Active`` records it once
        set_status_on_exception=False,
    )


def span_from(
    traceparent: str | None,
    tracestate: str | None,
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> _Active | _Carry:
    """``span`` whose parent is W3C header values (``context_from_traceparent``; a new trace
    when absent or malformed). Recording nothing, they are carried on as they came without a
    context built for them: a request's or a stored delivery's, once each."""
    if _state.recording:
        parent = context_from_traceparent(traceparent, tracestate)
        return _Active(_start(name, kind, parent, attributes))
    carried = _parse(traceparent, tracestate) if traceparent else None
    return _Carry(_fresh() if carried is None else carried)


# -- crossing process boundaries ---------------------------------------------------------------


def _tracestate(span_context: SpanContext) -> str | None:
    state = span_context.trace_state
    if not state:
        return None
    header = state.to_header()
    if len(header) <= TRACESTATE_MAX:
        return header
    # W3C truncation: drop entries over 128 characters first, then from the right.
    entries = [e for e in header.split(",") if len(e) <= 128]
    while entries and len(",".join(entries)) > TRACESTATE_MAX:
        entries.pop()
    return ",".join(entries) or None


def _carried(span_context: SpanContext) -> list[tuple[str, str]]:
    if not span_context.is_valid:
        return []
    out = [
        (
            TRACEPARENT,
            f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
            f"{span_context.trace_flags:02x}",
        )
    ]
    state = _tracestate(span_context)
    if state is not None:
        out.append((TRACESTATE, state))
    return out


_last_kafka: tuple[SpanContext, list[tuple[str, bytes]]] = (
    INVALID_SPAN.get_span_context(),
    [],
)


def kafka_headers(span_context: SpanContext | None = None) -> list[tuple[str, bytes]]:
    """``traceparent``/``tracestate`` Kafka headers of ``span_context`` (default: the current
    span's); empty without a valid context. The last answer is reused while the context is the
    same (one command writes several records under one span); callers must not mutate it."""
    global _last_kafka
    if span_context is None:
        current = current_span()
        if type(current) is _Carried:
            return current.kafka()
        ctx = current.get_span_context()
    else:
        ctx = span_context
    if _last_kafka[0] is ctx:
        return _last_kafka[1]
    headers = [(k, v.encode("ascii")) for k, v in _carried(ctx)]
    _last_kafka = (ctx, headers)
    return headers


def http_headers(span_context: SpanContext | None = None) -> dict[str, str]:
    """The same as HTTP request headers; callers must not mutate the answer."""
    if span_context is None:
        current = current_span()
        if type(current) is _Carried:
            return current.http()
        span_context = current.get_span_context()
    return dict(_carried(span_context))


def current_traceparent() -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of the current span, for storing with deferred work."""
    carried = http_headers()
    return carried.get(TRACEPARENT), carried.get(TRACESTATE)


def context_from_traceparent(traceparent: str | None, tracestate: str | None = None) -> Context:
    """The parent context of W3C header values; ``ROOT`` when absent or malformed."""
    carried = _parse(traceparent, tracestate) if traceparent else None
    return ROOT if carried is None else trace.set_span_in_context(carried, Context())


def context_from_headers(headers: Iterable[tuple[str, bytes]] | None) -> Context:
    """The parent context in a Kafka record's headers (``ROOT`` when it has none)."""
    carried = _incoming(headers)
    return ROOT if carried is None else trace.set_span_in_context(carried, Context())


def _trace_headers(headers: Iterable[tuple[str, bytes]] | None) -> tuple[bytes | None, str | None]:
    """A record's ``traceparent`` (its bytes, cut at 512) and ``tracestate``, the last of
    each; a header without a value (null) carries no context."""
    raw = tracestate = None
    for key, value in headers or ():
        if not value:
            continue
        if key == TRACEPARENT:
            raw = value[:512]
        elif key == TRACESTATE:
            tracestate = value[:512].decode("latin-1")
    return raw, tracestate


#: A ``traceparent`` of version 00 and nothing else: what every hop of this service writes.
_PLAIN_TRACEPARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_NO_TRACE: Final = "0" * 32
_NO_SPAN: Final = "0" * 16


def _parse(traceparent: str, tracestate: str | None) -> _Carried | None:
    """The trace W3C header values carry (None: none valid). A plain ``traceparent``, alone,
    is parsed here by the propagator's rules and carried on as it came; any other by it."""
    if not tracestate and len(traceparent) == 55:
        plain = _PLAIN_TRACEPARENT.fullmatch(traceparent)
        if plain is not None:
            if plain[1] == _NO_TRACE or plain[2] == _NO_SPAN:
                return None
            return _Carried(None, {TRACEPARENT: traceparent})
    carrier = {TRACEPARENT: traceparent}
    if tracestate:
        carrier[TRACESTATE] = tracestate
    parent = _propagator.extract(carrier, context=Context())
    context = trace.get_current_span(parent).get_span_context()
    return _Carried(context) if context.is_valid else None


def _incoming(headers: Iterable[tuple[str, bytes]] | None) -> _Carried | None:
    """The trace a Kafka record's headers carry (None: none), read without building a context."""
    raw, tracestate = _trace_headers(headers)
    return None if raw is None else _parse(raw.decode("latin-1"), tracestate)


def messaging(operation: str, topic: str | None = None) -> dict[str, Any]:
    """OpenTelemetry's messaging attributes of a Kafka ``operation`` (``send``, ``receive``,
    ``process``) on ``topic``: one spelling of the semantic conventions for every span."""
    attributes = {"messaging.system": "kafka", "messaging.operation.type": operation}
    if topic is not None:
        attributes["messaging.destination.name"] = topic
    return attributes


def consume_span(msg: Any) -> _Active | _Carry | contextlib.nullcontext[Span]:
    """The CONSUMER span of processing one Kafka record, continuing the trace in its headers
    (carried on as it came when nothing is recorded)."""
    if not _state.recording:
        carried = _incoming(msg.headers)
        return _Carry(_fresh() if carried is None else carried)
    return span(
        f"process {msg.topic}",
        kind=SpanKind.CONSUMER,
        parent=context_from_headers(msg.headers),
        attributes=messaging("process", msg.topic)
        | {
            "messaging.destination.partition.id": str(msg.partition),
            "messaging.kafka.offset": msg.offset,
        },
    )


# -- logs --------------------------------------------------------------------------------------


def add_trace_ids(_: Any, __: str, event: Any) -> Any:
    """structlog processor: ``trace_id`` and ``span_id`` of the current span, when valid."""
    ctx = current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", f"{ctx.trace_id:032x}")
        event.setdefault("span_id", f"{ctx.span_id:016x}")
    return event
