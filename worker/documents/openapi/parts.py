"""What every route table of the OpenAPI document is made of: catalogued failures, JSON bodies,
parameters, links, one operation and one path item (with its ``OPTIONS`` and ``Allow``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from worker.api.bodies import ErrorResponse
from worker.api.cors import ALLOW_HEADERS, ALLOW_METHODS, CORS_HEADERS, CORS_MAX_AGE_S, CORS_METHODS
from worker.api.methods import allow_value
from worker.api.portal.tokens import in_portal_scope
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
KEY_CHECK: Final = (Failure("missing_api_key"), Failure("invalid_api_key"), Failure("rate_limited"))
# Operations that read a body: the body's deadline (408, a service extension).
BODY_TIMEOUT: Final = Failure("request_timeout")
_PREFLIGHT_FAILURES: Final = (
    Failure("cors_forbidden"),
    Failure("not_found", "The route does not exist (e.g. a path parameter holding `/`)."),
)
#: The CORS headers of an allowed preflight: their schema (a string) and description.
_CORS_ANSWER: Final = {
    "Access-Control-Allow-Origin": ({}, "The request's Origin (a preflight allowed)."),
    "Access-Control-Allow-Methods": ({"const": ALLOW_METHODS}, None),
    "Access-Control-Allow-Headers": ({"const": ALLOW_HEADERS}, None),
    "Access-Control-Max-Age": ({"const": str(CORS_MAX_AGE_S)}, "Seconds."),
}
#: The body of a route that reads none: anything small and JSON is accepted and ignored.
EMPTY_BODY: Final = {
    "required": False,
    "description": f"Optional; ignored when it is a JSON object of at most {MAX_BODY_BYTES} bytes.",
    "content": {JSON: {"schema": {"type": "object"}}},
}


class Ref(dict[str, str]):
    """``{"$ref": ...}`` to a model's schema, which keeps the model: the document's schemas
    are those of the models its paths point at."""

    def __init__(self, model: type[BaseModel]) -> None:
        super().__init__({"$ref": REF.format(model=model.__name__)})
        self.model = model


def json_response(description: str, model: type[BaseModel], **content: Any) -> dict[str, Any]:
    json = {JSON: {"schema": Ref(model), **content}}
    return {"description": description, "headers": dict(RID_HEADER), "content": json}


def json_body(model: type[BaseModel], description: str, required: bool = True, **more: Any) -> Any:
    body = json_response(description, model, **more) | {"required": required}
    del body["headers"]
    return body


def header(schema: dict[str, Any], description: str | None = None, required: bool = True) -> Any:
    described = {} if description is None else {"description": description}
    return {"required": required, "schema": schema, **described}


def no_store(response: dict[str, Any], why: str = "names a secret") -> dict[str, Any]:
    """``response`` of a route that shows a secret: never stored by a cache."""
    cache = header({"type": "string", "const": "no-store"}, f"The answer {why}: never cached.")
    return {**response, "headers": {**response["headers"], "Cache-Control": cache}}


def param(name: str, where: str, description: str, schema: Any, **more: Any) -> dict[str, Any]:
    """A parameter: required in the path, optional elsewhere."""
    required = where == "path"
    return {
        "name": name,
        "in": where,
        "required": required,
        "description": description,
        "schema": schema,
        **more,
    }


def linked(response: dict[str, Any], **targets: dict[str, str]) -> dict[str, Any]:
    """``response`` with a link to each operation id of ``targets`` (named after it), passing
    it those parameters: what a client, or a stateful fuzzer, calls next."""
    links = {
        op[0].upper() + op[1:]: {"operationId": op, "parameters": parameters}
        for op, parameters in targets.items()
    }
    return {**response, "links": links}


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


def operation(
    op_id: str,
    summary: str,
    description: str,
    failures: tuple[Failure, ...],
    *,
    ok: dict[str, Any],
    params: tuple[dict[str, Any] | str, ...] = ("RequestId",),
    tag: str = "webhooks",
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One operation taking the API key; a string in ``params`` names a component parameter.
    One that reads a ``body`` can also answer the body's deadline."""
    found: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "description": description,
        "tags": [tag],
        "security": [{"ApiKey": []}],
        "parameters": [
            {"$ref": f"#/components/parameters/{p}"} if isinstance(p, str) else p for p in params
        ],
    }
    if body is not None:
        found["requestBody"] = body
        failures = (*failures, BODY_TIMEOUT)
    return found | {"responses": {**ok, **error_responses(failures)}}


def path_item(path: str, preflight: str = "", **operations: dict[str, Any]) -> dict[str, Any]:
    """``{path: its operations}`` and ``OPTIONS``, with the ``Allow`` the front door answers
    (``worker.api.methods.allow_value``). ``OPTIONS`` is ``preflight``, by default that of the
    ``GET`` without its verb (``listX``: ``preflightX``), else of the first operation."""
    if not preflight:
        first: str = operations.get("get", next(iter(operations.values())))["operationId"]
        name = re.sub("^(get|list)", "", first) if "get" in operations else first
        preflight = f"preflight{name[0].upper()}{name[1:]}"
    for method, op in operations.items():
        if in_portal_scope(method.upper(), path):  # a portal session token may call it too
            op["security"] = [*op["security"], {"PortalSession": []}]
    options = _preflight(preflight, re.findall(r"\{(\w+)\}", path), allow_value(operations))
    return {path: {**operations, "options": options}}


def _preflight(operation_id: str, parameters: list[str], allow: str) -> dict[str, Any]:
    """``OPTIONS`` on an API route: a CORS preflight when ``Origin`` and
    ``Access-Control-Request-Method`` are both sent, else the route's methods (``Allow``).
    It does not check the path's ``parameters``."""
    methods = ", ".join(f"`{m}`" for m in CORS_METHODS)
    headers = ", ".join(f"`{h}`" for h in CORS_HEADERS)
    unchecked = "Not checked: `OPTIONS` answers for the route whatever its value."
    cors = ("Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers")
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
            *(param(p, "path", unchecked, {"type": "string", "minLength": 1}) for p in parameters),
            *(
                {"name": n, "in": "header", "required": False, "schema": {"type": "string"}}
                for n in cors
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
                    "Allow": header(
                        {"type": "string", "const": allow}, "The methods the route takes."
                    ),
                    **{
                        name: header({"type": "string", **schema}, description, False)
                        for name, (schema, description) in _CORS_ANSWER.items()
                    },
                },
            },
            **error_responses(_PREFLIGHT_FAILURES),
        },
    }
