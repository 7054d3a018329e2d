"""The bodies of the webhook-endpoint routes as pydantic models, validated and published like
``worker.api.bodies``. Requests forbid unknown fields (a misspelt ``event_type`` must fail,
not subscribe to everything); the setting-dependent length limits are checked by the handlers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    WithJsonSchema,
)
from starlette.requests import Request

from worker.api.bodies import DataResponse
from worker.api.reading import decode_json, read_body
from worker.contract.catalogue import ServiceError
from worker.contract.messages import Identifier, Strict, validation_problems
from worker.contract.webhook_endpoints import (
    EndpointRecord,
    EndpointStatus,
    EventType,
    RateLimit,
    Recovery,
)
from worker.contract.webhook_events import parse_rfc3339
from worker.webhooks.signing import SECRET_PREFIX

Rfc3339 = Annotated[
    datetime,
    BeforeValidator(parse_rfc3339),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
UrlField = Annotated[
    str,
    Field(
        min_length=1,
        description=(
            "Absolute `https` URL with a public host (no user or password). `http` and private"
            " or loopback targets only where the deployment allows them. The `pattern` is the"
            " form the service enforces; a URL of that form is refused only for the address it"
            " names (loopback, private, link-local or otherwise special, unless the deployment"
            " allows private targets)."
        ),
    ),
]
EventTypes = Annotated[
    Annotated[list[EventType], Field(min_length=1)] | None,
    Field(description="Event types to deliver; `null` (or absent on create) means all."),
]


def _unicode_text(value: str) -> str:
    """JSON may escape a lone surrogate (``"\\ud800"``), which no UTF-8 record can hold."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogate escapes)") from None
    return value


Description = Annotated[str, AfterValidator(_unicode_text)] | None


def _integral(value: object) -> object:
    """JSON Schema's ``integer`` includes ``669.0``; any other float stays refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


RateLimitField = Annotated[
    Annotated[RateLimit, BeforeValidator(_integral)] | None,
    Field(
        description="Attempts per second at most to this endpoint (Svix's `rateLimit`), per"
        " dispatcher process; `null` (or absent on create): no limit."
    ),
]


def invalid_body(exc: ValidationError) -> ServiceError:
    """400 naming each bad field and why, never the value (a URL may carry a token)."""
    problems = validation_problems(exc, "body")[:5]
    return ServiceError.of("invalid_request", "Invalid request body: " + "; ".join(problems) + ".")


Model = TypeVar("Model", bound=BaseModel)


async def json_object_body(
    request: Request, model: type[Model], *, when_empty: Model | None = None
) -> Model:
    """The request's body as ``model``: 400 when it is not a JSON object or not valid (each
    bad field named, never its value), and when it is empty unless ``when_empty`` is given
    (an optional body: that is the answer then)."""
    raw = await read_body(request)
    if not raw:
        if when_empty is not None:
            return when_empty
        raise ServiceError.of("invalid_request", "A JSON object request body is required.")
    value = decode_json(raw)
    if not isinstance(value, dict):
        expected = "a JSON object" if when_empty is None else "a JSON object or empty"
        raise ServiceError.of("invalid_request", f"The request body must be {expected}.")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise invalid_body(exc) from None


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


# -- requests ---------------------------------------------------------------------------------


class CreateEndpointBody(Strict):
    """Create a webhook endpoint."""

    url: UrlField
    event_types: EventTypes = None
    description: Description = None
    rate_limit: RateLimitField = None
    auto_recover: StrictBool = Field(
        default=True, description="Re-enable it when it answers a probe after a disable."
    )


class UpdateEndpointBody(BaseModel):
    """Change any of `url`, `event_types`, `description`, `rate_limit`, `auto_recover` (at
    least one). `event_types: null` subscribes to all event types; `description: null` clears
    it; `rate_limit: null` lifts the limit."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"minProperties": 1})

    # Optional but never null: the default only marks "not sent" (``model_fields_set``).
    url: UrlField = Field(default=None, json_schema_extra=_no_default)  # type: ignore[assignment]
    event_types: EventTypes = None
    description: Description = None
    rate_limit: RateLimitField = None
    auto_recover: StrictBool = Field(default=True, json_schema_extra=_no_default)

    def changes(self) -> dict[str, Any]:
        """The fields the caller sent, with ``event_types`` as the record's tuple."""
        out: dict[str, Any] = {}
        for name in sorted(self.model_fields_set):
            value = getattr(self, name)
            if name == "event_types" and value is not None:
                value = tuple(dict.fromkeys(value))  # the record holds a tuple, no repeats
            out[name] = value
        return out


class ReplayBody(Strict):
    """Re-send the endpoint's events that occurred at or after `since`."""

    since: Rfc3339


# -- responses --------------------------------------------------------------------------------


class EndpointData(Strict):
    """A webhook endpoint. Its signing secret is shown only when created or rotated."""

    id: Identifier
    workspace_id: Identifier
    url: str
    event_types: list[EventType] | None
    description: str | None
    rate_limit: int | None = None
    status: EndpointStatus = Field(
        description="`disabled`: stopped by the dispatcher (see `disabled_reason`); `activate`"
        " re-enables it, and so does a probe it answers with a 2xx (`recovery`)."
    )
    disabled_reason: str | None
    auto_recover: bool = True
    recovery: Recovery | None = Field(
        default=None,
        description="The probing since the dispatcher last disabled it (times in Unix"
        " seconds): when it is probed next, and what the last probe came to.",
    )
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, record: EndpointRecord) -> EndpointData:
        return cls.model_validate(record.public())


class EndpointWithSecret(EndpointData):
    """A webhook endpoint with its new signing secret: store it now, it is not shown again."""

    secret: Annotated[str, Field(pattern=f"^{SECRET_PREFIX}[A-Za-z0-9+/=]+$")]


class EndpointResponse(DataResponse[EndpointData]):
    """Success: one endpoint."""


class EndpointSecretResponse(DataResponse[EndpointWithSecret]):
    """Success: one endpoint and its new signing secret."""


class EndpointListResponse(DataResponse[list[EndpointData]]):
    """Success: the workspace's endpoints, oldest first."""


class ReplayData(Strict):
    """The replay that was started."""

    replay_id: str
    endpoint_id: Identifier
    since: str


class ReplayAcceptedResponse(DataResponse[ReplayData]):
    """Accepted: the replay runs in the background."""
