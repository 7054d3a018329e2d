"""The documents made from the code, above every package they describe: the OpenAPI and
AsyncAPI documents, the JSON Schema export (``python -m worker schemas``) and the flow diagram
(docs/architecture.md, "Where each concept lives in the code")."""

__all__ = [
    "asyncapi",
    "export",
    "flowchart",
    "openapi",
]
