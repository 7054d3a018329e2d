"""Example events of every type the service sends, built from the same models and the same
rendering as the real ones (the catalogue's, ``worker.webhooks.event_types``), for
``POST .../test`` (a test send).
A test send's body is marked ``"test": true`` at the top level of the Standard Webhooks
envelope, beside ``type``, ``timestamp`` and ``data``: ``data`` stays exactly the event's
published schema, and receivers that do not know the field ignore it (the envelope allows
more properties; docs/api.md, "Sending a test")."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Final

from worker.contract.messages import AuthError, AuthStatusChanged, ErrorBody, rfc3339
from worker.contract.operational_events import EXAMPLES as OPERATIONAL_EXAMPLES
from worker.contract.webhook_endpoints import EVENT_ERROR, EVENT_STATUS_CHANGED, EVENT_TYPES
from worker.contract.webhook_events import WebhookEvent
from worker.webhooks.event_types import EVENT_CATALOGUE

TEST_ACCOUNT: Final = "acc_test_send"
"""The account id of every test event: its own (endpoint, account) lane, so a test send
waits behind no real account's deliveries and delays none."""
TEST_MARK: Final = "test"
"""The envelope field that marks a test send (``true``)."""


def new_test_event_id() -> str:
    """``evt_test_`` + 32 hex characters: a fresh event, so a fresh webhook-id per test."""
    return f"evt_test_{uuid.uuid4().hex}"


def example_record(event_type: str, *, workspace_id: str, event_id: str, now: float) -> bytes:
    """An example record of ``event_type`` as auth.status / auth.errors carry it."""
    occurred_at = rfc3339(now)
    record: AuthStatusChanged | AuthError
    if event_type == EVENT_STATUS_CHANGED:
        record = AuthStatusChanged(
            event_id=event_id,
            account_id=TEST_ACCOUNT,
            workspace_id=workspace_id,
            previous_status="pending",
            status="active",
            auth_status="authenticated",
            version=1,
            occurred_at=occurred_at,
        )
    elif event_type == EVENT_ERROR:
        record = AuthError(
            event_id=event_id,
            account_id=TEST_ACCOUNT,
            workspace_id=workspace_id,
            command_id=None,
            request_id=None,
            http_status=409,
            error=ErrorBody(
                code="account_allocation_busy",
                numeric_code=20011,
                message="Account allocation lock is held; retry after a short delay.",
            ),
            occurred_at=occurred_at,
        )
    else:
        raise ValueError(f"unknown event type; one of {', '.join(EVENT_TYPES)}")
    return record.model_dump_json().encode()


def sample_event(event_type: str, *, workspace_id: str, now: float) -> WebhookEvent:
    """An example event of ``event_type``, rendered as the dispatcher renders real ones,
    with ``"test": true`` in its envelope; raises ``ValueError`` for an unknown type."""
    event_id = new_test_event_id()
    if event_type in OPERATIONAL_EXAMPLES:
        record = _operational_record(
            event_type, workspace_id=workspace_id, event_id=event_id, now=now
        )
    else:
        record = example_record(event_type, workspace_id=workspace_id, event_id=event_id, now=now)
    event = next(t for t in EVENT_CATALOGUE if t.name == event_type).render(record)
    envelope = json.loads(event.body)
    envelope[TEST_MARK] = True
    body = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False)
    return dataclasses.replace(event, account_id=TEST_ACCOUNT, workspace_id=workspace_id, body=body)


def _operational_record(event_type: str, *, workspace_id: str, event_id: str, now: float) -> bytes:
    """An operational event's example (its body is its own model), made this workspace's and
    this moment's."""
    occurred_at = rfc3339(now)
    example = OPERATIONAL_EXAMPLES[event_type]
    data = example.data.model_copy(  # type: ignore[attr-defined]
        update={"event_id": event_id, "workspace_id": workspace_id, "occurred_at": occurred_at}
    )
    return (
        example.model_copy(update={"timestamp": occurred_at, "data": data})
        .model_dump_json()
        .encode()
    )


__all__ = ["TEST_ACCOUNT", "TEST_MARK", "example_record", "new_test_event_id", "sample_event"]
