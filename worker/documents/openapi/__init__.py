"""The front-end's OpenAPI 3.1 document, generated from the code that answers (body schemas,
catalogued errors, the id rule, CORS, limits, ``Allow``): ``schemas/openapi.json``
(drift-tested), served at ``/openapi.json``, fuzzed against the live app."""

__all__ = ["accounts", "components", "deliveries", "document", "parts", "portal", "webhooks"]
