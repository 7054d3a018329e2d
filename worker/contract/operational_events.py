"""Operational events: ``endpoint.disabled`` and ``endpoint.enabled``, fanned out by the
dispatcher to the workspace's other active endpoints whose ``event_types`` name them, and
``endpoint.probe``, sent to a disabled endpoint itself (``worker.dispatcher.probing``). Their
models and one example each (``MODELS``, ``EXAMPLES``) are what the event catalogue lists. One
id per transition: derived from the endpoint, the revision the transition writes and the type,
and announced before the endpoint write (docs/architecture.md, "Operational events"). The records
only: ``worker.webhooks.announcer`` publishes them, the dispatcher's intake fans them out."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Annotated, Final, Literal

from pydantic import BaseModel, Field

from worker.contract.messages import Identifier, Strict, TopicRecord
from worker.contract.webhook_endpoints import (
    EVENT_ENDPOINT_DISABLED,
    EVENT_ENDPOINT_ENABLED,
    EVENT_ENDPOINT_PROBE,
    EndpointRecord,
    now_rfc3339,
)
from worker.contract.webhook_events import WebhookEvent

OPERATIONAL_EVENT_TYPES: Final = (EVENT_ENDPOINT_DISABLED, EVENT_ENDPOINT_ENABLED)
#: Failures an ``endpoint.disabled`` event lists at most.
MAX_LAST_FAILURES: Final = 5
#: How an ``OperationalRecord`` on ``webhook.replays`` (the dispatcher's third input) starts.
_RECORD_MARK: Final = b'"type":"webhook_operational"'

ShortText = Annotated[str, Field(max_length=512)]


def operational_event_id(endpoint_id: str, revision: int, event_type: str) -> str:
    """``evt_`` + 32 hex: the same for every announcement of one transition (see the module
    docstring)."""
    digest = hashlib.sha256(f"{endpoint_id}\0{revision}\0{event_type}".encode()).hexdigest()
    return f"evt_{digest[:32]}"


class EndpointFailure(Strict):
    """One failed delivery attempt that led to the endpoint being disabled."""

    at: str | None = Field(description="When the attempt failed (RFC 3339), when known.")
    status: int | None = Field(description="The HTTP status it answered; null: no answer.")
    error: ShortText | None = Field(description="What went wrong (`timeout`, `http_500`, ...).")
    attempts: int = Field(ge=0, description="Attempts made for that delivery so far.")


class EndpointDisabledData(Strict):
    """``data`` of ``endpoint.disabled``."""

    event_id: str = Field(description="The event's id; the same on every resend.")
    workspace_id: Identifier
    endpoint_id: Identifier = Field(description="The endpoint that was disabled.")
    description: ShortText | None = Field(description="The endpoint's description.")
    reason: ShortText = Field(description="Why it was disabled (410 Gone, failing for days).")
    failing_since: str | None = Field(description="When it started failing (RFC 3339).")
    last_failures: list[EndpointFailure] = Field(
        max_length=MAX_LAST_FAILURES, description="The failures that led to it, newest first."
    )
    occurred_at: str


class EndpointEnabledData(Strict):
    """``data`` of ``endpoint.enabled``."""

    event_id: str = Field(description="The event's id; the same on every resend.")
    workspace_id: Identifier
    endpoint_id: Identifier = Field(description="The endpoint that was activated again.")
    description: ShortText | None = Field(description="The endpoint's description.")
    reason: Literal["activated", "recovered"] = Field(
        default="activated",
        description="`activated`: by its owner (`POST .../activate`); `recovered`: it answered"
        " a probe of the dispatcher with a 2xx.",
    )
    occurred_at: str


class EndpointProbeData(Strict):
    """``data`` of ``endpoint.probe``."""

    event_id: str = Field(description="The probe's id (its `webhook-id`): one per probe.")
    workspace_id: Identifier
    endpoint_id: Identifier = Field(description="The disabled endpoint probed (this one).")
    disabled_at: str = Field(description="When the dispatcher disabled it (RFC 3339).")
    probe: int = Field(ge=1, description="Probes sent since then, this one included.")
    occurred_at: str


class EndpointDisabledEvent(Strict):
    """The webhook body of ``endpoint.disabled``: the dispatcher disabled one of the
    workspace's endpoints (it answered 410 Gone, or kept failing); sent to the workspace's
    other active endpoints that take it."""

    type: Literal["endpoint.disabled"] = "endpoint.disabled"
    timestamp: str
    data: EndpointDisabledData


class EndpointEnabledEvent(Strict):
    """The webhook body of ``endpoint.enabled``: a disabled endpoint of the workspace was
    activated again (``POST .../activate``, or it answered a probe); sent to the workspace's
    other active endpoints that take it."""

    type: Literal["endpoint.enabled"] = "endpoint.enabled"
    timestamp: str
    data: EndpointEnabledData


class EndpointProbeEvent(Strict):
    """The webhook body of ``endpoint.probe``: sent, signed, to an endpoint the dispatcher
    disabled, on a backing-off schedule; a 2xx answer re-enables it."""

    type: Literal["endpoint.probe"] = "endpoint.probe"
    timestamp: str
    data: EndpointProbeData


#: One model per operational event type: what the catalogue lists.
MODELS: Final[dict[str, type[BaseModel]]] = {
    EVENT_ENDPOINT_DISABLED: EndpointDisabledEvent,
    EVENT_ENDPOINT_ENABLED: EndpointEnabledEvent,
    EVENT_ENDPOINT_PROBE: EndpointProbeEvent,
}

_EXAMPLE_AT: Final = "2026-11-27T09:30:00.000Z"
#: One example body per operational event type (valid instances of ``MODELS``).
EXAMPLES: Final[dict[str, BaseModel]] = {
    EVENT_ENDPOINT_DISABLED: EndpointDisabledEvent(
        timestamp=_EXAMPLE_AT,
        data=EndpointDisabledData(
            event_id=operational_event_id("ep_example", 7, EVENT_ENDPOINT_DISABLED),
            workspace_id="ws_example",
            endpoint_id="ep_example",
            description="Orders service",
            reason="failing for 5 days",
            failing_since="2026-11-22T09:29:58.000Z",
            last_failures=[
                EndpointFailure(at=_EXAMPLE_AT, status=503, error="http_503", attempts=9)
            ],
            occurred_at=_EXAMPLE_AT,
        ),
    ),
    EVENT_ENDPOINT_ENABLED: EndpointEnabledEvent(
        timestamp=_EXAMPLE_AT,
        data=EndpointEnabledData(
            event_id=operational_event_id("ep_example", 8, EVENT_ENDPOINT_ENABLED),
            workspace_id="ws_example",
            endpoint_id="ep_example",
            description="Orders service",
            reason="recovered",
            occurred_at=_EXAMPLE_AT,
        ),
    ),
    EVENT_ENDPOINT_PROBE: EndpointProbeEvent(
        timestamp=_EXAMPLE_AT,
        data=EndpointProbeData(
            event_id="evt_9b0d6c1e5f2a4b7c8d3e0f1a2b3c4d5e",
            workspace_id="ws_example",
            endpoint_id="ep_example",
            disabled_at="2026-11-27T09:00:00.000Z",
            probe=2,
            occurred_at=_EXAMPLE_AT,
        ),
    ),
}


class OperationalRecord(TopicRecord):
    """An operational event on ``webhook.replays`` (key: the subject endpoint's id, which is
    the lane its deliveries are ordered in, like an account's): the dispatcher that reads it
    fans ``body`` out to the workspace's other subscribed endpoints."""

    type: Literal["webhook_operational"] = "webhook_operational"
    event_type: Literal["endpoint.disabled", "endpoint.enabled"]
    event_id: str = Field(max_length=64)
    workspace_id: Identifier
    endpoint_id: Identifier
    occurred_at: str
    body: str = Field(max_length=16_384)

    def event(self) -> WebhookEvent:
        return WebhookEvent(
            event_type=self.event_type,
            event_id=self.event_id,
            account_id=self.endpoint_id,
            workspace_id=self.workspace_id,
            version=None,
            occurred_at=self.occurred_at,
            body=self.body,
        )


def is_operational(value: bytes | None) -> bool:
    """Whether a ``webhook.replays`` value is an operational event (cheap: no decoding)."""
    return value is not None and _RECORD_MARK in value[:64]


def _body(model: BaseModel) -> str:
    return json.dumps(
        model.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False, sort_keys=False
    )


def disabled_record(
    endpoint: EndpointRecord,
    reason: str,
    *,
    failing_since: str | None,
    failures: Sequence[EndpointFailure],
    occurred_at: str | None = None,
) -> OperationalRecord:
    """The announcement of ``endpoint`` disabled by its next revision."""
    at = occurred_at or now_rfc3339()
    event_id = operational_event_id(endpoint.id, endpoint.revision + 1, EVENT_ENDPOINT_DISABLED)
    body = EndpointDisabledEvent(
        timestamp=at,
        data=EndpointDisabledData(
            event_id=event_id,
            workspace_id=endpoint.workspace_id,
            endpoint_id=endpoint.id,
            description=(endpoint.description or "")[:512] or None,
            reason=reason[:512],
            failing_since=failing_since,
            last_failures=list(failures)[:MAX_LAST_FAILURES],
            occurred_at=at,
        ),
    )
    return _record(endpoint, EVENT_ENDPOINT_DISABLED, event_id, at, body)


def enabled_record(
    endpoint: EndpointRecord,
    occurred_at: str | None = None,
    reason: Literal["activated", "recovered"] = "activated",
) -> OperationalRecord:
    """The announcement of ``endpoint`` (disabled) activated by its next revision."""
    at = occurred_at or now_rfc3339()
    event_id = operational_event_id(endpoint.id, endpoint.revision + 1, EVENT_ENDPOINT_ENABLED)
    body = EndpointEnabledEvent(
        timestamp=at,
        data=EndpointEnabledData(
            event_id=event_id,
            workspace_id=endpoint.workspace_id,
            endpoint_id=endpoint.id,
            description=(endpoint.description or "")[:512] or None,
            reason=reason,
            occurred_at=at,
        ),
    )
    return _record(endpoint, EVENT_ENDPOINT_ENABLED, event_id, at, body)


def probe_body(endpoint: EndpointRecord, disabled_at: str, probe: int, at: str) -> tuple[str, str]:
    """The ``n``-th probe of ``endpoint`` since it was disabled: its id (the same for a
    probe sent again after a crash) and its body."""
    digest = hashlib.sha256(f"{endpoint.id}\0{disabled_at}\0{probe}".encode()).hexdigest()
    event_id = f"evt_{digest[:32]}"
    data = EndpointProbeData(
        event_id=event_id,
        workspace_id=endpoint.workspace_id,
        endpoint_id=endpoint.id,
        disabled_at=disabled_at,
        probe=probe,
        occurred_at=at,
    )
    return event_id, _body(EndpointProbeEvent(timestamp=at, data=data))


def _record(
    endpoint: EndpointRecord, event_type: str, event_id: str, at: str, body: BaseModel
) -> OperationalRecord:
    return OperationalRecord.model_validate(
        {
            "event_type": event_type,
            "event_id": event_id,
            "workspace_id": endpoint.workspace_id,
            "endpoint_id": endpoint.id,
            "occurred_at": at,
            "body": _body(body),
        }
    )


__all__ = [
    "EVENT_ENDPOINT_DISABLED",
    "EVENT_ENDPOINT_ENABLED",
    "EXAMPLES",
    "MODELS",
    "OPERATIONAL_EVENT_TYPES",
    "EndpointDisabledData",
    "EndpointDisabledEvent",
    "EndpointEnabledData",
    "EndpointEnabledEvent",
    "EndpointFailure",
    "EndpointProbeData",
    "EndpointProbeEvent",
    "OperationalRecord",
    "disabled_record",
    "enabled_record",
    "is_operational",
    "operational_event_id",
    "probe_body",
]
