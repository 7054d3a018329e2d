"""The OpenAPI table of the event catalogue's route, and the document's ``webhooks:`` section:
one operation per event type of ``worker.webhooks.event_types``, with the body's schema and
example and the Standard Webhooks headers, the same the route answers."""

from __future__ import annotations

from typing import Any

from worker.api.event_types import EVENT_TYPES_PATH, EventTypesResponse
from worker.documents.openapi.parts import (
    EXAMPLE_RID,
    JSON,
    KEY_CHECK,
    error_responses,
    header,
    json_response,
    preflight,
)
from worker.webhooks.event_types import EVENT_CATALOGUE, catalogue_document, envelope


def event_type_paths() -> dict[str, Any]:
    """``GET /v1/event-types``."""
    example = {"request_id": EXAMPLE_RID, "data": catalogue_document()}
    return {
        EVENT_TYPES_PATH: {
            "get": {
                "operationId": "listEventTypes",
                "summary": "Every event type sent to webhook endpoints",
                "description": (
                    "Each type with its description, the JSON Schema (2020-12) of its body and"
                    " an example body, and the envelope every delivery carries (Standard"
                    " Webhooks headers). The same for every workspace; generated from the"
                    " models the events are built with, as is this document's `webhooks`."
                ),
                "tags": ["webhooks"],
                "security": [{"ApiKey": []}],
                "parameters": [{"$ref": "#/components/parameters/RequestId"}],
                "responses": {
                    "200": json_response(
                        "The event catalogue.", EventTypesResponse, example=example
                    ),
                    **error_responses(KEY_CHECK),
                },
            },
            "options": preflight("preflightEventTypes"),
        },
    }


def webhooks_section() -> dict[str, Any]:
    """OpenAPI 3.1's ``webhooks``: what the service sends, by event type."""
    headers = {
        name: header({"type": "string"}, spec["description"]) | {"example": spec["example"]}
        for name, spec in envelope()["headers"].items()
    }
    section: dict[str, Any] = {}
    for kind in EVENT_CATALOGUE:
        schema = kind.body_schema()
        schema.pop("$schema", None)
        section[kind.name] = {
            "post": {
                "operationId": "webhook_" + kind.name.replace(".", "_"),
                "summary": kind.name,
                "description": kind.description,
                "tags": ["webhooks"],
                "parameters": [
                    {"name": name, "in": "header", **spec} for name, spec in headers.items()
                ],
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": schema, "example": kind.example_body()}},
                },
                "responses": {
                    "2XX": {"description": "Delivered: any 2xx within the attempt's time-out."},
                    "410": {"description": "Gone: the endpoint is disabled at once."},
                    "default": {
                        "description": "Failed: retried on the schedule (`Retry-After` honoured"
                        " on 429 and 503), the account's later events held behind it."
                    },
                },
            }
        }
    return section
