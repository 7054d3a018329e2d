"""Where a process's spans go: the ``OTEL_*`` variables read into export targets and their span
processors (docs/operations.md, "Tracing"); ``worker.runtime.tracing`` sets them up."""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)

__all__ = ["export_targets", "processor_for"]


def _otlp_endpoint(environ: Mapping[str, str]) -> str:
    """The URL the OTLP/HTTP exporter posts to, as the exporter itself resolves it."""
    explicit = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if explicit:
        return explicit
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


def export_targets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Where spans go under ``environ``; empty when nothing is exported. Unlike the SDK's
    auto-configuration, an unset ``OTEL_TRACES_EXPORTER`` means "OTLP only if an endpoint is
    set": a service without a collector must not retry localhost:4318 forever."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    targets: list[str] = []
    raw = env.get("OTEL_TRACES_EXPORTER")
    if raw is None:
        endpoint_set = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        names = ["otlp"] if endpoint_set else []
    else:
        names = [n.strip().lower() for n in raw.split(",") if n.strip()]
        if "none" in names:
            names = []
    for name in names:
        if name == "otlp":
            protocol = (
                env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            )
            if protocol != "http/protobuf":
                raise ValueError(
                    f"OTLP protocol {protocol!r} is not installed; use http/protobuf (port 4318)"
                )
            targets.append(f"otlp {_otlp_endpoint(env)}")
        elif name == "console":
            targets.append("console (stdout)")
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: use otlp, console or none")
    return tuple(targets)


def processor_for(target: str) -> SpanProcessor:
    """The span processor that sends to ``target`` (one of ``export_targets``)."""
    exporter: SpanExporter
    if target.startswith("otlp "):
        # Imported here: the exporter pulls in protobuf and requests, which a process that
        # exports nothing never needs.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers, timeout, TLS: OTEL_EXPORTER_OTLP_*
    else:
        exporter = ConsoleSpanExporter()
    return BatchSpanProcessor(exporter)  # queue and batch sizes: OTEL_BSP_*
