"""``bench.traced``: the benchmark's exporter records every span, batched, and drops it; the
product's tracing knows nothing of it."""

from __future__ import annotations

import pytest
from opentelemetry.trace import SpanKind

from bench.traced import record_every_span
from worker.runtime import tracing


def test_every_span_is_recorded_and_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "configure", tracing.configure)  # undone after the test
    exporter = record_every_span()
    setup = tracing.configure("bench", environ={}, set_global=False)
    try:
        assert setup.recording and setup.targets == ("in-process BatchSpanProcessor",)
        with tracing.span("process", kind=SpanKind.CONSUMER):
            pass
        assert setup.provider.force_flush()
    finally:
        tracing.reset()
    assert exporter.spans == 1
