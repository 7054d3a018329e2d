"""The AsyncAPI 3.0 document of the Kafka contract (``schemas/asyncapi.json``): payloads,
addresses and groups from the code; what the code does not name (roles, header names) stated
once here and checked against the publishers (docs/architecture.md, "Topics and messages")."""

__all__ = ["components", "document", "messages"]
