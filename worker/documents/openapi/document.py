"""The OpenAPI 3.1 document of the front-end, assembled from one table per route group; the
route serving it at ``/openapi.json`` is wired into the front-end by ``worker/cli.py``."""

from __future__ import annotations

from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.api.webhooks.quotas import EndpointLimits
from worker.contract.catalogue import ServiceError
from worker.documents.openapi.accounts import account_paths
from worker.documents.openapi.components import components
from worker.documents.openapi.deliveries import delivery_paths
from worker.documents.openapi.endpoints import endpoint_paths
from worker.documents.openapi.parts import with_allow
from worker.documents.openapi.portal import portal_paths
from worker.documents.openapi.probes import probe_paths
from worker.documents.openapi.replays import replay_paths
from worker.documents.openapi.signing_secrets import signing_secret_paths
from worker.settings import Settings
from worker.webhooks.targets import TargetPolicy

OPENAPI_PATH: Final = "/openapi.json"
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


def openapi_document(
    limits: EndpointLimits | None = None, policy: TargetPolicy | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the front-end (deterministic: equal on every call), with
    ``limits`` and the webhook target ``policy`` (the settings' defaults unless given) in the
    endpoint bodies' schemas."""
    limits = limits or EndpointLimits.defaults()
    policy = policy or TargetPolicy()
    return {
        "openapi": "3.1.0",
        "info": _info(),
        "servers": [{"url": SERVER_URL}],
        "tags": [
            {"name": "auth", "description": "Account authorization flow."},
            {"name": "webhooks", "description": "Webhook endpoints of the key's workspace."},
            {"name": "portal", "description": "The webhook portal's sessions."},
            {"name": "cors", "description": "Browser preflights."},
            {
                "name": "operations",
                "description": "Probes (no API key; metrics are on the side door).",
            },
        ],
        "paths": with_allow(
            {
                **account_paths(),
                **endpoint_paths(limits, policy),
                **signing_secret_paths(),
                **delivery_paths(),
                **replay_paths(),
                **portal_paths(),
                **probe_paths(),
            }
        ),
        "components": components(limits, policy),
    }


def openapi_route(
    limits: EndpointLimits | None = None, policy: TargetPolicy | None = None
) -> Route:
    """``GET /openapi.json``: the document with this front-end's ``limits`` and target
    ``policy``, built once."""
    document = openapi_document(limits, policy)

    async def openapi_json(_: Request) -> Response:
        return JSONResponse(document)

    return Route(OPENAPI_PATH, openapi_json, methods=["GET"])


def document_routes(limits: EndpointLimits, policy: TargetPolicy) -> list[Route]:
    """The routes that serve the front-end's documents (``worker.api.app.DocumentRoutes``)."""
    return [openapi_route(limits, policy)]
