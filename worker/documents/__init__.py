"""The documents made from the code (OpenAPI, AsyncAPI, the JSON Schema export, the flow diagram),
above every package they describe."""

__all__ = [
    "asyncapi",
    "export",
    "flowchart",
    "openapi",
]
