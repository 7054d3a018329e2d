"""The worker process: the account flow, its decision, the executor and provider calls."""

__all__ = [
    "answers",
    "app",
    "commands",
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
