"""The front-end's OpenAPI 3.1 document, written out explicitly (not derived from handlers).

Statuses, codes, headers and schemas are exactly what the app answers; ``schemas/openapi.json``
is this document exported by ``make schemas`` and a test fails when it drifts. The app serves
it at ``/openapi.json``. Error examples come from the error catalogue, so a code or numeric
code can not be misspelt here.
"""

from __future__ import annotations

from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.api.routes import ACCOUNT_AUTH, PASSKEY_CONFIRM
from worker.catalogue import ServiceError
from worker.messages import ID_PATTERN

OPENAPI_PATH: Final = "/openapi.json"
SERVER_URL: Final = "http://127.0.0.1:8080"

_JSON: Final = "application/json"
_ERROR_REF: Final = {"$ref": "#/components/schemas/ErrorResponse"}
_RID_HEADER: Final = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}


def _error_example(code: str, http_status: int, message: str | None = None) -> dict[str, Any]:
    err = ServiceError.of(code, message, http_status=http_status)
    return {
        "summary": f"{err.code} ({err.numeric_code})",
        "value": {"request_id": "req_5f0c8a6e0b6b4c1f9d3f3f8b2a9c1d7e", "error": err.body()},
    }


def _error_response(
    description: str, http_status: int, *codes: str, refined: tuple[str, int] | None = None
) -> dict[str, Any]:
    examples = {code: _error_example(code, http_status) for code in codes}
    if refined is not None:
        code, numeric = refined
        err = ServiceError.of(code, http_status=http_status).refine(numeric)
        examples[f"{code}_{numeric}"] = {
            "summary": f"{code} refined to {numeric}",
            "value": {"request_id": "req_5f0c8a6e0b6b4c1f9d3f3f8b2a9c1d7e", "error": err.body()},
        }
    listed = ", ".join(
        f"`{c}` ({ServiceError.of(c, http_status=http_status).numeric_code})" for c in codes
    )
    return {
        "description": f"{description} Codes: {listed}.",
        "headers": dict(_RID_HEADER),
        "content": {_JSON: {"schema": dict(_ERROR_REF), "examples": examples}},
    }


def _auth_ok(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": dict(_RID_HEADER),
        "content": {
            _JSON: {
                "schema": {"$ref": "#/components/schemas/AuthResponse"},
                "example": {
                    "request_id": "req_5f0c8a6e0b6b4c1f9d3f3f8b2a9c1d7e",
                    "data": {
                        "account_id": "acc_demo_1",
                        "status": "passkey_confirmation_sent",
                        "auth_status": "passkey_confirmation_sent",
                    },
                },
            }
        },
    }


_UNAUTHORIZED: Final = {
    "description": (
        "`X-Api-Key` missing (`missing_api_key`, 11000) or not recognised / disabled"
        " (`invalid_api_key`, 11001)."
    ),
    "headers": dict(_RID_HEADER),
    "content": {
        _JSON: {
            "schema": dict(_ERROR_REF),
            "examples": {
                "missing_api_key": _error_example("missing_api_key", 401),
                "invalid_api_key": _error_example("invalid_api_key", 401),
            },
        }
    },
}


