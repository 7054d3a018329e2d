"""Operational events (issue 34, item 6) against the real broker, a dispatcher in this loop
and the front-end: an endpoint the dispatcher disables is announced as ``endpoint.disabled``
(its reason, its last failure) and its re-activation through the API as ``endpoint.enabled``,
each once, signed, to the workspace's other active endpoints that list the type, and to no
one else (not the subject, not an endpoint without the type, not another workspace)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.support import KEY_A, KEY_B, running_api, write_keys
from tests.conftest import SettingsFactory
from tests.webhooks.processes import dispatcher_settings
from tests.webhooks.support import (
    Receiver,
    new_account,
    publish_events,
    receiving,
    running_dispatcher,
    status_event,
    wait_until,
)
from worker.contract.delivery_log import webhook_id
from worker.contract.operational_events import (
    EXAMPLES,
    MODELS,
    EndpointDisabledEvent,
    EndpointEnabledEvent,
    disabled_record,
    enabled_record,
    operational_event_id,
)
from worker.contract.webhook_endpoints import EndpointRecord

pytestmark = pytest.mark.integration

OPS = ["endpoint.disabled", "endpoint.enabled"]


async def create(http: httpx.AsyncClient, key: str, url: str, **body: Any) -> dict[str, Any]:
    resp = await http.post(
        "/v1/webhook-endpoints", json={"url": url, **body}, headers={"X-Api-Key": key}
    )
    assert resp.status_code == 201, resp.text
    return dict(resp.json()["data"])


async def test_disabled_and_enabled_reach_the_workspaces_other_subscribed_endpoints_once(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = dispatcher_settings(
        make_settings,
        api_keys_file=write_keys(tmp_path / "keys.json"),
        webhook_retry_schedule_s="30",
    )
    answers = [410]  # gone until it is fixed, after the disable
    gone = Receiver(answer=lambda body, tries: answers[0])
    watcher = Receiver()
    plain = Receiver()
    elsewhere = Receiver()
    async with (
        receiving(gone),
        receiving(watcher),
        receiving(plain),
        receiving(elsewhere),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        ep_gone = await create(http, KEY_A, gone.url)
        ep_watch = await create(
            http, KEY_A, watcher.url, event_types=["account.auth_status_changed", *OPS]
        )
        ep_plain = await create(http, KEY_A, plain.url)  # every account event, no filter
        ep_else = await create(http, KEY_B, elsewhere.url, event_types=OPS)
        for receiver, endpoint in (
            (gone, ep_gone),
            (watcher, ep_watch),
            (plain, ep_plain),
            (elsewhere, ep_else),
        ):
            receiver.secrets.append(endpoint["secret"])
        registry = api.webhooks.store.registry if api.webhooks else None
        assert registry is not None

        async with running_dispatcher(settings):
            await publish_events(settings, [status_event(new_account(), 1)])
            await wait_until(
                lambda: (
                    (r := registry.get("ws_a", ep_gone["id"])) is not None
                    and r.status == "disabled"
                )
            )
            await wait_until(
                lambda: any(d.body["type"] == "endpoint.disabled" for d in watcher.seen)
            )
            disabled = registry.get("ws_a", ep_gone["id"])
            assert disabled is not None
            answers[0] = 204  # the receiver is fixed, then the endpoint activated again

            activated = await http.post(
                f"/v1/webhook-endpoints/{ep_gone['id']}/activate", headers={"X-Api-Key": KEY_A}
            )
            assert activated.status_code == 200, activated.text
            await wait_until(
                lambda: any(d.body["type"] == "endpoint.enabled" for d in watcher.seen)
            )
            enabled = registry.get("ws_a", ep_gone["id"])
            assert enabled is not None and enabled.status == "active"
            # activating an active endpoint again announces nothing
            again = await http.post(
                f"/v1/webhook-endpoints/{ep_gone['id']}/activate", headers={"X-Api-Key": KEY_A}
            )
            assert again.status_code == 200
            await publish_events(settings, [status_event(new_account(), 1)])
            await wait_until(lambda: len([d for d in watcher.seen if d.status == 204]) >= 4)
            await wait_until(lambda: len([d for d in gone.seen if d.status == 204]) == 1)

    ops = [d for d in watcher.seen if d.body["type"] in OPS]
    assert [d.body["type"] for d in ops] == OPS  # each once, in order
    assert all(d.verified and d.status == 204 for d in ops)
    off = EndpointDisabledEvent.model_validate(ops[0].body)
    on = EndpointEnabledEvent.model_validate(ops[1].body)
    assert off.data.endpoint_id == on.data.endpoint_id == ep_gone["id"]
    assert off.data.workspace_id == "ws_a"
    assert "410" in off.data.reason
    assert [f.status for f in off.data.last_failures] == [410]
    assert off.data.event_id == operational_event_id(
        ep_gone["id"], disabled.revision, "endpoint.disabled"
    )
    assert on.data.event_id == operational_event_id(
        ep_gone["id"], enabled.revision, "endpoint.enabled"
    )
    assert ops[0].webhook_id == webhook_id(off.data.event_id, ep_watch["id"])
    assert ops[1].webhook_id == webhook_id(on.data.event_id, ep_watch["id"])
    # no one else: the subject, an endpoint without the types, another workspace
    assert not [d for d in gone.seen if d.body["type"] in OPS]
    assert not [d for d in plain.seen if d.body["type"] in OPS]
    assert elsewhere.seen == []


def test_one_transition_is_one_event_id_and_every_model_has_a_valid_example() -> None:
    """Announcing a transition again (the endpoint write failed after the announcement, and
    the next failure announces it again) gives the same event id and body, hence the same
    ``webhook-id``: never a second event."""
    endpoint = EndpointRecord(
        id="ep_ops",
        workspace_id="ws_a",
        url="https://example.com/h",
        created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:00Z",
        revision=4,
    )
    first = disabled_record(endpoint, "gone", failing_since=None, failures=[], occurred_at="t")
    again = disabled_record(endpoint, "gone", failing_since=None, failures=[], occurred_at="t")
    assert first == again
    assert first.event_id == operational_event_id("ep_ops", 5, "endpoint.disabled")
    later = disabled_record(endpoint.changed(), "gone", failing_since=None, failures=[])
    assert later.event_id != first.event_id  # a later transition is another event
    assert enabled_record(endpoint).event_id != first.event_id
    for event_type, model in MODELS.items():
        example = EXAMPLES[event_type]
        assert isinstance(example, model)
        assert model.model_validate(example.model_dump(mode="json")) == example
        assert example.model_dump()["type"] == event_type
