"""The worker process: the account flow, its decision, the executor and provider calls."""

__all__ = [
    "app",
    "execute",
    "flow",
    "instrumentation",
    "machine",
    "metrics",
    "provider",
    "publish",
    "store",
    "waits",
]
