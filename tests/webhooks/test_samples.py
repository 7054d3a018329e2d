"""Test sends' example events: built from the event models and rendered as real events are,
valid against the published webhook body schema with the test marker, a fresh event (and so
webhook-id) each time, and nothing for a type the service does not send."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import pytest

from worker.contract.messages import AuthError, AuthStatusChanged
from worker.contract.webhook_endpoints import EVENT_ERROR, EVENT_STATUS_CHANGED, EVENT_TYPES
from worker.contract.webhook_events import EventCopy, from_copy, from_error, from_status
from worker.webhooks.samples import TEST_ACCOUNT, example_record, sample_event

ASYNCAPI = Path(__file__).resolve().parents[2] / "schemas" / "asyncapi.json"


def test_every_type_has_an_example_valid_against_the_published_body() -> None:
    components = json.loads(ASYNCAPI.read_text())["components"]
    body_schema = {"$ref": "#/components/schemas/WebhookBody", "components": components}
    for event_type in EVENT_TYPES:
        event = sample_event(event_type, workspace_id="ws_a", now=1_767_225_600.0)
        body = json.loads(event.body)
        assert body["test"] is True and body["type"] == event_type
        jsonschema_rs.validate(body_schema, body)
        assert event.event_id.startswith("evt_test_") and event.account_id == TEST_ACCOUNT
        if event_type not in (EVENT_STATUS_CHANGED, EVENT_ERROR):
            continue  # an operational event: its body is its own model, no account record
        assert body["data"]["account_id"] == TEST_ACCOUNT
        # the same rendering as a real event of that record, plus the marker only
        record = example_record(
            event_type, workspace_id="ws_a", event_id=event.event_id, now=1_767_225_600.0
        )
        real = (from_status if event_type == EVENT_STATUS_CHANGED else from_error)(record)
        assert {k: v for k, v in body.items() if k != "test"} == json.loads(real.body)
    AuthStatusChanged.model_validate_json(
        example_record(EVENT_STATUS_CHANGED, workspace_id="w", event_id="e", now=0)
    )
    AuthError.model_validate_json(
        example_record(EVENT_ERROR, workspace_id="w", event_id="e", now=0)
    )


def test_each_test_send_is_a_fresh_event_and_unknown_types_are_refused() -> None:
    one, two = (sample_event(EVENT_ERROR, workspace_id="ws_a", now=0.0) for _ in range(2))
    assert one.event_id != two.event_id
    with pytest.raises(ValueError, match="unknown event type"):
        sample_event("account.deleted", workspace_id="ws_a", now=0.0)


def test_an_event_copy_carries_the_exact_bytes() -> None:
    event = sample_event(EVENT_STATUS_CHANGED, workspace_id="ws_a", now=0.0)
    again = from_copy(EventCopy.of(event, "ws_a").model_dump_json().encode())
    assert again == event
