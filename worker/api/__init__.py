"""The HTTP front-end: the contract's passkey-confirm and polling routes, and the webhook
endpoint routes, over Kafka (docs/api.md; docs/architecture.md, "The front-end", which lists
the modules)."""
