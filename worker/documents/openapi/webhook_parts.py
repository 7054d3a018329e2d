"""What the OpenAPI tables of the webhook routes share: the operation's frame, the failures of
every webhook route, and the links from an endpoint to each operation on it."""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel

from worker.api.webhooks.bodies import EndpointResponse
from worker.documents.openapi.parts import (
    BODY_TIMEOUT,
    KEY_CHECK,
    Failure,
    error_responses,
    json_response,
)

_WEBHOOK_NOT_FOUND: Final = Failure(
    "not_found",
    "The endpoint does not exist in the key's workspace (unknown, deleted or another"
    " workspace's: the answers are the same), or the route does not exist.",
)
_NOT_CONFIGURED: Final = (
    "the service is not configured for webhooks, or the endpoints could not be read or"
    " written in time; {extra}"
)

#: The 400 of a route on one endpoint that reads no body.
OPTIONAL_BODY: Final = "Malformed `endpoint_id`, or a body that is not empty or a JSON object."
#: The success of a route that shows a signing secret.
WITH_SECRET: Final = "The endpoint and its signing secret (`whsec_...`): store it now."


def secret_response(description: str, model: type[BaseModel]) -> dict[str, Any]:
    """The success of a route that shows a signing secret: never stored by a cache."""
    response = endpoint_links(json_response(description, model))
    response["headers"] = {
        **response["headers"],
        "Cache-Control": {
            "required": True,
            "schema": {"type": "string", "const": "no-store"},
            "description": "The answer carries a signing secret: never cached.",
        },
    }
    return response


def webhook_failures(
    failure: str, *, bad_request: str | None, not_found: bool = True, extra: str = ""
) -> tuple[Failure, ...]:
    """What a webhook route can answer besides success: its 400 (when it reads input), 401,
    404 (routes on one endpoint) and its one catalogued 500."""
    when = _NOT_CONFIGURED.format(extra=extra or "nothing was changed.")
    return (
        *((Failure("invalid_request", bad_request),) if bad_request else ()),
        *KEY_CHECK,
        *((_WEBHOOK_NOT_FOUND,) if not_found else ()),
        Failure(failure, when[0].upper() + when[1:]),
    )


def webhook_operation(
    operation_id: str,
    summary: str,
    description: str,
    *,
    one_endpoint: bool,
    ok_status: str,
    ok: dict[str, Any],
    failures: tuple[Failure, ...],
    body: dict[str, Any] | None = None,
    portal: bool = False,
) -> dict[str, Any]:
    """One webhook operation; ``portal``: a portal session token may call it too
    (``worker.api.portal.tokens.PORTAL_SCOPE``)."""
    parameters = [
        *(({"$ref": "#/components/parameters/EndpointId"},) if one_endpoint else ()),
        {"$ref": "#/components/parameters/RequestId"},
    ]
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "description": description,
        "tags": ["webhooks"],
        "security": [{"ApiKey": []}, *([{"PortalSession": []}] if portal else [])],
        "parameters": parameters,
    }
    if body is not None:
        operation["requestBody"] = body
        failures = (*failures, BODY_TIMEOUT)
    operation["responses"] = {ok_status: ok, **error_responses(failures)}
    return operation


#: The operations on one endpoint, by the name of the link that leads to each.
_ENDPOINT_LINKS: Final = {
    "GetWebhookEndpoint": "getWebhookEndpoint",
    "UpdateWebhookEndpoint": "updateWebhookEndpoint",
    "DeleteWebhookEndpoint": "deleteWebhookEndpoint",
    "DeactivateWebhookEndpoint": "deactivateWebhookEndpoint",
    "ActivateWebhookEndpoint": "activateWebhookEndpoint",
    "RotateWebhookEndpointSecret": "rotateWebhookEndpointSecret",
    "ExpirePreviousWebhookEndpointSecret": "expirePreviousWebhookEndpointSecret",
    "ListWebhookDeliveries": "listWebhookDeliveries",
    "ReplayWebhookEvents": "replayWebhookEvents",
    "SendWebhookTest": "sendWebhookTest",
}


def endpoint_links(response: dict[str, Any]) -> dict[str, Any]:
    """``response`` (one endpoint in ``data``) with OpenAPI links to every operation on that
    endpoint: what a client, or a stateful fuzzer, calls next with its ``data.id``."""
    links = {
        name: {
            "operationId": operation_id,
            "parameters": {"endpoint_id": "$response.body#/data/id"},
        }
        for name, operation_id in _ENDPOINT_LINKS.items()
    }
    return {**response, "links": links}


def endpoint_answer() -> dict[str, Any]:
    """The success of a route that answers the endpoint without its secret."""
    return endpoint_links(json_response("The endpoint.", EndpointResponse))
