"""The front-end's OpenAPI 3.1 document, generated from the code that answers: body schemas,
catalogued errors, the id rule, CORS, limits and ``Allow`` are the handlers' own, so it holds
no second copy. Exported as ``schemas/openapi.json`` (drift-tested), served at
``/openapi.json``, fuzzed against the live app. ``document.py`` assembles one table per route
group."""

__all__ = ["accounts", "components", "deliveries", "document", "parts", "portal", "webhooks"]
