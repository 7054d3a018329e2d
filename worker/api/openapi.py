"""The front-end's OpenAPI 3.1 document, generated from the code that answers: body schemas,
catalogued errors, the id rule, CORS, limits and ``Allow`` are the handlers' own, so it holds
no second copy. Exported as ``schemas/openapi.json`` (drift-tested), served at
``/openapi.json``, fuzzed against the live app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, TypeAdapter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.api.bodies import ApiHealth, ApiReadiness, AuthResponse, ErrorResponse
from worker.api.cors import ALLOW_HEADERS, ALLOW_METHODS, CORS_HEADERS, CORS_MAX_AGE_S, CORS_METHODS
from worker.api.methods import allow_value
from worker.api.routes import ACCOUNT_AUTH, ACCOUNT_ID_RULE, MAX_BODY_BYTES, PASSKEY_CONFIRM
from worker.api.webhooks.bodies import (
    CreateEndpointBody,
    DeliveryListResponse,
    EndpointListResponse,
    EndpointResponse,
    EndpointSecretResponse,
    ReplayAcceptedResponse,
    ReplayBody,
    UpdateEndpointBody,
)
from worker.api.webhooks.quotas import ENDPOINT_QUOTA, TOO_MANY, EndpointLimits
from worker.api.webhooks.routes import (
    ENDPOINT_ID_RULE,
    WEBHOOK_ACTIVATE,
    WEBHOOK_DEACTIVATE,
    WEBHOOK_DELIVERIES,
    WEBHOOK_ENDPOINT,
    WEBHOOK_ENDPOINTS,
    WEBHOOK_EXPIRE_PREVIOUS,
    WEBHOOK_REPLAY,
    WEBHOOK_ROTATE,
)
from worker.api.webhooks.urls import url_pattern, url_rule_text
from worker.contract.catalogue import ServiceError, by_numeric, entry
from worker.contract.messages import AuthData, Identifier
from worker.settings import Settings
from worker.webhooks.targets import TargetPolicy

OPENAPI_PATH: Final = "/openapi.json"
SERVER_URL: Final = (
    f"http://{Settings.model_fields['api_host'].default}"
    f":{Settings.model_fields['api_port'].default}"
)

_JSON: Final = "application/json"
_REF: Final = "#/components/schemas/{model}"
_RID_HEADER: Final = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}
_EXAMPLE_RID: Final = "req_5f0c8a6e0b6b4c1f9d3f3f8b2a9c1d7e"
_COMPONENT_MODELS: Final[tuple[type[BaseModel], ...]] = (
    AuthResponse,
    ErrorResponse,
    ApiHealth,
    ApiReadiness,
    CreateEndpointBody,
    UpdateEndpointBody,
    ReplayBody,
    EndpointResponse,
    EndpointSecretResponse,
    EndpointListResponse,
    DeliveryListResponse,
    ReplayAcceptedResponse,
)


@dataclass(frozen=True, slots=True)
class Failure:
    """A catalogued error an operation can answer; ``when`` replaces the catalogue's condition
    where the route says more, ``refined`` lists provider-detail numeric codes it can carry."""

    code: str
    when: str | None = None
    refined: tuple[int, ...] = ()

    @property
    def error(self) -> ServiceError:
        return ServiceError.of(self.code)

    def describe(self) -> str:
        err = self.error
        numeric = str(err.numeric_code) + "".join(
            f", or {n} when refined: {detail.condition.rstrip('.')}"
            for n in self.refined
            for detail in by_numeric(n)
        )
        return f"`{err.code}` ({numeric}): {self.when or entry(err.code).condition}"


# What every operation with an API key can answer at the key check: 401, and the workspace's
# rate limit (429, a service extension).
_KEY_CHECK: Final = (
    Failure("missing_api_key"),
    Failure("invalid_api_key"),
    Failure("rate_limited"),
)
# Operations that read a body: the body's deadline (408, a service extension).
_BODY_TIMEOUT: Final = Failure("request_timeout")
_NOT_FOUND: Final = Failure(
    "not_found",
    "The account does not exist in the key's workspace (unknown, deregistered or another"
    " workspace's), or the route does not exist.",
)
_CONFIRM_FAILURES: Final = (
    Failure("invalid_request", "Malformed `account_id` or body."),
    Failure("provider_invalid_request"),
    *_KEY_CHECK,
    _NOT_FOUND,
    Failure("account_already_authorized"),
    Failure("provider_not_ready", "The status is before the challenge, or `failed`."),
    Failure("account_binding_not_found"),
    Failure("provider_account_mismatch"),
    Failure(
        "run_auth_action_failed",
        "Unexpected failure or no outcome in time; check the account's state before retrying.",
    ),
    Failure("unsupported_by_provider", "The account's provider has no Passkey confirmation."),
    Failure("provider_unavailable", refined=(30010,)),
    Failure("provider_adapter_not_found"),
    _BODY_TIMEOUT,
)
_AUTH_FAILURES: Final = (
    Failure("invalid_request", "Malformed `account_id`."),
    *_KEY_CHECK,
    _NOT_FOUND,
    Failure(
        "get_auth_state_failed",
        "No worker answered within `API_REPLY_TIMEOUT_S` (or the front-end is starting);"
        " nothing was changed: retry shortly.",
    ),
)
_PREFLIGHT_FAILURES: Final = (
    Failure("cors_forbidden"),
    Failure("not_found", "The route does not exist (e.g. a path parameter holding `/`)."),
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


def _webhook_failures(
    failure: str, *, bad_request: str | None, not_found: bool = True, extra: str = ""
) -> tuple[Failure, ...]:
    """What a webhook route can answer besides success: its 400 (when it reads input), 401,
    404 (routes on one endpoint) and its one catalogued 500."""
    when = _NOT_CONFIGURED.format(extra=extra or "nothing was changed.")
    return (
        *((Failure("invalid_request", bad_request),) if bad_request else ()),
        *_KEY_CHECK,
        *((_WEBHOOK_NOT_FOUND,) if not_found else ()),
        Failure(failure, when[0].upper() + when[1:]),
    )


_OPTIONAL_BODY: Final = "Malformed `endpoint_id`, or a body that is not empty or a JSON object."


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _component_schemas(limits: EndpointLimits, policy: TargetPolicy) -> dict[str, Any]:
    """The models' JSON Schemas, nested models included, keyed by model name."""
    schemas: dict[str, Any] = {}
    for model in _COMPONENT_MODELS:
        schema = model.model_json_schema(ref_template=_REF, mode="serialization")
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


