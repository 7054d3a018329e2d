"""The event catalogue: every event type the dispatcher sends to webhook endpoints, with its
description, the JSON Schema of its body and an example body, and the envelope a receiver gets
(Standard Webhooks headers). Each entry names the event's wire model and the very function the
dispatcher renders its record with (``worker.contract.webhook_events``), so schema and example
come from the code that makes the deliveries. Adding an event type is one ``EventType`` in
``EVENT_CATALOGUE``: ``GET /v1/event-types``, OpenAPI's ``webhooks:`` and AsyncAPI read it."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from pydantic import BaseModel

from worker.contract.catalogue import ServiceError
from worker.contract.messages import AuthError, AuthStatusChanged, ErrorBody, event_id
from worker.contract.operational_events import EXAMPLES as OPERATIONAL_EXAMPLES
from worker.contract.operational_events import MODELS as OPERATIONAL_MODELS
from worker.contract.webhook_endpoints import (
    EVENT_ENDPOINT_DISABLED,
    EVENT_ENDPOINT_ENABLED,
    EVENT_ENDPOINT_PROBE,
    EVENT_ERROR,
    EVENT_STATUS_CHANGED,
)
from worker.contract.webhook_events import WIRE_ONLY, WebhookEvent, from_error, from_status
from worker.webhooks.signing import SECRET_PREFIX, headers

JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
EXAMPLE_OCCURRED_AT: Final = "2026-01-01T12:00:00.000Z"
EXAMPLE_TIMESTAMP: Final = 1767268800  # EXAMPLE_OCCURRED_AT in Unix seconds
#: A fixed secret, so the example signature is the same on every build (never a real one).
EXAMPLE_SECRET: Final = (
    SECRET_PREFIX + base64.b64encode(b"example-secret-never-use-it-0001").decode()
)


@dataclass(frozen=True, slots=True)
class EventType:
    """One event type as integrators see it: ``name`` (the body's ``type`` and what an endpoint
    subscribes to), the wire ``model`` the event is on Kafka, ``render`` (the dispatcher's own
    function from that record to the webhook body) and an ``example`` record."""

    name: str
    description: str
    model: type[BaseModel]
    render: Callable[[bytes], WebhookEvent]
    example: BaseModel

    def example_event(self) -> WebhookEvent:
        """The example record through the dispatcher's rendering."""
        return self.render(self.example.model_dump_json().encode())

    def example_body(self) -> dict[str, Any]:
        """The exact webhook body the example record is delivered as."""
        body: dict[str, Any] = json.loads(self.example_event().body)
        return body

    def data_schema(self) -> dict[str, Any]:
        """The JSON Schema of ``data``: the model's, without its wire-only fields (which the
        rendering drops); self-contained (``$defs`` inside)."""
        schema = self.model.model_json_schema(mode="serialization")
        schema["properties"] = {k: v for k, v in schema["properties"].items() if k not in WIRE_ONLY}
        schema["required"] = [k for k in schema.get("required", []) if k not in WIRE_ONLY]
        schema["title"] = f"{self.model.__name__}Data"
        schema["additionalProperties"] = False
        return schema

    def body_schema(self) -> dict[str, Any]:
        """The JSON Schema (2020-12) of the whole body ``{type, timestamp, data}``."""
        data = self.data_schema()
        defs = data.pop("$defs", None)
        schema: dict[str, Any] = {
            "$schema": JSON_SCHEMA_DIALECT,
            "title": f"{self.model.__name__}Webhook",
            "description": self.description,
            "type": "object",
            "properties": {
                "type": {"type": "string", "const": self.name},
                "timestamp": {
                    "type": "string",
                    "description": "When the event occurred (RFC 3339, UTC): `data.occurred_at`.",
                },
                "data": data,
                "test": {
                    "type": "boolean",
                    "const": True,
                    "description": "Present, and true, only on a test send"
                    " (`POST .../webhook-endpoints/{endpoint_id}/test`).",
                },
            },
            "required": ["type", "timestamp", "data"],
            "additionalProperties": False,
        }
        if defs:
            schema["$defs"] = defs
        return schema

    def entry(self) -> dict[str, Any]:
        """This type as ``GET /v1/event-types`` lists it."""
        return {
            "name": self.name,
            "description": self.description,
            "schema": self.body_schema(),
            "example": self.example_body(),
        }


def _operational(name: str, description: str) -> EventType:
    """An operational event, whose webhook body is its own model (``{type, timestamp,
    data}``, ``worker.contract.operational_events``): ``model`` is its ``data``, ``render``
    reads the body as the dispatcher sends it."""
    body_model = OPERATIONAL_MODELS[name]
    data_model = body_model.model_fields["data"].annotation
    assert isinstance(data_model, type) and issubclass(data_model, BaseModel)

    def render(raw: bytes) -> WebhookEvent:
        body = body_model.model_validate_json(raw)
        data = body.data  # type: ignore[attr-defined]
        return WebhookEvent(
            event_type=name,
            event_id=data.event_id,
            account_id=data.endpoint_id,
            workspace_id=data.workspace_id,
            version=None,
            occurred_at=data.occurred_at,
            body=json.dumps(body.model_dump(mode="json"), separators=(",", ":")),
        )

    return EventType(
        name=name,
        description=description,
        model=data_model,
        render=render,
        example=OPERATIONAL_EXAMPLES[name],
    )


