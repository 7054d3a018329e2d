"""The front-end's OpenAPI 3.1 document, generated from the code that answers:
``schemas/openapi.json`` (drift-tested), served at ``/openapi.json``, fuzzed against the app."""

__all__ = ["accounts", "components", "deliveries", "document", "parts", "portal", "webhooks"]
