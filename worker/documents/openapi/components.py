"""The ``components`` of the OpenAPI document: the security scheme, the shared header and
parameters, and the bodies' schemas with this front-end's field limits and ``url`` form."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter

from worker.api.bodies import ApiReadiness
from worker.api.reading import ACCOUNT_ID_RULE
from worker.api.webhooks.quotas import EndpointLimits
from worker.api.webhooks.routes import ENDPOINT_ID_RULE
from worker.api.webhooks.urls import url_pattern
from worker.contract.messages import Identifier
from worker.documents.openapi.parts import REF, Ref, header, param
from worker.documents.openapi.portal import PORTAL_SCHEME
from worker.webhooks.targets import TargetPolicy


def _models(node: Any) -> list[type[BaseModel]]:
    """The models the ``$ref``s under ``node`` point at."""
    if isinstance(node, Ref):
        return [node.model]
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    return [model for child in children for model in _models(child)]


def _component_schemas(paths: Any, limits: EndpointLimits, policy: TargetPolicy) -> Any:
    """The JSON Schemas of the models ``paths`` point at (and of ``ApiReadiness``, the side
    door's readiness), nested models included, keyed by model name."""
    schemas: dict[str, Any] = {}
    models: set[type[BaseModel]] = {*_models(paths), ApiReadiness}
    for model in sorted(models, key=lambda m: m.__name__):
        schema = model.model_json_schema(ref_template=REF, mode="serialization")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for body in ("CreateEndpointBody", "UpdateEndpointBody"):
        _with_limits(schemas[body]["properties"], limits, policy)
    return dict(sorted(schemas.items()))


def _with_limits(props: dict[str, Any], limits: EndpointLimits, policy: TargetPolicy) -> None:
    """State what the handlers enforce in an endpoint body's schema: the form of ``url`` for
    ``policy`` (``worker.api.webhooks.urls``) and ``limits`` (inside ``anyOf`` if nullable)."""
    props["url"] |= {"format": "uri", "pattern": url_pattern(allow_http=policy.allow_http)}
    bounds = {
        "url": ("string", "maxLength", limits.url_max_chars),
        "description": ("string", "maxLength", limits.description_max_chars),
        "event_types": ("array", "maxItems", limits.event_types_max_items),
    }
    for name, (kind, keyword, value) in bounds.items():
        for branch in props[name].get("anyOf", [props[name]]):
            if branch.get("type") == kind:
                branch[keyword] = value


def components(paths: Any, limits: EndpointLimits, policy: TargetPolicy) -> dict[str, Any]:
    """The ``components`` for ``paths``, the bodies' schemas stating ``limits`` and ``policy``."""
    identifier = TypeAdapter(Identifier).json_schema()
    demo = "A demo account of the development stack (`make run`)"
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
            "X-Request-Id": header(
                identifier,
                "Diagnostic handle of the request, equal to the body's `request_id` (except on a"
                " kept answer replayed for an `Idempotency-Key`, whose body is the first"
                " answer's): the caller's `X-Request-Id` when valid, else `req_<32 hex>`.",
            )
        },
        "parameters": {
            "AccountId": param(
                "account_id",
                "path",
                f"The account's `data.id`; {ACCOUNT_ID_RULE} (the rule the worker applies to"
                " every identifier). It must belong to the key's workspace; an account of"
                " another workspace answers 404 like an unknown one.",
                # minLength is implied by the pattern; stated for generators that skip it.
                {**identifier, "minLength": 1},
                examples={"demo": {"summary": demo, "value": "acc_demo_1"}},
            ),
            "EndpointId": param(
                "endpoint_id",
                "path",
                f"The endpoint's `id` (`ep_...`); {ENDPOINT_ID_RULE}. An endpoint of another"
                " workspace answers 404 like an unknown one.",
                {**identifier, "minLength": 1},
            ),
            "RequestId": param(
                "X-Request-Id",
                "header",
                "Optional caller-chosen request id, echoed in `X-Request-Id` and `request_id`"
                " when it follows the account-id rule; any other value is replaced by a"
                " generated one.",
                {"type": "string"},
            ),
        },
        "schemas": _component_schemas(paths, limits, policy),
    }
