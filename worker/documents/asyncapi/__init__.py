"""The AsyncAPI 3.0 document of the Kafka contract (``schemas/asyncapi.json``); what the code does
not name (roles, header names) is stated once here and checked against the publishers."""

__all__ = ["components", "document", "messages"]