def _json_response(description: str, model: type[BaseModel], **content: Any) -> dict[str, Any]:
    return {
        "description": description,
        "headers": dict(_RID_HEADER),
        "content": {_JSON: {"schema": _ref(model), **content}},
    }


def _error_example(err: ServiceError, summary: str) -> dict[str, Any]:
    return {"summary": summary, "value": ErrorResponse.of(_EXAMPLE_RID, err).model_dump()}


def _error_responses(failures: tuple[Failure, ...]) -> dict[str, dict[str, Any]]:
    """One response per catalogued status, with an example per code (and refinement)."""
    by_status: dict[int, list[Failure]] = {}
    for failure in failures:
        by_status.setdefault(failure.error.http_status, []).append(failure)
    responses = {}
    for status, group in sorted(by_status.items()):
        examples: dict[str, Any] = {}
        for failure in group:
            err = failure.error
            examples[err.code] = _error_example(err, f"{err.code} ({err.numeric_code})")
            for numeric in failure.refined:
                examples[f"{err.code}_{numeric}"] = _error_example(
                    err.refine(numeric), f"{err.code} refined to {numeric}"
                )
        description = "\n".join(f"* {failure.describe()}" for failure in group)
        response = _json_response(description, ErrorResponse, examples=examples)
        if status == 429:
            response["headers"]["Retry-After"] = _header(
                {"type": "integer", "minimum": 1}, "Seconds to wait before retrying."
            )
        responses[str(status)] = response
    return responses


