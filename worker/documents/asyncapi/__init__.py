"""The AsyncAPI 3.0 document of the Kafka contract (``schemas/asyncapi.json``), for other teams'
tools. Payloads, addresses and groups come from the code, so a drift test catches any
disagreement; what the code does not name (roles, compaction, inline header names) is stated
once in this package and checked against the publishers (docs/architecture.md, "Topics and
messages")."""

__all__ = ["components", "document", "messages"]
