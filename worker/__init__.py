"""Passkey auth-flow worker, the product package (what the image ships). Three processes,
``auth/`` (the worker), ``api/`` (the front-end) and ``dispatcher/`` (the webhook dispatcher),
run on ``engine/`` (the consume loop, offsets, stores, Kafka), ``contract/`` (the wire),
``runtime/`` (signals, probes, metrics, logs, tracing) and ``webhooks/`` (the webhook library
the front-end and the dispatcher share); ``cli.py`` starts them. The map: docs/architecture.md,
"Where each concept lives in the code"."""

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "api",
    "auth",
    "cli",
    "contract",
    "dispatcher",
    "dlq",
    "documents",
    "engine",
    "preflight",
    "runtime",
    "settings",
    "startup",
    "webhooks",
]
