"""What every process runs on: signals, the event loop, probes, metrics, logs, tracing."""

__all__ = [
    "admission",
    "early_stop",
    "eventloop",
    "http1",
    "logs",
    "metrics",
    "probes",
    "process",
    "retry_after",
    "serving",
    "shutdown",
    "signed",
    "trace_export",
    "tracing",
]
