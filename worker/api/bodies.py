"""Every JSON body the front-end answers, as the pydantic models the OpenAPI document publishes, so
contract and responses cannot disagree; the confirm answers the worker's ``AuthData`` unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from worker.api.ids import new_request_id as new_request_id  # the request-id rule, with valid_id
from worker.contract.catalogue import ServiceError
from worker.contract.messages import AuthData, ErrorBody, Identifier, Strict
from worker.contract.messages import valid_id as valid_id  # account ids, caller request ids

# The models' docstrings are their descriptions in the OpenAPI document: written for callers.


T = TypeVar("T")


class DataResponse(BaseModel, Generic[T]):
    """Every success: ``request_id`` and ``data`` (a page adds its cursor). Each route's answer
    is a subclass adding only its docstring, so the OpenAPI document names and describes it."""

    model_config = ConfigDict(frozen=True)

    request_id: Identifier
    data: T


class AuthResponse(DataResponse[AuthData]):
    """Success: the account's current status."""


class AuthState(AuthData):
    """The account's status, and the version of its record: pass it back as
    ``after_version`` to wait for the next change."""

    version: Annotated[
        int,
        Field(ge=0, description="The account record's version; grows with every change."),
    ]


class AuthStateResponse(DataResponse[AuthState]):
    """Success: the account's current status and its version."""


# The worker's ErrorBody, with the bounds the HTTP contract promises on top.
class ErrorObject(ErrorBody):
    """The error: branch on ``code`` / ``numeric_code``, never on ``message``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: Annotated[
        str,
        Field(pattern="^[a-z][a-z0-9_]*$", description="Legacy snake_case code; branch on it."),
    ]
    numeric_code: Annotated[
        int,
        Field(ge=10000, le=99999, description="5-digit code refining the cause; branch on it."),
    ]
    message: Annotated[str, Field(description="Human-readable; do not branch on it.")]


class ErrorResponse(Strict):
    """Every failure, exactly this shape: no ``data``, no other field."""

    request_id: Identifier
    error: ErrorObject

    @classmethod
    def of(cls, request_id: str, err: ServiceError) -> ErrorResponse:
        return cls(
            request_id=request_id,
            error=ErrorObject(code=err.code, numeric_code=err.numeric_code, message=err.message),
        )


class ApiHealth(BaseModel):
    """Liveness: ``ok`` while every Kafka reader runs."""

    status: Literal["ok", "failed"]


class ApiReadiness(BaseModel):
    """Readiness: the reply consumer positioned, when webhooks are configured the endpoints
    registry caught up, and no Kafka outage in progress. Nothing here waits for auth.state:
    a replica's time to ready does not grow with the number of accounts."""

    ready: bool
    replies: bool
    webhooks: bool | None = Field(
        description="`null` when webhooks are not configured (no secrets key)."
    )
    kafka: bool = Field(
        default=True,
        description="`false` while the Kafka cluster is unreachable (an outage in progress).",
    )


def json_response(
    body: BaseModel, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"), status_code=status_code, headers=headers)


def error_response(
    request_id: str, err: ServiceError, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The contract's failure envelope with the error's HTTP status."""
    return json_response(ErrorResponse.of(request_id, err), err.http_status, headers)