def _auth_ok(description: str) -> dict[str, Any]:
    example = AuthResponse(
        request_id=_EXAMPLE_RID,
        data=AuthData(
            account_id="acc_demo_1",
            status="passkey_confirmation_sent",
            auth_status="passkey_confirmation_sent",
        ),
    )
    return _json_response(description, AuthResponse, example=example.model_dump())


def _header(schema: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    header: dict[str, Any] = {"required": True, "schema": schema}
    if description is not None:
        header["description"] = description
    return header


def _preflight(operation_id: str, parameter: str | None = None) -> dict[str, Any]:
    """``OPTIONS`` on an API route: a CORS preflight when ``Origin`` and
    ``Access-Control-Request-Method`` are both sent, else the route's methods (``Allow``).
    ``parameter`` names the route's path parameter, which ``OPTIONS`` does not check."""
    methods = ", ".join(f"`{m}`" for m in CORS_METHODS)
    headers = ", ".join(f"`{h}`" for h in CORS_HEADERS)
    path_parameters = (
        ()
        if parameter is None
        else (
            {
                "name": parameter,
                "in": "path",
                "required": True,
                "description": "Not checked: `OPTIONS` answers for the route whatever its value.",
                "schema": {"type": "string", "minLength": 1},
            },
        )
    )
    return {
        "operationId": operation_id,
        "summary": "CORS preflight, or the route's methods",
        "description": (
            "With `Origin` and `Access-Control-Request-Method`, a CORS preflight for browsers."
            f" Allowed: origins in `API_CORS_ORIGINS` (exact match, `*` for any), methods"
            f" {methods}, request headers {headers}. Without either header, a plain `OPTIONS`"
            " (RFC 9110): 204 with the route's methods in `Allow` and no CORS headers. No API"
            " key is needed."
        ),
        "tags": ["cors"],
        "security": [],
        "parameters": [
            *path_parameters,
            *(
                {"name": name, "in": "header", "required": False, "schema": {"type": "string"}}
                for name in (
                    "Origin",
                    "Access-Control-Request-Method",
                    "Access-Control-Request-Headers",
                )
            ),
        ],
        "responses": {
            "204": {
                "description": (
                    "A preflight allowed (with the `Access-Control-Allow-*` headers), or a plain"
                    " `OPTIONS` (without them); no body either way."
                ),
                "headers": {
                    **_RID_HEADER,
                    # The route's methods: set by ``_with_allow`` from the path item.
                    "Allow": _header({"type": "string"}, "The methods the route takes."),
                    "Access-Control-Allow-Origin": _optional_header(
                        {"type": "string"}, "The request's Origin (a preflight allowed)."
                    ),
                    "Access-Control-Allow-Methods": _optional_header(
                        {"type": "string", "const": ALLOW_METHODS}
                    ),
                    "Access-Control-Allow-Headers": _optional_header(
                        {"type": "string", "const": ALLOW_HEADERS}
                    ),
                    "Access-Control-Max-Age": _optional_header(
                        {"type": "string", "const": str(CORS_MAX_AGE_S)}, "Seconds."
                    ),
                },
            },
            **_error_responses(_PREFLIGHT_FAILURES),
        },
    }


def _optional_header(schema: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    return {**_header(schema, description), "required": False}


def _with_allow(paths: dict[str, Any]) -> dict[str, Any]:
    """Each ``OPTIONS`` operation's ``Allow``, stated from its path item: what the front door
    answers (``worker.api.methods.allow_value``, HEAD beside GET, OPTIONS everywhere)."""
    for item in paths.values():
        if "options" in item:
            allow = allow_value(method.upper() for method in item)
            headers = item["options"]["responses"]["204"]["headers"]
            headers["Allow"]["schema"] = {"type": "string", "const": allow}
    return paths


def _probe(
    operation_id: str, summary: str, model: type[BaseModel], ok: str, failed: str
) -> dict[str, Any]:
    return {
        "get": {
            "operationId": operation_id,
            "summary": summary,
            "tags": ["operations"],
            "security": [],
            "responses": {
                "200": _json_response(ok, model),
                "503": _json_response(failed, model),
            },
        }
    }


def _json_body(model: type[BaseModel], description: str, *, required: bool) -> dict[str, Any]:
    return {
        "required": required,
        "description": description,
        "content": {_JSON: {"schema": _ref(model)}},
    }


_EMPTY_BODY: Final = {
    "required": False,
    "description": f"Optional; ignored when it is a JSON object of at most {MAX_BODY_BYTES} bytes.",
    "content": {_JSON: {"schema": {"type": "object"}}},
}


def _webhook_operation(
    operation_id: str,
    summary: str,
    description: str,
    *,
    one_endpoint: bool,
    ok_status: str,
    ok: dict[str, Any],
    failures: tuple[Failure, ...],
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    parameters = [
        *(({"$ref": "#/components/parameters/EndpointId"},) if one_endpoint else ()),
        {"$ref": "#/components/parameters/RequestId"},
    ]
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "description": description,
        "tags": ["webhooks"],
        "security": [{"ApiKey": []}],
        "parameters": parameters,
    }
    if body is not None:
        operation["requestBody"] = body
        failures = (*failures, _BODY_TIMEOUT)
    operation["responses"] = {ok_status: ok, **_error_responses(failures)}
    return operation


_ENDPOINT_QUOTA: Final = Settings.model_fields["webhook_endpoints_per_workspace"].default
_REPLAY_QUOTA: Final = Settings.model_fields["webhook_replays_per_workspace"].default


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
}


def _endpoint_links(response: dict[str, Any]) -> dict[str, Any]:
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


def _webhook_paths(limits: EndpointLimits, policy: TargetPolicy) -> dict[str, Any]:
    """The webhook-endpoint management routes (``worker.api.webhooks.routes``)."""
    scheme = "`https` or `http`" if policy.allow_http else "`https`"
    url_rule = (
        f"`url` must be an absolute {scheme} URL (no user or password) of the form its"
        f" `pattern` states ({url_rule_text(allow_http=policy.allow_http)}), whose host is"
        + (
            " any address but an unspecified, multicast or broadcast one (this deployment"
            " allows private targets)."
            if policy.allow_private
            else " not a loopback, private, link-local or otherwise special address (checked"
            " again, on every address the name resolves to, when delivering)."
        )
    )
    body_400 = (
        "The body is missing, not JSON, not an object, has unknown fields or invalid values"
        " (an unknown event type, a `url` that is not allowed: the message names the reason),"
        f" or a field over its limit (`url` {limits.url_max_chars} characters, `description`"
        f" {limits.description_max_chars}, `event_types` {limits.event_types_max_items} entries:"
        " the message names the field and the limit)."
    )
    endpoint = _endpoint_links(_json_response("The endpoint.", EndpointResponse))
    with_secret = "The endpoint and its signing secret (`whsec_...`): store it now."
    return {
        WEBHOOK_ENDPOINTS: {
            "post": _webhook_operation(
                "createWebhookEndpoint",
                "Create a webhook endpoint",
                f"{url_rule} Absent or `null` `event_types` subscribes to every event type."
                " The answer is the only time the signing secret is shown (until a rotation)."
                " A workspace has at most `WEBHOOK_ENDPOINTS_PER_WORKSPACE` endpoints (default"
                f" {_ENDPOINT_QUOTA}; deleted ones do not count).",
                one_endpoint=False,
                ok_status="201",
                ok=_endpoint_links(
                    _json_response(f"Created. {with_secret}", EndpointSecretResponse)
                ),
                failures=(
                    *_webhook_failures(
                        "create_webhook_endpoint_failed",
                        bad_request=body_400,
                        not_found=False,
                        extra="nothing was created.",
                    ),
                    Failure(
                        ENDPOINT_QUOTA,
                        "The workspace has `WEBHOOK_ENDPOINTS_PER_WORKSPACE` endpoints (default"
                        f" {_ENDPOINT_QUOTA}): delete one before creating another. Nothing was"
                        " created.",
                    ),
                ),
                body=_json_body(CreateEndpointBody, "The new endpoint.", required=True),
            ),
            "get": _webhook_operation(
                "listWebhookEndpoints",
                "List the workspace's webhook endpoints",
                "Oldest first; secrets are never listed.",
                one_endpoint=False,
                ok_status="200",
                ok=_json_response("The endpoints.", EndpointListResponse),
                failures=_webhook_failures(
                    "list_webhook_endpoints_failed", bad_request=None, not_found=False
                ),
            ),
            "options": _preflight("preflightWebhookEndpoints"),
        },
        WEBHOOK_ENDPOINT: {
            "get": _webhook_operation(
                "getWebhookEndpoint",
                "A webhook endpoint",
                "Its signing secret is not shown.",
                one_endpoint=True,
                ok_status="200",
                ok=endpoint,
                failures=_webhook_failures(
                    "get_webhook_endpoint_failed", bad_request="Malformed `endpoint_id`."
                ),
            ),
            "patch": _webhook_operation(
                "updateWebhookEndpoint",
                "Change a webhook endpoint",
                f"Send at least one of `url`, `event_types`, `description`. {url_rule}"
                " `event_types: null` subscribes to every event type; `description: null`"
                " clears it.",
                one_endpoint=True,
                ok_status="200",
                ok=endpoint,
                failures=_webhook_failures(
                    "update_webhook_endpoint_failed",
                    bad_request="Malformed `endpoint_id`; or: " + body_400 + " An empty object.",
                ),
                body=_json_body(UpdateEndpointBody, "The fields to change.", required=True),
            ),
            "delete": _webhook_operation(
                "deleteWebhookEndpoint",
                "Delete a webhook endpoint",
                "Deliveries to it stop; its id answers 404 from then on.",
                one_endpoint=True,
                ok_status="204",
                ok={"description": "Deleted; no body.", "headers": dict(_RID_HEADER)},
                failures=_webhook_failures(
                    "delete_webhook_endpoint_failed", bad_request=_OPTIONAL_BODY
                ),
                body=_EMPTY_BODY,
            ),
            "options": _preflight("preflightWebhookEndpoint", "endpoint_id"),
        },
        WEBHOOK_DEACTIVATE: {
            "post": _webhook_operation(
                "deactivateWebhookEndpoint",
                "Stop deliveries to an endpoint",
                "`status` becomes `inactive`; events that occur meanwhile are not delivered"
                " (replay them after activating).",
                one_endpoint=True,
                ok_status="200",
                ok=endpoint,
                failures=_webhook_failures(
                    "deactivate_webhook_endpoint_failed", bad_request=_OPTIONAL_BODY
                ),
                body=_EMPTY_BODY,
            ),
            "options": _preflight("preflightDeactivateWebhookEndpoint", "endpoint_id"),
        },
        WEBHOOK_ACTIVATE: {
            "post": _webhook_operation(
                "activateWebhookEndpoint",
                "Resume deliveries to an endpoint",
                "`status` becomes `active`, also after the dispatcher disabled it.",
                one_endpoint=True,
                ok_status="200",
                ok=endpoint,
                failures=_webhook_failures(
                    "update_webhook_endpoint_failed", bad_request=_OPTIONAL_BODY
                ),
                body=_EMPTY_BODY,
            ),
            "options": _preflight("preflightActivateWebhookEndpoint", "endpoint_id"),
        },
        WEBHOOK_ROTATE: {
            "post": _webhook_operation(
                "rotateWebhookEndpointSecret",
                "Rotate the signing secret",
                "A new secret signs every delivery from now on; the previous one keeps signing"
                " beside it (two `v1,` signatures) for `WEBHOOK_SECRET_OVERLAP_S` (default 24"
                " h), so receivers can switch without losing a delivery. Any older secret"
                " stops signing: at most two ever sign. `expire-previous-secret` ends the"
                " overlap early.",
                one_endpoint=True,
                ok_status="200",
                ok=_endpoint_links(
                    _json_response(f"Rotated. {with_secret}", EndpointSecretResponse)
                ),
                failures=_webhook_failures(
                    "update_webhook_endpoint_failed", bad_request=_OPTIONAL_BODY
                ),
                body=_EMPTY_BODY,
            ),
            "options": _preflight("preflightRotateWebhookEndpointSecret", "endpoint_id"),
        },
        WEBHOOK_EXPIRE_PREVIOUS: {
            "post": _webhook_operation(
                "expirePreviousWebhookEndpointSecret",
                "Stop the previous signing secret now",
                "Ends a rotation's overlap early: from now on only the current secret signs"
                " (one `v1,` signature). Call it once receivers verify with the new secret, or"
                " right after rotating a leaked one. Answers the endpoint (without a secret);"
                " nothing changes when only the current secret signs already.",
                one_endpoint=True,
                ok_status="200",
                ok=endpoint,
                failures=_webhook_failures(
                    "update_webhook_endpoint_failed", bad_request=_OPTIONAL_BODY
                ),
                body=_EMPTY_BODY,
            ),
            "options": _preflight("preflightExpirePreviousWebhookEndpointSecret", "endpoint_id"),
        },
        WEBHOOK_DELIVERIES: {
            "get": _webhook_operation(
                "listWebhookDeliveries",
                "Recent deliveries to an endpoint",
                "The latest state of each of the endpoint's most recent deliveries (up to 100),"
                " most recently changed first.",
                one_endpoint=True,
                ok_status="200",
                ok=_json_response("The deliveries.", DeliveryListResponse),
                failures=(
                    *_webhook_failures(
                        "get_webhook_endpoint_failed", bad_request="Malformed `endpoint_id`."
                    ),
                    Failure(
                        TOO_MANY,
                        "A deliveries request of the same workspace is still being answered on"
                        " this front-end (one at a time per workspace); retry after"
                        " `Retry-After` seconds.",
                    ),
                ),
            ),
            "options": _preflight("preflightWebhookDeliveries", "endpoint_id"),
        },
        WEBHOOK_REPLAY: {
            "post": _webhook_operation(
                "replayWebhookEvents",
                "Re-send the endpoint's events since a time",
                "Accepted at once; the events of the endpoint's types that occurred at or after"
                " `since` are delivered again in the background, with their original"
                " `webhook-id` (receivers de-duplicate on it).",
                one_endpoint=True,
                ok_status="202",
                ok=_json_response("Accepted.", ReplayAcceptedResponse),
                failures=(
                    *_webhook_failures(
                        "update_webhook_endpoint_failed",
                        bad_request="Malformed `endpoint_id`; a missing or invalid body (`since`"
                        " not an RFC 3339 date-time, unknown fields).",
                    ),
                    Failure(
                        TOO_MANY,
                        "The workspace already has `WEBHOOK_REPLAYS_PER_WORKSPACE` replays"
                        f" (default {_REPLAY_QUOTA}) in progress on this front-end, or the"
                        " front-end has as many as it runs and queues"
                        " (`WEBHOOK_REPLAY_MAX_RUNNING` + `WEBHOOK_REPLAY_MAX_QUEUED`); the"
                        " message says which. Nothing was started; retry after `Retry-After`"
                        " seconds.",
                    ),
                ),
                body=_json_body(ReplayBody, "Where to start.", required=True),
            ),
            "options": _preflight("preflightReplayWebhookEvents", "endpoint_id"),
        },
    }


def openapi_document(
    limits: EndpointLimits | None = None, policy: TargetPolicy | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the front-end (deterministic: equal on every call), with
    ``limits`` and the webhook target ``policy`` (the settings' defaults unless given) in the
    endpoint bodies' schemas."""
    limits = limits or EndpointLimits.defaults()
    policy = policy or TargetPolicy()
    not_allowed = ServiceError.of("method_not_allowed")
    identifier = TypeAdapter(Identifier).json_schema()
    not_found = ServiceError.of("not_found")
    auth_parameters = [
        {"$ref": "#/components/parameters/AccountId"},
        {"$ref": "#/components/parameters/RequestId"},
    ]
    return {
        "openapi": "3.1.0",
        "info": {
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
        },
        "servers": [{"url": SERVER_URL}],
        "tags": [
            {"name": "auth", "description": "Account authorization flow."},
            {"name": "webhooks", "description": "Webhook endpoints of the key's workspace."},
            {"name": "cors", "description": "Browser preflights."},
            {
                "name": "operations",
                "description": "Probes (no API key; metrics are on the side door).",
            },
        ],
        "paths": _with_allow(
            {
                PASSKEY_CONFIRM: {
                    "post": {
                        "operationId": "confirmPasskey",
                        "summary": "Confirm the pending Passkey challenge of an account",
                        "description": (
                            "Call it once the account's status is `passkey_confirmation`, then poll"
                            f" `GET {ACCOUNT_AUTH}` until the status is `authorized` or `failed`."
                            " No body is required; an empty body or any JSON object (ignored) is"
                            " accepted. On 500 check `GET .../auth` before retrying: the"
                            " confirmation may still be applied."
                        ),
                        "tags": ["auth"],
                        "security": [{"ApiKey": []}],
                        "parameters": auth_parameters,
                        "requestBody": {
                            "required": False,
                            "description": (
                                f"Optional; ignored when it is a JSON object of at most"
                                f" {MAX_BODY_BYTES} bytes."
                            ),
                            "content": {_JSON: {"schema": {"type": "object"}}},
                        },
                        "responses": {
                            "200": _auth_ok(
                                "Confirmed: `status` and `auth_status` are"
                                " `passkey_confirmation_sent` (or the current status when it was"
                                " already sent)."
                            ),
                            **_error_responses(_CONFIRM_FAILURES),
                        },
                    },
                    "options": _preflight("preflightPasskeyConfirm", "account_id"),
                },
                ACCOUNT_AUTH: {
                    "get": {
                        "operationId": "getAuthState",
                        "summary": "Authentication state of an account (the polling route)",
                        "description": (
                            "Poll until `status` is `authorized` or `failed`. Answered by the"
                            " worker that owns the account: a poll sent after a confirmation's"
                            " 200 shows that confirmation's outcome or a newer one."
                        ),
                        "tags": ["auth"],
                        "security": [{"ApiKey": []}],
                        "parameters": auth_parameters,
                        "responses": {
                            "200": _auth_ok("The account's current status."),
                            **_error_responses(_AUTH_FAILURES),
                        },
                    },
                    "options": _preflight("preflightAuth", "account_id"),
                },
                **_webhook_paths(limits, policy),
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
                    ApiReadiness,
                    "Ready.",
                    "Not ready.",
                ),
            }
        ),
        "components": {
            "securitySchemes": {
                "ApiKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-Api-Key",
                    "description": "Server-side workspace API key; selects the workspace.",
                }
            },
            "headers": {
                "X-Request-Id": {
                    "description": (
                        "Diagnostic handle of the request, equal to the body's `request_id`:"
                        " the caller's `X-Request-Id` when valid, else `req_<32 hex>`."
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
        },
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
