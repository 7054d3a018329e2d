"""``worker.runtime.tracing`` without a broker: which OTEL_* settings export where, the header
round trip, the W3C tracestate cut, and the log processor's ids."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from worker.runtime import trace_export, tracing

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("env", "targets"),
    [
        ({}, ()),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, ("otlp http://c:4318/v1/traces",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/t"}, ("otlp http://c/t",)),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp http://localhost:4318/v1/traces",)),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, ()),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, ()),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console (stdout)",)),
        # The benchmark's batch-dropping exporter is not the product's (bench/traced.py).
        ({"TRACING_BENCH_EXPORTER": "discard"}, ()),
    ],
)
def test_export_targets_follow_the_otel_variables(
    env: dict[str, str], targets: tuple[str, ...]
) -> None:
    assert trace_export.export_targets(env) == targets


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_TRACES_EXPORTER": "jaeger"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
    ],
)
def test_what_is_not_installed_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"otlp|http/protobuf"):
        trace_export.export_targets(env)


def test_not_recording_passes_the_callers_context_through() -> None:
    assert not tracing.recording()
    parent = tracing.context_from_headers([("traceparent", CALLER.encode())])
    with tracing.span("process", kind=SpanKind.CONSUMER, parent=parent), tracing.span("child"):
        assert tracing.http_headers() == {"traceparent": CALLER}
        event = tracing.add_trace_ids(None, "info", {})
    assert event == {"trace_id": CALLER[3:35], "span_id": CALLER[36:52]}
    with tracing.span("root", parent=tracing.ROOT):
        fresh = tracing.kafka_headers()
    assert len(fresh) == 1 and fresh[0][1].endswith(b"-00"), "a new root is not sampled"
    assert tracing.add_trace_ids(None, "info", {}) == {}, "no span, no ids"


def test_recording_makes_children_and_cuts_a_long_tracestate() -> None:
    memory = InMemorySpanExporter()
    tracing.configure("t", environ={}, processor=SimpleSpanProcessor(memory), set_global=False)
    try:
        long_state = ",".join(f"k{i}={'v' * 40}" for i in range(20))  # 20 x 44 characters
        parent = tracing.context_from_traceparent(CALLER, long_state)
        with tracing.span("process", kind=SpanKind.CONSUMER, parent=parent) as span:
            headers = dict(tracing.kafka_headers())
            assert span.is_recording()
        (finished,) = memory.get_finished_spans()
    finally:
        tracing.reset()
    assert finished.parent is not None and finished.parent.span_id == int(CALLER[36:52], 16)
    traceparent = headers["traceparent"].decode()
    assert traceparent == f"00-{CALLER[3:35]}-{finished.context.span_id:016x}-01"
    state = headers["tracestate"].decode()
    assert len(state) <= tracing.TRACESTATE_MAX
    assert state.startswith("k0=") and TraceState.from_header([state])


class _Record:
    topic, partition, offset = "auth.commands", 0, 1

    def __init__(self, headers: list[tuple[str, bytes]]) -> None:
        self.headers = headers


@pytest.mark.parametrize(
    "headers",
    [
        [("traceparent", CALLER.encode())],
        [("reply-partition", b"1"), ("traceparent", CALLER.encode())],
        [("traceparent", CALLER.upper().encode())],
        [("traceparent", ("00-" + "0" * 32 + CALLER[35:]).encode())],
        [("traceparent", (CALLER[:36] + "0" * 16 + CALLER[52:]).encode())],
        [("traceparent", ("ff" + CALLER[2:]).encode())],
        [("traceparent", (CALLER + "-x").encode())],
        [("traceparent", ("01" + CALLER[2:] + "-future").encode())],
        [("traceparent", (" " + CALLER).encode())],
        [("traceparent", CALLER[:-1].encode())],
        [("traceparent", CALLER.encode()), ("tracestate", b"a=1,b=2")],
        [("traceparent", b"")],
        [],
    ],
)
def test_a_record_s_context_is_carried_as_the_propagator_reads_it(
    headers: list[tuple[str, bytes]],
) -> None:
    """Recording nothing, the worker reads a plain ``traceparent`` itself and writes it on as
    it came: the same context and the same outgoing headers as through the propagator."""
    expected = trace.get_current_span(tracing.context_from_headers(headers)).get_span_context()
    assert not tracing.recording()
    with tracing.consume_span(_Record(headers)):
        carried = tracing.current_span().get_span_context()
        if expected.is_valid:
            assert carried == expected
        else:
            assert carried.is_valid, "a record without a usable context starts a trace"
            assert carried.trace_id != int(CALLER[3:35], 16), "one the propagator refuses"
        assert tracing.kafka_headers() == tracing.kafka_headers(carried)
        assert tracing.http_headers() == tracing.http_headers(carried)
        assert tracing.kafka_headers()[0][1].decode() == tracing.http_headers()["traceparent"]


@pytest.mark.parametrize(
    ("traceparent", "tracestate"),
    [
        (CALLER, None),
        (CALLER, "a=1,b=2"),
        (CALLER.upper(), None),
        ("00-" + "0" * 32 + CALLER[35:], None),
        (CALLER[:36] + "0" * 16 + CALLER[52:], None),
        ("ff" + CALLER[2:], None),
        (CALLER + "-x", None),
        ("01" + CALLER[2:] + "-future", None),
        (" " + CALLER, None),
        (CALLER[:-1], None),
        ("", None),
        (None, None),
    ],
)
def test_stored_header_values_give_the_propagator_s_context_and_go_on_as_they_came(
    traceparent: str | None, tracestate: str | None
) -> None:
    """A webhook attempt's stored ``traceparent``: the parent the propagator reads, and,
    recording nothing, carried on in the attempt's request as it was stored."""
    carrier = {k: v for k, v in (("traceparent", traceparent), ("tracestate", tracestate)) if v}
    expected = trace.get_current_span(
        TraceContextTextMapPropagator().extract(carrier, context=Context())
    ).get_span_context()
    parent = tracing.context_from_traceparent(traceparent, tracestate)
    assert trace.get_current_span(parent).get_span_context() == expected
    assert not tracing.recording()
    with tracing.span("attempt", kind=SpanKind.CLIENT, parent=parent):
        sent = tracing.http_headers()
        assert tracing.current_traceparent() == (sent["traceparent"], sent.get("tracestate"))
    with tracing.span_from(traceparent, tracestate, "attempt", kind=SpanKind.CLIENT):
        sent_from = tracing.http_headers()
    if expected.is_valid:
        assert sent == sent_from == tracing.http_headers(expected)
    else:
        assert sent["traceparent"].endswith("-00"), "a new root, not sampled"
        assert sent_from["traceparent"].endswith("-00")
        assert sent_from["traceparent"] != sent["traceparent"], "each a trace of its own"
        assert _plain(sent_from["traceparent"]).is_valid