def _preflight(route: str) -> dict[str, Any]:
    return {
        "operationId": "preflightPasskeyConfirm" if route == PASSKEY_CONFIRM else "preflightAuth",
        "summary": "CORS preflight",
        "description": (
            "Answered for browsers. Allowed: origins in `API_CORS_ORIGINS` (exact match, `*` for"
            " any), methods `GET` and `POST`, request headers `X-Api-Key`, `Content-Type` and"
            " `X-Request-Id`. No API key is needed. An `OPTIONS` request without `Origin` and"
            " `Access-Control-Request-Method` is not a preflight and answers 404 `not_found`."
        ),
        "tags": ["cors"],
        "security": [],
        "parameters": [
            {"$ref": "#/components/parameters/AccountId"},
            {
                "name": "Origin",
                "in": "header",
                "required": True,
                "schema": {"type": "string"},
            },
            {
                "name": "Access-Control-Request-Method",
                "in": "header",
                "required": True,
                "schema": {"type": "string"},
            },
            {
                "name": "Access-Control-Request-Headers",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
            },
        ],
        "responses": {
            "204": {
                "description": "Preflight allowed; no body.",
                "headers": {
                    **_RID_HEADER,
                    "Access-Control-Allow-Origin": {
                        "required": True,
                        "schema": {"type": "string"},
                        "description": "The request's Origin.",
                    },
                    "Access-Control-Allow-Methods": {
                        "required": True,
                        "schema": {"type": "string", "const": "GET, POST"},
                    },
                    "Access-Control-Allow-Headers": {
                        "required": True,
                        "schema": {
                            "type": "string",
                            "const": "X-Api-Key, Content-Type, X-Request-Id",
                        },
                    },
                    "Access-Control-Max-Age": {
                        "required": True,
                        "schema": {"type": "string", "pattern": "^[0-9]+$"},
                    },
                },
            },
            "403": _error_response(
                "The origin, method or requested headers are not allowed.", 403, "cors_forbidden"
            ),
            "404": _error_response("Not a CORS preflight.", 404, "not_found"),
        },
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the front-end (deterministic: equal on every call)."""
    account_id_rule = (
        "The account's `data.id`. 1-128 characters: a letter or digit, then letters, digits,"
        " `.`, `_`, `:`, `@` or `-` (the same rule the worker applies to every identifier)."
        " It must belong to the key's workspace; an account of another workspace answers 404"
        " like an unknown one."
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Passkey auth-flow front-end",
            "version": "1.0.0",
            "description": (
                "Passkey confirmation and the authentication-state polling route of the"
                " messaging gateway. Every response carries `X-Request-Id`; failures return"
                " `{request_id, error: {code, numeric_code, message}}`. Branch on `code` /"
                " `numeric_code`, never on `message`. Unknown routes and unsupported methods"
                " answer 404 `not_found` (10001)."
            ),
        },
        "servers": [{"url": SERVER_URL}],
        "tags": [
            {"name": "auth", "description": "Account authorization flow."},
            {"name": "cors", "description": "Browser preflights."},
            {"name": "operations", "description": "Probes and metrics (no API key)."},
        ],
        "paths": {
            PASSKEY_CONFIRM: {
                "post": {
                    "operationId": "confirmPasskey",
                    "summary": "Confirm the pending Passkey challenge of an account",
                    "description": (
                        "Call it once the account's status is `passkey_confirmation`, then poll"
                        " `GET /v1/accounts/{account_id}/auth` until the status is `authorized`"
                        " or `failed`. No body is required; an empty body or any JSON object"
                        " (ignored) is accepted. On 500 check `GET .../auth` before retrying:"
                        " the confirmation may still be applied."
                    ),
                    "tags": ["auth"],
                    "security": [{"ApiKey": []}],
                    "parameters": [
                        {"$ref": "#/components/parameters/AccountId"},
                        {"$ref": "#/components/parameters/RequestId"},
                    ],
                    "requestBody": {
                        "required": False,
                        "description": "Optional; ignored when it is a JSON object.",
                        "content": {_JSON: {"schema": {"type": "object"}}},
                    },
                    "responses": {
                        "200": _auth_ok(
                            "Confirmed: `status` and `auth_status` are"
                            " `passkey_confirmation_sent` (or the current status when it was"
                            " already sent)."
                        ),
                        "400": _error_response(
                            "Malformed `account_id` or body, or the provider rejected the data.",
                            400,
                            "invalid_request",
                            "provider_invalid_request",
                        ),
                        "401": dict(_UNAUTHORIZED),
                        "404": _error_response(
                            "The account does not exist in the key's workspace (unknown,"
                            " deregistered or another workspace's), or the route does not exist.",
                            404,
                            "not_found",
                        ),
                        "409": _error_response(
                            "The account's state or binding does not allow the confirmation.",
                            409,
                            "account_already_authorized",
                            "provider_not_ready",
                            "account_binding_not_found",
                            "provider_account_mismatch",
                        ),
                        "500": _error_response(
                            "Unexpected failure or no outcome in time; check the account's"
                            " state before retrying.",
                            500,
                            "run_auth_action_failed",
                        ),
                        "501": _error_response(
                            "The account's provider has no Passkey confirmation.",
                            501,
                            "unsupported_by_provider",
                        ),
                        "502": _error_response(
                            "The provider adapter or the provider could not complete the"
                            " operation (`numeric_code` 30010 refines a non-transient provider"
                            " failure).",
                            502,
                            "provider_unavailable",
                            "provider_adapter_not_found",
                            refined=("provider_unavailable", 30010),
                        ),
                    },
                },
                "options": _preflight(PASSKEY_CONFIRM),
            },
            ACCOUNT_AUTH: {
                "get": {
                    "operationId": "getAuthState",
                    "summary": "Authentication state of an account (the polling route)",
                    "description": (
                        "Poll until `status` is `authorized` or `failed`. Eventually"
                        " consistent: right after a confirmation the previous status can show"
                        " for a few milliseconds."
                    ),
                    "tags": ["auth"],
                    "security": [{"ApiKey": []}],
                    "parameters": [
                        {"$ref": "#/components/parameters/AccountId"},
                        {"$ref": "#/components/parameters/RequestId"},
                    ],
                    "responses": {
                        "200": _auth_ok("The account's current status."),
                        "400": _error_response("Malformed `account_id`.", 400, "invalid_request"),
                        "401": dict(_UNAUTHORIZED),
                        "404": _error_response(
                            "The account does not exist in the key's workspace (unknown,"
                            " deregistered or another workspace's), or the route does not exist.",
                            404,
                            "not_found",
                        ),
                        "500": _error_response(
                            "The state is not available yet (the front-end is starting).",
                            500,
                            "get_auth_state_failed",
                        ),
                    },
                },
                "options": _preflight(ACCOUNT_AUTH),
            },
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "summary": "Liveness: the process and its Kafka readers run",
                    "tags": ["operations"],
                    "security": [],
                    "responses": {
                        code: {
                            "description": desc,
                            "headers": dict(_RID_HEADER),
                            "content": {
                                _JSON: {
                                    "schema": {
                                        "type": "object",
                                        "required": ["status"],
                                        "properties": {
                                            "status": {"type": "string", "enum": ["ok", "failed"]}
                                        },
                                    }
                                }
                            },
                        }
                        for code, desc in (("200", "Alive."), ("503", "A Kafka reader died."))
                    },
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "summary": "Readiness: state view caught up and reply consumer positioned",
                    "tags": ["operations"],
                    "security": [],
                    "responses": {
                        code: {
                            "description": desc,
                            "headers": dict(_RID_HEADER),
                            "content": {
                                _JSON: {
                                    "schema": {
                                        "type": "object",
                                        "required": ["ready", "state_view", "replies"],
                                        "properties": {
                                            "ready": {"type": "boolean"},
                                            "state_view": {"type": "boolean"},
                                            "replies": {"type": "boolean"},
                                        },
                                    }
                                }
                            },
                        }
                        for code, desc in (("200", "Ready."), ("503", "Not ready."))
                    },
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics",
                    "tags": ["operations"],
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "Prometheus text exposition format.",
                            "headers": dict(_RID_HEADER),
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
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
                    "schema": {"type": "string", "pattern": ID_PATTERN},
                }
            },
            "parameters": {
                "AccountId": {
                    "name": "account_id",
                    "in": "path",
                    "required": True,
                    "description": account_id_rule,
                    "schema": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 128,
                        "pattern": ID_PATTERN,
                    },
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
            "schemas": {
                "AuthData": {
                    "type": "object",
                    "required": ["account_id", "status", "auth_status"],
                    "properties": {
                        "account_id": {"type": "string"},
                        "status": {
                            "type": "string",
                            "description": (
                                "Authorization flow status, e.g. `passkey_confirmation`,"
                                " `passkey_confirmation_sent`, `authorized`, `failed`."
                            ),
                        },
                        "auth_status": {"type": "string"},
                    },
                },
                "AuthResponse": {
                    "type": "object",
                    "required": ["request_id", "data"],
                    "properties": {
                        "request_id": {"type": "string"},
                        "data": {"$ref": "#/components/schemas/AuthData"},
                    },
                },
                "ErrorObject": {
                    "type": "object",
                    "required": ["code", "numeric_code", "message"],
                    "additionalProperties": False,
                    "properties": {
                        "code": {
                            "type": "string",
                            "pattern": "^[a-z][a-z0-9_]*$",
                            "description": "Legacy snake_case code; branch on it.",
                        },
                        "numeric_code": {
                            "type": "integer",
                            "minimum": 10000,
                            "maximum": 99999,
                            "description": "5-digit code refining the cause; branch on it.",
                        },
                        "message": {
                            "type": "string",
                            "description": "Human-readable; do not branch on it.",
                        },
                    },
                },
                "ErrorResponse": {
                    "type": "object",
                    "required": ["request_id", "error"],
                    "additionalProperties": False,
                    "properties": {
                        "request_id": {"type": "string"},
                        "error": {"$ref": "#/components/schemas/ErrorObject"},
                    },
                },
            },
        },
    }


def openapi_route() -> Route:
    """``GET /openapi.json``: the document, built once."""
    document = openapi_document()

    async def openapi_json(_: Request) -> Response:
        return JSONResponse(document)

    return Route(OPENAPI_PATH, openapi_json, methods=["GET"])
