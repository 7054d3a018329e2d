"""What a unit of work left behind for an operator: finished spans and logged lines, read by the
instrumentation tests of the worker and the dispatcher (fixtures ``spans`` and ``logged`` in
``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from worker.runtime import tracing
from worker.runtime.logs import merge_log_context


@contextmanager
def recorded_spans() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    tracing.configure(
        "passkey-test", environ={}, processor=SimpleSpanProcessor(memory), set_global=False
    )
    try:
        yield memory
    finally:
        tracing.reset()


@contextmanager
def logged_lines() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every line logged, with the log context merged in as the service's pipeline does."""
    with structlog.testing.capture_logs(processors=[merge_log_context]) as events:
        yield events


def one_span(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    (found,) = [s for s in spans.get_finished_spans() if s.name == name]
    return found


def passkey_attributes(span: ReadableSpan) -> dict[str, Any]:
    return {k: v for k, v in (span.attributes or {}).items() if k.startswith("passkey.")}