def _plain(traceparent: str) -> SpanContext:
    carrier = {"traceparent": traceparent}
    parent = TraceContextTextMapPropagator().extract(carrier, context=Context())
    return trace.get_current_span(parent).get_span_context()


def test_recording_nothing_the_carried_trace_builds_no_opentelemetry_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recording nothing, a record's trace and an attempt's stored one are made current
    without an OpenTelemetry context built and attached for each (the dispatcher does both
    per delivery, the front door one per request); headers and log ids still carry them, and
    each block leaves the trace that was current before it."""
    attached: list[Context] = []
    real_attach = otel_context.attach

    def attach(context: Context) -> object:
        attached.append(context)
        return real_attach(context)

    monkeypatch.setattr(otel_context, "attach", attach)
    assert not tracing.recording()
    with tracing.consume_span(_Record([])):
        minted = tracing.http_headers()["traceparent"]
        assert _plain(minted).is_valid and minted.endswith("-00")
        with tracing.span_from(CALLER, None, "attempt", kind=SpanKind.CLIENT):
            assert tracing.current_traceparent() == (CALLER, None)
            assert tracing.kafka_headers() == [("traceparent", CALLER.encode())]
            event = tracing.add_trace_ids(None, "info", {})
            assert event == {"trace_id": CALLER[3:35], "span_id": CALLER[36:52]}
        with tracing.span("decide"):
            assert tracing.http_headers()["traceparent"] == minted
        assert tracing.current_traceparent() == (minted, None)
    assert tracing.current_span() is trace.INVALID_SPAN
    assert tracing.http_headers() == {}
    assert attached == []


def test_a_stored_traceparent_is_read_into_its_context_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recording nothing, an attempt sends its stored plain ``traceparent`` on as it came
    without building its context (once per delivery); a log line's ids still read it."""
    built: list[object] = []
    real = SpanContext

    def counted(*args: Any, **kwargs: Any) -> SpanContext:
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(tracing, "SpanContext", counted)
    assert not tracing.recording()
    parent = tracing.context_from_traceparent(CALLER)
    with tracing.span("attempt", kind=SpanKind.CLIENT, parent=parent):
        assert tracing.http_headers() == {"traceparent": CALLER}
        assert tracing.kafka_headers() == [("traceparent", CALLER.encode())]
        assert built == []
        event = tracing.add_trace_ids(None, "info", {})
    assert event == {"trace_id": CALLER[3:35], "span_id": CALLER[36:52]}
    assert len(built) == 1