_EXAMPLE_ACCOUNT: Final = "acc_demo_1"

EVENT_CATALOGUE: Final[tuple[EventType, ...]] = (
    EventType(
        name=EVENT_STATUS_CHANGED,
        description=(
            "An account's authentication status changed (only on a real transition)."
            " `version` is the account record's version after it: per account, a higher"
            " version is newer, and deliveries come in version order."
        ),
        model=AuthStatusChanged,
        render=from_status,
        example=AuthStatusChanged(
            event_id=event_id("example", _EXAMPLE_ACCOUNT, 3),
            account_id=_EXAMPLE_ACCOUNT,
            workspace_id="ws_demo",
            previous_status="passkey_confirmation",
            status="passkey_confirmation_sent",
            auth_status="passkey_confirmation_sent",
            version=3,
            command_id="cmd_5f0c8a6e0b6b4c1f9d3f3f8b2a9c1d7e",
            request_id="req_5f0c8a6e0b6b4c1f9d3f3f8b2a9c1d7e",
            occurred_at=EXAMPLE_OCCURRED_AT,
        ),
    ),
    EventType(
        name=EVENT_ERROR,
        description=(
            "A command on an account failed (one per failed command): the catalogued error"
            " its caller got, with the HTTP status."
        ),
        model=AuthError,
        render=from_error,
        example=AuthError(
            event_id=event_id("example", _EXAMPLE_ACCOUNT, "error"),
            account_id=_EXAMPLE_ACCOUNT,
            workspace_id="ws_demo",
            command_id="cmd_5f0c8a6e0b6b4c1f9d3f3f8b2a9c1d7e",
            request_id="req_5f0c8a6e0b6b4c1f9d3f3f8b2a9c1d7e",
            http_status=409,
            error=ErrorBody.model_validate(ServiceError.of("provider_not_ready").body()),
            occurred_at=EXAMPLE_OCCURRED_AT,
        ),
    ),
    _operational(
        EVENT_ENDPOINT_DISABLED,
        "The dispatcher disabled one of the workspace's endpoints (it answered 410 Gone, or"
        " kept failing), with the reason and its last failures; sent to the workspace's other"
        " active endpoints that list it in `event_types`.",
    ),
    _operational(
        EVENT_ENDPOINT_ENABLED,
        "A disabled endpoint of the workspace was activated again, by its owner or because"
        " it answered a probe (`reason`); sent to the workspace's other active endpoints that"
        " list it in `event_types`.",
    ),
    _operational(
        EVENT_ENDPOINT_PROBE,
        "Sent to an endpoint the dispatcher disabled, itself only, whatever its `event_types`,"
        " on a backing-off schedule unless its `auto_recover` is false: answer it with a 2xx"
        " and the endpoint is re-enabled.",
    ),
)
"""Every event type sent to webhooks, in the order they are listed."""

ENVELOPE_HEADERS: Final[dict[str, str]] = {
    "webhook-id": "The event's id: the same on every attempt, resend and replay of one event;"
    " de-duplicate on it.",
    "webhook-timestamp": "When this attempt was signed, Unix seconds; refuse one too far"
    " from your clock (Standard Webhooks suggests 5 minutes).",
    "webhook-signature": "`v1,<base64 HMAC-SHA256 of '{webhook-id}.{webhook-timestamp}.{body}'>`"
    " per live signing secret of the endpoint, space-separated; one matching is enough.",
    "content-type": "`application/json`: the body is one event, UTF-8.",
}


def envelope() -> dict[str, Any]:
    """What every delivery carries around its body: the Standard Webhooks headers, with an
    example signed by ``signing.headers`` itself over the first type's example body."""
    first = EVENT_CATALOGUE[0].example_event()
    example = headers(
        [EXAMPLE_SECRET], first.event_id, EXAMPLE_TIMESTAMP, first.body.encode("utf-8")
    )
    return {
        "specification": "https://www.standardwebhooks.com/",
        "method": "POST",
        "headers": {
            name: {"description": text, "example": example[name]}
            for name, text in ENVELOPE_HEADERS.items()
        },
        "example_secret": EXAMPLE_SECRET,
    }


@cache
def catalogue_document() -> dict[str, Any]:
    """``GET /v1/event-types``' ``data``: the envelope and every type (built once)."""
    return {
        "envelope": envelope(),
        "event_types": [t.entry() for t in EVENT_CATALOGUE],
    }


__all__ = [
    "ENVELOPE_HEADERS",
    "EVENT_CATALOGUE",
    "EXAMPLE_SECRET",
    "EventType",
    "catalogue_document",
    "envelope",
]
