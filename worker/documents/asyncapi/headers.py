"""The Kafka headers the AsyncAPI document states, which no model holds: the trace context on
every record and the dead letters' headers, each checked against its publisher by the tests."""

from __future__ import annotations

from typing import Any, Final

from worker.contract.messages import DECODE_REASONS
from worker.contract.webhook_endpoints import EVENT_TYPES
from worker.engine.faults import FAULT_REASONS

#: W3C Trace Context (https://www.w3.org/TR/trace-context/) as Kafka headers: optional on
#: every message, so a trace follows a command from the front-end to the webhook.
TRACE_HEADERS: Final[dict[str, Any]] = {
    "traceparent": {
        "type": "string",
        "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
        "description": "W3C Trace Context `traceparent` (version-traceid-parentid-flags) of "
        "the span that produced the record; from a service that records no spans (no "
        "exporter configured), the context it received, passed on unchanged. Every record "
        "our services write has it. Optional for other producers.",
    },
    "tracestate": {
        "type": "string",
        "maxLength": 512,
        "description": "W3C Trace Context `tracestate` (vendor-specific trace data), the "
        "caller's passed on, cut to 512 characters by the W3C rules. Optional.",
    },
}

#: Headers of ``auth.dlq`` (worker/engine/faults.py ``Fault.headers``), after the original record's.
AUTH_DLQ_HEADERS: Final[dict[str, Any]] = {
    "dlq.reason": {
        "type": "string",
        "enum": [*DECODE_REASONS, *FAULT_REASONS],
        "description": "Why the record could not become a command, or why its handling "
        "failed for good (a metrics label).",
    },
    "dlq.detail": {
        "type": "string",
        "description": "The explanation for humans, at most 1024 bytes (UTF-8).",
    },
    "dlq.source": {
        "type": "string",
        "pattern": "^.+:[0-9]+:[0-9]+$",
        "description": "Where the original record was: `topic:partition:offset`.",
    },
    "dlq.attempts": {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": "How many times the record was tried before it was dead-lettered.",
    },
}

#: Headers of a dead letter whose handling failed (not of an undecodable record).
DLQ_FAULT_HEADERS: Final[dict[str, Any]] = {
    "dlq.exception": {
        "type": "string",
        "description": "The exception class of the last attempt.",
    },
    "dlq.fingerprint": {
        "type": "string",
        "pattern": "^[0-9a-f]{16}$",
        "description": "Where and how the last attempt failed (class and call stack, no "
        "message): one bug, one fingerprint.",
    },
}

#: Headers of ``webhook.dlq`` (worker/dispatcher/publish.py ``DeliveryPublisher.dead_letter``).
WEBHOOK_DLQ_HEADERS: Final[dict[str, Any]] = {
    "webhook.id": {
        "type": "string",
        "description": "The `webhook-id` every attempt of the delivery was sent under.",
    },
    "webhook.endpoint": {"type": "string", "description": "The endpoint id."},
    "webhook.event_type": {
        "type": "string",
        "enum": list(EVENT_TYPES),
        "description": "The webhook event type.",
    },
    "webhook.attempts": {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": "How many attempts were made (decimal).",
    },
    "webhook.last_status": {
        "type": "string",
        "pattern": "^([0-9]{3})?$",
        "description": "HTTP status of the last attempt; empty when it got no response.",
    },
    "webhook.last_error": {
        "type": "string",
        "description": "Why the last attempt failed, at most 512 bytes (UTF-8); may be empty.",
    },
}


def _headers(
    title: str, required: dict[str, Any], optional: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Kafka headers as a schema: ``required`` ones plus ``optional`` ones and the trace
    context."""
    schema: dict[str, Any] = {
        "title": title,
        "type": "object",
        "properties": {**required, **(optional or {}), **TRACE_HEADERS},
    }
    if required:
        schema["required"] = list(required)
    return schema


def header_schemas() -> dict[str, Any]:
    """The schema of each set of headers a message can carry, by its component name."""
    return {
        "TraceContextHeaders": _headers("TraceContextHeaders", {}),
        "AuthDeadLetterHeaders": _headers(
            "AuthDeadLetterHeaders", AUTH_DLQ_HEADERS, DLQ_FAULT_HEADERS
        ),
        "WebhookDeadLetterHeaders": _headers("WebhookDeadLetterHeaders", WEBHOOK_DLQ_HEADERS),
    }
