"""``python -m bench.traced ARGS``: ``python -m worker ARGS`` with every span recorded and
batched as for an exporter (the SDK's ``BatchSpanProcessor``), then dropped: what recording
costs a process, apart from any collector (bench/README.md, "Tracing"). ``python -m bench
--record-spans`` runs its ``python -m worker run`` contenders this way.

The product exports only what ``OTEL_*`` names; this exporter is the benchmark's, so it is set
up here, around the worker's own command line, and never in ``worker``."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from worker import cli
from worker.runtime import tracing


class DiscardingExporter(SpanExporter):
    """Takes every batch and drops it; counts the spans."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def record_every_span() -> DiscardingExporter:
    """Make this process's ``tracing.configure`` add a batching processor over a
    ``DiscardingExporter`` (returned), so every span is recorded whatever ``OTEL_*`` says."""
    exporter = DiscardingExporter()
    configure = functools.partial(tracing.configure, processor=BatchSpanProcessor(exporter))
    tracing.configure = configure
    return exporter


def main(argv: Sequence[str] | None = None) -> int:
    record_every_span()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
