"""Passkey auth-flow worker, the product package: the worker, the front-end and the webhook
dispatcher (docs/architecture.md, "Where each concept lives in the code")."""

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
