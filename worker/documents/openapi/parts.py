"""The pieces every route table of the OpenAPI document is made of: catalogued failures and their
responses, JSON bodies and answers, headers, and the ``OPTIONS`` operation each route has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from worker.api.bodies import ErrorResponse
from worker.api.cors import ALLOW_HEADERS, ALLOW_METHODS, CORS_HEADERS, CORS_MAX_AGE_S, CORS_METHODS
from worker.api.methods import allow_value
from worker.api.reading import MAX_BODY_BYTES
from worker.contract.catalogue import ServiceError, by_numeric, entry

JSON: Final = "application/json"
REF: Final = "#/components/schemas/{model}"
RID_HEADER: Final = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}
EXAMPLE_RID: Final = "req_5f0c8a6e0b6b4c1f9d3f3f8b2a9c1d7e"


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
KEY_CHECK: Final = (
    Failure("missing_api_key"),
    Failure("invalid_api_key"),
    Failure("rate_limited"),
)
# Operations that read a body: the body's deadline (408, a service extension).
BODY_TIMEOUT: Final = Failure("request_timeout")
_PREFLIGHT_FAILURES: Final = (
    Failure("cors_forbidden"),
    Failure("not_found", "The route does not exist (e.g. a path parameter holding `/`)."),
)


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def json_response(description: str, model: type[BaseModel], **content: Any) -> dict[str, Any]:
    return {
        "description": description,
        "headers": dict(RID_HEADER),
        "content": {JSON: {"schema": ref(model), **content}},
    }


def _error_example(err: ServiceError, summary: str) -> dict[str, Any]:
    return {"summary": summary, "value": ErrorResponse.of(EXAMPLE_RID, err).model_dump()}


def error_responses(failures: tuple[Failure, ...]) -> dict[str, dict[str, Any]]:
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
        response = json_response(description, ErrorResponse, examples=examples)
        if status == 429:
            response["headers"]["Retry-After"] = header(
                {"type": "integer", "minimum": 1}, "Seconds to wait before retrying."
            )
        responses[str(status)] = response
    return responses


def header(schema: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"required": True, "schema": schema}
    if description is not None:
        found["description"] = description
    return found


def _optional_header(schema: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    return {**header(schema, description), "required": False}


def preflight(operation_id: str, parameter: str | None = None) -> dict[str, Any]:
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
                    **RID_HEADER,
                    # The route's methods: set by ``with_allow`` from the path item.
                    "Allow": header({"type": "string"}, "The methods the route takes."),
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
            **error_responses(_PREFLIGHT_FAILURES),
        },
    }


def with_allow(paths: dict[str, Any]) -> dict[str, Any]:
    """Each ``OPTIONS`` operation's ``Allow``, stated from its path item: what the front door
    answers (``worker.api.methods.allow_value``, HEAD beside GET, OPTIONS everywhere)."""
    for item in paths.values():
        if "options" in item:
            allow = allow_value(method.upper() for method in item)
            headers = item["options"]["responses"]["204"]["headers"]
            headers["Allow"]["schema"] = {"type": "string", "const": allow}
    return paths


def json_body(model: type[BaseModel], description: str, *, required: bool) -> dict[str, Any]:
    return {
        "required": required,
        "description": description,
        "content": {JSON: {"schema": ref(model)}},
    }


#: The body of a route that reads none: anything small and JSON is accepted and ignored.
EMPTY_BODY: Final = {
    "required": False,
    "description": f"Optional; ignored when it is a JSON object of at most {MAX_BODY_BYTES} bytes.",
    "content": {JSON: {"schema": {"type": "object"}}},
}
