"""The OpenAPI 3.1 document, from one table per route group, with the event catalogue's route
and ``webhooks:`` (one per event type, as the route answers); served at ``/openapi.json``."""

from __future__ import annotations

from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.api.bodies import ApiHealth
from worker.api.event_types import EVENT_TYPES_PATH, EventTypesResponse
from worker.api.webhooks.quotas import EndpointLimits
from worker.contract.catalogue import ServiceError
from worker.documents.openapi.accounts import account_paths
from worker.documents.openapi.components import components
from worker.documents.openapi.deliveries import delivery_paths
from worker.documents.openapi.parts import (
    EXAMPLE_RID,
    JSON,
    KEY_CHECK,
    json_response,
    operation,
    path_item,
)
from worker.documents.openapi.portal import portal_paths
from worker.documents.openapi.webhooks import endpoint_paths
from worker.runtime.probes import PublicReadiness
from worker.settings import Settings
from worker.webhooks.event_types import EVENT_CATALOGUE, catalogue_document, envelope
from worker.webhooks.targets import TargetPolicy

SERVER_URL: Final = (
    f"http://{Settings.model_fields['api_host'].default}"
    f":{Settings.model_fields['api_port'].default}"
)


def _info() -> dict[str, Any]:
    not_allowed = ServiceError.of("method_not_allowed")
    not_found = ServiceError.of("not_found")
    return {
        "title": "Passkey auth-flow front-end",
        "version": "1.0.0",
        "description": (
            "Passkey confirmation, the authentication-state polling route and the"
            " webhook-endpoint management of the messaging gateway. Every response"
            " carries `X-Request-Id`; failures return"
            " `{request_id, error: {code, numeric_code, message}}`. Branch on `code` /"
            " `numeric_code`, never on `message`. Unknown routes answer 404"
            f" `{not_found.code}` ({not_found.numeric_code}); a method a route does not take"
            f" answers 405 `{not_allowed.code}` ({not_allowed.numeric_code}, a service"
            " extension) with `Allow`, before any API key check. `HEAD` is answered wherever"
            " `GET` is (the same statuses and headers, no body), `OPTIONS` on every route."
        ),
    }


_OUTCOMES: Final = {
    "2XX": "Delivered: any 2xx within the attempt's time-out.",
    "410": "Gone: the endpoint is disabled at once.",
    "default": "Failed: retried on the schedule (`Retry-After` honoured on 429 and 503), the"
    " account's later events held behind it.",
}


def event_type_paths() -> dict[str, Any]:
    """``GET /v1/event-types``."""
    example = {"request_id": EXAMPLE_RID, "data": catalogue_document()}
    return path_item(
        EVENT_TYPES_PATH,
        get=operation(
            "listEventTypes",
            "Every event type sent to webhook endpoints",
            "Each type with its description, the JSON Schema (2020-12) of its body and an"
            " example body, and the envelope every delivery carries (Standard Webhooks"
            " headers). The same for every workspace; generated from the models the events are"
            " built with, as is this document's `webhooks`.",
            KEY_CHECK,
            ok={"200": json_response("The event catalogue.", EventTypesResponse, example=example)},
        ),
    )


def webhooks_section() -> dict[str, Any]:
    """OpenAPI 3.1's ``webhooks``: what the service sends, by event type."""
    headers = [
        {"name": name, "in": "header", "required": True, "schema": {"type": "string"}, **spec}
        for name, spec in envelope()["headers"].items()
    ]
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
                "parameters": headers,
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": schema, "example": kind.example_body()}},
                },
                "responses": {k: {"description": v} for k, v in _OUTCOMES.items()},
            }
        }
    return section


_TAGS: Final = {
    "auth": "Account authorization flow.",
    "webhooks": "Webhook endpoints of the key's workspace.",
    "portal": "The webhook portal's sessions.",
    "cors": "Browser preflights.",
    "operations": "Probes (no API key; metrics are on the side door).",
}


def _probe(op_id: str, summary: str, model: Any, ok: str, failed: str) -> dict[str, Any]:
    """A probe of the public port: no API key."""
    responses = {"200": json_response(ok, model), "503": json_response(failed, model)}
    probe = {"operationId": op_id, "summary": summary, "tags": ["operations"], "security": []}
    return {"get": probe | {"responses": responses}}


def openapi_document(
    limits: EndpointLimits | None = None, policy: TargetPolicy | None = None
) -> dict[str, Any]:
    """The document (equal on every call), with ``limits`` and the webhook target ``policy``
    (the settings' defaults unless given) in the endpoint bodies' schemas."""
    limits = limits or EndpointLimits.defaults()
    policy = policy or TargetPolicy()
    paths = {
        **account_paths(),
        **endpoint_paths(limits, policy),
        **delivery_paths(),
        **portal_paths(),
        **event_type_paths(),
        "/healthz": _probe(
            "healthz",
            "Liveness: the process and its Kafka readers run",
            ApiHealth,
            "Alive.",
            "A Kafka reader died.",
        ),
        "/readyz": _probe(
            "readyz",
            "Readiness: reply consumer positioned and webhook registry caught up",
            PublicReadiness,
            "Ready.",
            "Not ready (why is on the operator's side door).",
        ),
    }
    return {
        "openapi": "3.1.0",
        "info": _info(),
        "servers": [{"url": SERVER_URL}],
        "tags": [{"name": name, "description": text} for name, text in _TAGS.items()],
        "paths": paths,
        "webhooks": webhooks_section(),
        "components": components(paths, limits, policy),
    }


def document_routes(limits: EndpointLimits, policy: TargetPolicy) -> list[Route]:
    """``worker.api.app.DocumentRoutes``: ``GET /openapi.json``, the document with this
    front-end's ``limits`` and target ``policy``, built once."""
    document = openapi_document(limits, policy)

    async def openapi_json(_: Request) -> Response:
        return JSONResponse(document)

    return [Route("/openapi.json", openapi_json, methods=["GET"])]
