"""The HTTP front-end: the contract's passkey-confirm and polling routes, and the webhook
endpoint routes, over Kafka (docs/api.md; docs/architecture.md, "The front-end", which lists
the modules)."""

__all__ = [
    "app",
    "bodies",
    "cors",
    "credentials",
    "event_types",
    "idempotency",
    "ids",
    "keyfile",
    "keys",
    "keys_cli",
    "long_poll",
    "methods",
    "metrics",
    "middleware",
    "portal",
    "presence",
    "protocol",
    "reading",
    "replies",
    "request_rate",
    "routes",
    "server",
    "webhooks",
]
