"""Polling and webhooks agree (issue 34, item 5): an account's events read from
``GET /v1/accounts/{account_id}/events`` carry the same event ids, versions and bodies as the
webhooks an endpoint received, after the dispatcher process was SIGKILLed mid-stream and
restarted, and after a replay re-sent them (followed to ``done`` through
``GET .../replays/{replay_id}``). Real broker, a real dispatcher process, the front-end in
this loop."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.support import KEY_A, produce, running_api, write_keys
from tests.api.webhooks.test_routes import error_event
from tests.conftest import SettingsFactory
from tests.webhooks.processes import DispatcherPool, dispatcher_settings
from tests.webhooks.support import Receiver, new_account, receiving, status_event, wait_until
from worker.contract.delivery_log import webhook_id

pytestmark = [pytest.mark.slow, pytest.mark.integration]

HEADERS = {"X-Api-Key": KEY_A}


async def poll_all(http: httpx.AsyncClient, account: str, since: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    params: dict[str, Any] = {"since": since, "limit": 3}
    for _ in range(100):
        resp = await http.get(f"/v1/accounts/{account}/events", params=params, headers=HEADERS)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        out += body["data"]
        params = {"cursor": body["next_cursor"], "limit": 3}
        if not body["has_more"]:
            return out
    raise AssertionError("no end")


async def test_polled_events_and_delivered_webhooks_agree_after_a_crash_and_a_replay(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = dispatcher_settings(
        make_settings,
        partitions=2,
        api_keys_file=write_keys(tmp_path / "keys.json"),
        webhook_retry_schedule_s="0.2,0.5,1",
    )
    receiver = Receiver()
    account = new_account()
    start = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    before = [status_event(account, v) for v in (1, 2, 3)]
    after = [status_event(account, v) for v in (4, 5)]
    errors = [error_event(account, "ws_a", datetime.now(UTC)) for _ in range(2)]
    pool = DispatcherPool(settings, 1, tmp_path)
    async with (
        receiving(receiver),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        created = await http.post(
            "/v1/webhook-endpoints", json={"url": receiver.url}, headers=HEADERS
        )
        assert created.status_code == 201, created.text
        endpoint = created.json()["data"]
        receiver.secrets.append(endpoint["secret"])
        try:
            pool.start(0)
            await pool.wait_ready()
            await produce(settings, settings.topics.status, _records(before))
            await produce(settings, settings.topics.errors, _records(errors[:1]))
            await wait_until(lambda: len(receiver.verified_once()) >= 2, timeout=30)
            pool.signal(0, signal.SIGKILL)  # mid-stream: some delivered, some maybe not
            await produce(settings, settings.topics.status, _records(after))
            await produce(settings, settings.topics.errors, _records(errors[1:]))
            pool.start(0)
            await pool.wait_ready()
            await wait_until(lambda: len(receiver.verified_once()) == 7, timeout=60)

            sent_before = len(receiver.seen)
            accepted = await http.post(
                f"/v1/webhook-endpoints/{endpoint['id']}/replay",
                json={"since": start},
                headers=HEADERS,
            )
            assert accepted.status_code == 202, accepted.text
            replay_id = accepted.json()["data"]["replay_id"]
            path = f"/v1/webhook-endpoints/{endpoint['id']}/replays/{replay_id}"
            for _ in range(300):
                state = (await http.get(path, headers=HEADERS)).json()["data"]
                if state["state"] in ("done", "failed", "cancelled"):
                    break
                await asyncio.sleep(0.1)
            assert (state["state"], state["events_found"], state["events_sent"]) == ("done", 7, 7)
            await wait_until(lambda: len(receiver.seen) >= sent_before + 7, timeout=60)
        finally:
            pool.close()

        polled = await poll_all(http, account, start)

    delivered = receiver.verified_once()
    by_event = {d.body["data"]["event_id"]: d for d in delivered.values()}
    assert len(polled) == 7 == len(by_event)
    assert [e["event_id"] for e in polled if e["version"] is not None] == [
        e.event_id for e in (*before, *after)
    ]
    for event in polled:
        webhook = by_event[event["event_id"]]
        assert webhook.webhook_id == webhook_id(event["event_id"], endpoint["id"])
        assert webhook.body == event["body"]
        assert webhook.body["data"].get("version") == event["version"]
    # every send of one event, the replay's included, carried the same id and the same body
    for d in receiver.seen:
        first = by_event[d.body["data"]["event_id"]]
        assert (d.webhook_id, json.dumps(d.body)) == (first.webhook_id, json.dumps(first.body))


def _records(events: list[Any]) -> list[tuple[bytes, bytes]]:
    return [(e.account_id.encode(), e.model_dump_json().encode()) for e in events]
