"""The ``components`` of the OpenAPI document: the security scheme, the shared header and
parameters, and the bodies' schemas with this front-end's field limits and ``url`` form."""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, TypeAdapter

from worker.api.bodies import (
    ApiHealth,
    ApiReadiness,
    AuthResponse,
    AuthStateResponse,
    ErrorResponse,
)
from worker.api.event_types import EventTypesResponse
from worker.api.portal.sessions import PortalSessionBody, PortalSessionResponse
from worker.api.reading import ACCOUNT_ID_RULE
from worker.api.webhooks.bodies import (
    CreateEndpointBody,
    EndpointListResponse,
    EndpointResponse,
    EndpointSecretResponse,
    ReplayAcceptedResponse,
    ReplayBody,
    UpdateEndpointBody,
)
from worker.api.webhooks.delivery_bodies import (
    DeliveryDetailResponse,
    DeliveryPageResponse,
    QueuedResponse,
    TestSendBody,
)
from worker.api.webhooks.follow_bodies import AccountEventsResponse, ReplayStatusResponse
from worker.api.webhooks.quotas import EndpointLimits
from worker.api.webhooks.routes import ENDPOINT_ID_RULE
from worker.api.webhooks.urls import url_pattern
from worker.contract.messages import Identifier
from worker.documents.openapi.parts import REF
from worker.documents.openapi.portal import PORTAL_SCHEME
from worker.runtime.probes import PublicReadiness
from worker.webhooks.targets import TargetPolicy

_COMPONENT_MODELS: Final[tuple[type[BaseModel], ...]] = (
    AuthResponse,
    AuthStateResponse,
    ErrorResponse,
    ApiHealth,
    ApiReadiness,
    PublicReadiness,
    CreateEndpointBody,
    UpdateEndpointBody,
    ReplayBody,
    EndpointResponse,
    EndpointSecretResponse,
    EndpointListResponse,
    DeliveryPageResponse,
    DeliveryDetailResponse,
    QueuedResponse,
    TestSendBody,
    ReplayAcceptedResponse,
    PortalSessionBody,
    PortalSessionResponse,
    EventTypesResponse,
    ReplayStatusResponse,
    AccountEventsResponse,
)


def _component_schemas(limits: EndpointLimits, policy: TargetPolicy) -> dict[str, Any]:
    """The models' JSON Schemas, nested models included, keyed by model name."""
    schemas: dict[str, Any] = {}
    for model in _COMPONENT_MODELS:
        schema = model.model_json_schema(ref_template=REF, mode="serialization")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for body in (CreateEndpointBody, UpdateEndpointBody):
        with_limits(schemas[body.__name__], limits)
        with_url_form(schemas[body.__name__], policy)
    return dict(sorted(schemas.items()))


def with_url_form(schema: dict[str, Any], policy: TargetPolicy) -> None:
    """State the form of ``url`` the handlers enforce (``worker.api.webhooks.urls``) in an
    endpoint body's schema: ``format: uri`` and the ``pattern`` for ``policy``."""
    prop = schema["properties"]["url"]
    prop["format"] = "uri"
    prop["pattern"] = url_pattern(allow_http=policy.allow_http)


def with_limits(schema: dict[str, Any], limits: EndpointLimits) -> None:
    """State ``limits`` in an endpoint body's schema: ``maxLength`` on the string of ``url``
    and ``description``, ``maxItems`` on the array of ``event_types`` (inside ``anyOf`` where
    the field is nullable)."""
    bounds = {
        "url": ("string", "maxLength", limits.url_max_chars),
        "description": ("string", "maxLength", limits.description_max_chars),
        "event_types": ("array", "maxItems", limits.event_types_max_items),
    }
    for name, (kind, keyword, value) in bounds.items():
        prop = schema["properties"][name]
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") == kind:
                branch[keyword] = value


def components(limits: EndpointLimits, policy: TargetPolicy) -> dict[str, Any]:
    """The document's ``components``, the bodies' schemas stating ``limits`` and ``policy``."""
    identifier = TypeAdapter(Identifier).json_schema()
    return {
        "securitySchemes": {
            "ApiKey": {
                "type": "apiKey",
                "in": "header",
                "name": "X-Api-Key",
                "description": "Server-side workspace API key; selects the workspace.",
            },
            "PortalSession": PORTAL_SCHEME,
        },
        "headers": {
            "X-Request-Id": {
                "description": (
                    "Diagnostic handle of the request, equal to the body's `request_id`"
                    " (except on a kept answer replayed for an `Idempotency-Key`, whose body"
                    " is the first answer's): the caller's `X-Request-Id` when valid, else"
                    " `req_<32 hex>`."
                ),
                "required": True,
                "schema": identifier,
            }
        },
        "parameters": {
            "AccountId": {
                "name": "account_id",
                "in": "path",
                "required": True,
                "description": (
                    f"The account's `data.id`; {ACCOUNT_ID_RULE} (the rule the worker"
                    " applies to every identifier). It must belong to the key's workspace;"
                    " an account of another workspace answers 404 like an unknown one."
                ),
                # minLength is implied by the pattern; stated for generators that skip it.
                "schema": {**identifier, "minLength": 1},
                "examples": {
                    "demo": {
                        "summary": "A demo account of the development stack (`make run`)",
                        "value": "acc_demo_1",
                    }
                },
            },
            "EndpointId": {
                "name": "endpoint_id",
                "in": "path",
                "required": True,
                "description": (
                    f"The endpoint's `id` (`ep_...`); {ENDPOINT_ID_RULE}. An endpoint of"
                    " another workspace answers 404 like an unknown one."
                ),
                "schema": {**identifier, "minLength": 1},
            },
            "RequestId": {
                "name": "X-Request-Id",
                "in": "header",
                "required": False,
                "description": (
                    "Optional caller-chosen request id, echoed in `X-Request-Id` and"
                    " `request_id` when it follows the account-id rule; any other value is"
                    " replaced by a generated one."
                ),
                "schema": {"type": "string"},
            },
        },
        "schemas": _component_schemas(limits, policy),
    }
