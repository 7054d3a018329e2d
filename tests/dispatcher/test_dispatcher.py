"""The dispatcher on a real broker, delivering to a real receiver on loopback that verifies
every request with ``standardwebhooks``: signed, in version order per account, one webhook-id
per (event, endpoint) across retries, a failing endpoint delays nobody else, 410 disables
(with an ``endpoint.disabled`` note in the endpoint's delivery log)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from tests.conftest import SettingsFactory
from tests.webhooks.support import (
    Receiver,
    create_endpoint,
    endpoint_store,
    new_account,
    publish_events,
    read_log,
    receiving,
    running_dispatcher,
    status_event,
    wait_until,
)
from worker.contract.delivery_log import webhook_id
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration


@pytest.fixture
def settings_for(make_settings: SettingsFactory) -> SettingsFactory:
    def factory(**overrides: Any) -> Any:
        values: dict[str, Any] = {
            "webhook_secrets_key": generate_key(),
            "webhook_allow_http": True,
            "webhook_allow_private_targets": True,
            "webhook_retry_schedule_s": "0.2,0.2,0.2",
            "webhook_timeout_s": 2.0,
        }
        values.update(overrides)
        settings = make_settings(**values)
        return settings.model_copy(
            update={"webhook_consumer_group": f"{settings.kafka_consumer_group}.webhooks"}
        )

    return factory


async def test_signed_ordered_deliveries_with_retries_under_one_id(
    settings_for: SettingsFactory,
) -> None:
    settings = settings_for()
    flaky = Receiver(answer=lambda body, tries: 500 if tries == 0 else 200)
    steady = Receiver()
    accounts = [new_account() for _ in range(4)]
    async with receiving(flaky), receiving(steady), endpoint_store(settings) as store:
        ep_flaky, secret_flaky = await create_endpoint(store, "ws_a", flaky.url)
        ep_steady, secret_steady = await create_endpoint(
            store, "ws_a", steady.url, event_types=("account.auth_status_changed",)
        )
        await create_endpoint(store, "ws_other", steady.url)  # another workspace's
        flaky.secrets.append(secret_flaky)
        steady.secrets.append(secret_steady)
        async with running_dispatcher(settings):
            events = [status_event(a, v) for a in accounts for v in (1, 2, 3)]
            await publish_events(settings, events)
            want = len(events)
            await wait_until(lambda: len(flaky.verified_once()) == want, timeout=30)
            await wait_until(lambda: len(steady.verified_once()) == want, timeout=30)

    for receiver, endpoint in ((flaky, ep_flaky), (steady, ep_steady)):
        assert all(d.verified for d in receiver.seen), "every request carries a valid signature"
        delivered = receiver.verified_once()
        expected_ids = {webhook_id(ev.event_id, endpoint.id) for ev in events}
        assert set(delivered) == expected_ids, "one webhook-id per (event, endpoint)"
        for account in accounts:
            versions = [
                d.body["data"]["version"]
                for d in receiver.seen
                if d.body["data"]["account_id"] == account and 200 <= d.status < 300
            ]
            assert versions == [1, 2, 3], "in version order per (endpoint, account)"
        body = next(iter(delivered.values())).body
        assert body["type"] == "account.auth_status_changed"
        assert set(body) == {"type", "timestamp", "data"}
        assert body["data"]["workspace_id"] == "ws_a"
    retried = [d for d in flaky.seen if d.status == 500]
    assert len(retried) == want, "each first attempt failed and was retried"
    assert {d.webhook_id for d in retried} == set(flaky.verified_once())
    assert len(steady.seen) == want, "the other workspace's endpoint got nothing"


async def test_a_retry_waits_out_its_schedule_step_and_then_comes(
    settings_for: SettingsFactory,
) -> None:
    """The pair's timer is armed once, when its follow-up ends: from the retried head's due
    time, so the next attempt comes then (not at once, not never), and the delivery queued
    behind waits for it."""
    settings = settings_for(webhook_retry_schedule_s="1.0,1.0")
    arrivals: dict[int, list[float]] = {}

    def answer(body: dict[str, Any], tries: int) -> int:
        arrivals.setdefault(body["data"]["version"], []).append(time.monotonic())
        return 500 if body["data"]["version"] == 1 and tries < 2 else 204

    flaky = Receiver(answer=answer)
    account = new_account()
    async with receiving(flaky), endpoint_store(settings) as store:
        _, secret = await create_endpoint(store, "ws_a", flaky.url)
        flaky.secrets.append(secret)
        async with running_dispatcher(settings):
            await publish_events(settings, [status_event(account, v) for v in (1, 2)])
            await wait_until(lambda: len(flaky.verified_once()) == 2, timeout=30)

    first = arrivals[1]
    assert len(first) == 3, "two failed attempts, then the delivery"
    gaps = [later - earlier for earlier, later in itertools.pairwise(first)]
    assert all(gap >= 0.8 - 0.05 for gap in gaps), f"each retry waits its step: {gaps}"
    assert arrivals[2][0] >= first[-1], "the next event waits behind the retried one"


async def test_a_failing_endpoint_delays_no_one_and_gone_disables(
    settings_for: SettingsFactory,
) -> None:
    settings = settings_for(webhook_retry_schedule_s="30")
    gone = Receiver(answer=lambda body, tries: 410)
    down = Receiver(answer=lambda body, tries: 503)
    healthy = Receiver()
    account = new_account()
    async with (
        receiving(gone),
        receiving(down),
        receiving(healthy),
        endpoint_store(settings) as store,
    ):
        ep_gone, s1 = await create_endpoint(store, "ws_a", gone.url)
        _, s2 = await create_endpoint(store, "ws_a", down.url)
        _, s3 = await create_endpoint(store, "ws_a", healthy.url)
        gone.secrets.append(s1)
        down.secrets.append(s2)
        healthy.secrets.append(s3)
        async with running_dispatcher(settings):
            await publish_events(settings, [status_event(account, v) for v in (1, 2)])
            await wait_until(lambda: len(healthy.verified_once()) == 2)
            await wait_until(lambda: len(down.seen) == 1 and len(gone.seen) == 1)
            await wait_until(
                lambda: (
                    (r := store.registry.get("ws_a", ep_gone.id)) is not None
                    and r.status == "disabled"
                )
            )
        disabled = store.registry.get("ws_a", ep_gone.id)
        assert disabled is not None and disabled.disabled_reason is not None
        assert "410" in disabled.disabled_reason
        log = await read_log(settings)
    notes = [entry for entry in log if entry.event_type == "endpoint.disabled"]
    assert [(n.endpoint_id, n.state) for n in notes] == [(ep_gone.id, "failed")]
    assert notes[0].last_error is not None and "410" in notes[0].last_error
    # The 503 endpoint's second event waits behind its first (retry in 30 s): not attempted.
    assert [d.body["data"]["version"] for d in down.seen] == [1]


async def test_an_endpoint_failing_without_a_success_for_the_limit_is_disabled(
    settings_for: SettingsFactory,
) -> None:
    settings = settings_for(
        webhook_retry_schedule_s="0.2,0.2,0.2,0.2,0.2,0.2,0.2,0.2", webhook_disable_after_s=0.6
    )
    down = Receiver(answer=lambda body, tries: 503)
    async with receiving(down), endpoint_store(settings) as store:
        endpoint, secret = await create_endpoint(store, "ws_a", down.url)
        down.secrets.append(secret)
        async with running_dispatcher(settings):
            await publish_events(settings, [status_event(new_account(), 1)])
            await wait_until(
                lambda: (
                    (r := store.registry.get("ws_a", endpoint.id)) is not None
                    and r.status == "disabled"
                )
            )
            attempts = len(down.seen)
            await asyncio.sleep(0.6)  # a disabled endpoint gets no more attempts
            assert len(down.seen) == attempts
        disabled = store.registry.get("ws_a", endpoint.id)
        assert disabled is not None and disabled.disabled_reason is not None
        assert "failing for" in disabled.disabled_reason
    assert attempts >= 3 and all(d.verified for d in down.seen)
