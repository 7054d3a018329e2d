"""Tenant isolation in the dispatcher, on the real broker (docs/architecture.md, "Webhook
fan-out"): no workspace can inflate a delivery-state record (a thousand endpoints make a
thousand small records), an event reaches only its own workspace's endpoints (another
workspace's error event on an account takes nothing from the owner), a full queue fails into
the DLQ instead of growing, a hanging endpoint holds at most its share of attempts while its
neighbour gets everything, and records of the old one-per-account form are restored and
migrated."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.conftest import SettingsFactory
from tests.webhooks.processes import dispatcher_settings
from tests.webhooks.support import (
    CountingSender,
    Hanging,
    Receiver,
    bulk_endpoints,
    create_endpoint,
    endpoint_store,
    hanging,
    new_account,
    publish_events,
    read_topic,
    receiving,
    running_dispatcher,
    status_event,
    wait_for_count,
    wait_until,
)
from worker.auth.flow import Policy, decide
from worker.contract.delivery_log import webhook_id
from worker.contract.messages import AccountRecord, AuthError, AuthStatusChanged, PasskeyConfirm
from worker.contract.webhook_events import from_status
from worker.dispatcher.delivery import DeliveryState, Pending, state_key
from worker.dispatcher.delivery_store import AccountDeliveries
from worker.dispatcher.sender import Sender, open_session
from worker.engine.home_partition import home_partition
from worker.engine.kafka import build_producer
from worker.settings import Settings
from worker.webhooks.targets import TargetPolicy

pytestmark = pytest.mark.integration


def settings_for(make_settings: SettingsFactory, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"webhook_retry_schedule_s": "0.2,0.2,0.2,0.2,0.2"}
    values.update(overrides)
    return dispatcher_settings(make_settings, **values)


async def publish_errors(settings: Settings, events: list[AuthError]) -> None:
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        for ev in events:
            await producer.send_and_wait(
                settings.topics.errors, ev.model_dump_json().encode(), key=ev.account_id.encode()
            )
    finally:
        await producer.stop()


def sample(running: Any, name: str, **labels: str) -> float:
    value = running.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else float(value)


def confirm_error(account_id: str, *, owner: str | None, caller: str) -> AuthError:
    """The error event the worker emits when ``caller`` confirms an account of ``owner`` (None:
    an id that does not exist): taken from the worker's own pure decision, so it is exactly
    what the worker writes."""
    now = time.time()
    record = None
    if owner is not None:
        record = AccountRecord(
            account_id=account_id,
            workspace_id=owner,
            status="passkey_confirmation",
            auth_status="passkey_confirmation",
            version=1,
            updated_at=now,
            provider="simulator",
            provider_account_ref="ref",
        )
    command = PasskeyConfirm(
        command_id=f"cmd-{account_id}",
        request_id=f"req-{account_id}",
        workspace_id=caller,
        account_id=account_id,
        issued_at=datetime.now(UTC),
    )
    decision = decide(record, command, now=now, policy=Policy(providers={"simulator"}))
    assert decision.error_event is not None and decision.record is None
    assert decision.reply is not None and decision.reply.http_status == 404
    return decision.error_event


async def test_a_thousand_endpoints_make_a_thousand_small_records(
    make_settings: SettingsFactory,
) -> None:
    """Each (endpoint, account) pair gets a record of its own, small whatever the workspace's
    endpoint count. Every first attempt fails, so every pair waits for its retry and is
    written (a first-time success is never written, and which deliveries wait out the
    event's hold depends on how fast the fan-out goes)."""
    settings = settings_for(make_settings, webhook_timeout_s=10.0)
    crowd = Receiver(answer=lambda body, tries: 500 if tries == 0 else 204)
    other = Receiver()
    big_account, other_account = new_account(), new_account()
    async with receiving(crowd), receiving(other), endpoint_store(settings) as store:
        endpoints, secret = await bulk_endpoints(settings, "ws_big", crowd.url, 1000)
        crowd.secrets.append(secret)
        _, other_secret = await create_endpoint(store, "ws_other", other.url)
        other.secrets.append(other_secret)
        async with running_dispatcher(settings) as running:
            big_events = [status_event(big_account, v, workspace="ws_big") for v in (1, 2)]
            await publish_events(
                settings, [*big_events, status_event(other_account, 1, workspace="ws_other")]
            )
            await wait_until(lambda: len(other.verified_once()) == 1, timeout=60)
            await wait_for_count(lambda: len(crowd.verified_once()), 2000)
            assert not running.task.done(), "the dispatcher keeps running"
        records = await read_topic(settings, settings.topics.webhook_state)

    assert all(d.verified for d in crowd.seen + other.seen)
    sizes = [len(r.value) for r in records if r.value is not None]
    keys = {r.key.decode() for r in records}
    pairs = {state_key(e.id, big_account) for e in endpoints}
    assert keys - pairs <= {k for k in keys if k.endswith(f"/{other_account}")}, "pairs only"
    assert pairs <= keys, "every pair that waited for its retry was written, under its own key"
    assert big_account not in keys, "no record keyed by the account alone"
    assert max(sizes) <= settings.webhook_pair_max_bytes, "the configured bound"
    # what a record holds does not grow with the workspace's endpoint count: at most the
    # pair's own two deliveries and its dedup window
    assert max(sizes) < 8 * 1024, max(sizes)
    # each endpoint got the account's two events in their order, the second only once the
    # first was delivered
    version_of = {
        webhook_id(ev.event_id, e.id): (e.id, ev.version) for e in endpoints for ev in big_events
    }
    versions: dict[str, list[int]] = {e.id: [] for e in endpoints}
    for d in crowd.seen:
        endpoint_id, version = version_of[d.webhook_id]
        versions[endpoint_id].append(version)
    assert all(v == [1, 1, 2, 2] for v in versions.values()), "failed once, then delivered"


async def test_an_event_reaches_only_its_own_workspaces_endpoints(
    make_settings: SettingsFactory,
) -> None:
    settings = settings_for(make_settings)
    owner_hook = Receiver()
    caller_hook = Receiver()
    account, unknown = new_account(), new_account()
    async with receiving(owner_hook), receiving(caller_hook), endpoint_store(settings) as store:
        ep_a, secret_a = await create_endpoint(store, "ws_a", owner_hook.url)
        owner_hook.secrets.append(secret_a)
        ep_b, secret_b = await create_endpoint(store, "ws_b", caller_hook.url)
        caller_hook.secrets.append(secret_b)
        # ws_b confirms ws_a's account first (answered 404), then ws_a's flow goes on; ws_b
        # also confirms an id that does not exist
        foreign = confirm_error(account, owner="ws_a", caller="ws_b")
        own = confirm_error(unknown, owner=None, caller="ws_b")
        assert foreign.workspace_id == "ws_b"
        async with running_dispatcher(settings):
            await publish_errors(settings, [foreign])
            await wait_until(lambda: len(caller_hook.verified_once()) == 1)
            statuses = [status_event(account, v, workspace="ws_a") for v in (1, 2, 3)]
            await publish_events(settings, statuses)
            await publish_errors(settings, [own])
            await wait_until(lambda: len(owner_hook.verified_once()) == 3)
            await wait_until(lambda: len(caller_hook.verified_once()) == 2)
        log = await read_topic(settings, settings.topics.webhook_deliveries)

    owner_got = owner_hook.verified_once()
    assert set(owner_got) == {webhook_id(ev.event_id, ep_a.id) for ev in statuses}
    assert [d.body["data"]["version"] for d in owner_hook.seen] == [1, 2, 3]
    assert all(d.body["data"]["workspace_id"] == "ws_a" for d in owner_hook.seen)
    caller_got = caller_hook.verified_once()
    assert set(caller_got) == {
        webhook_id(foreign.event_id, ep_b.id),
        webhook_id(own.event_id, ep_b.id),
    }
    assert all(d.body["data"]["workspace_id"] == "ws_b" for d in caller_hook.seen)
    assert all(d.body["type"] == "account.auth_error" for d in caller_hook.seen)
    # what ws_b hears of another's account is what it hears of one that does not exist
    ids = {"account_id", "event_id", "command_id", "request_id"}
    shapes = [
        ({k: v for k, v in d.body["data"].items() if k not in ids and k != "occurred_at"})
        for d in caller_hook.seen
    ]
    assert shapes[0] == shapes[1]
    entries = [r for r in log if r.value is not None]
    workspaces = {(r.key.decode(), b'"workspace_id":"ws_a"' in r.value) for r in entries}
    assert workspaces == {(ep_a.id, True), (ep_b.id, False)}, "each log entry its endpoint's"


async def test_a_full_queue_fails_new_deliveries_into_the_dlq(
    make_settings: SettingsFactory,
) -> None:
    settings = settings_for(
        make_settings, webhook_retry_schedule_s="30", webhook_pair_max_pending=2
    )
    down = Receiver(answer=lambda body, tries: 503)
    account = new_account()
    async with receiving(down), endpoint_store(settings) as store:
        endpoint, secret = await create_endpoint(store, "ws_a", down.url)
        down.secrets.append(secret)
        async with running_dispatcher(settings) as running:
            events = [status_event(account, v) for v in range(1, 6)]
            await publish_events(settings, events)
            await wait_until(
                lambda: sample(running, "passkey_webhook_deliveries_refused_total") == 3
            )
            dlq = await read_topic(settings, settings.topics.webhook_dlq)
            state = [
                r for r in await read_topic(settings, settings.topics.webhook_state) if r.value
            ]

    refused = {dict(r.headers)["webhook.id"] for r in dlq}
    assert refused == {webhook_id(ev.event_id, endpoint.id).encode() for ev in events[2:]}
    assert {dict(r.headers)["webhook.last_error"] for r in dlq} == {b"queue_full"}
    last = DeliveryState.model_validate_json(state[-1].value)
    assert [p.version for p in last.queue] == [1, 2], "the first two keep their place"
    assert [d.body["data"]["version"] for d in down.seen] == [1], "v2 waits behind v1's retry"


async def test_a_hanging_endpoint_holds_its_share_and_its_neighbour_gets_everything(
    make_settings: SettingsFactory,
) -> None:
    share = 3
    settings = settings_for(
        make_settings,
        webhook_timeout_s=1.0,
        webhook_endpoint_max_in_flight=share,
        webhook_max_in_flight=24,  # the loop's lanes: fewer than the hanging pairs
    )
    healthy = Receiver()
    stuck = Hanging()
    accounts = [new_account() for _ in range(40)]
    session = open_session(TargetPolicy.of(settings))
    sender = CountingSender(Sender(session, timeout_s=settings.webhook_timeout_s))
    try:
        async with (
            receiving(healthy),
            hanging(stuck),
            endpoint_store(settings) as store,
        ):
            ep_ok, secret = await create_endpoint(store, "ws_a", healthy.url)
            healthy.secrets.append(secret)
            await create_endpoint(store, "ws_a", stuck.url)
            async with running_dispatcher(settings, sender=sender) as running:
                events = [status_event(a, 1) for a in accounts]
                await publish_events(settings, events)
                await wait_until(lambda: len(healthy.verified_once()) == len(events), timeout=60)
                deferred = sample(
                    running, "passkey_webhook_attempts_deferred_total", reason="capacity"
                )
    finally:
        await session.close()

    assert set(healthy.verified_once()) == {webhook_id(ev.event_id, ep_ok.id) for ev in events}
    assert 1 <= sender.peak[stuck.url] <= share, sender.peak
    assert stuck.max_open <= share
    assert deferred > 0, "the hanging endpoint's other pairs waited without a lane"


async def test_a_pair_woken_for_a_freed_slot_is_attempted_at_once_not_at_the_next_tick(
    make_settings: SettingsFactory,
) -> None:
    """An endpoint of one slot and eight accounts' events: each pair waits in the endpoint's
    line and is woken when the attempt before it ends, and the loop looks for it at once
    (``ConsumeLoop.sweep_soon``), not at its next timer sweep. The sweep is stretched to a
    minute here (past the setting's bound of 1 s) so that a wake cannot pass for a tick:
    before, each woken pair waited for one."""
    settings = settings_for(make_settings, webhook_endpoint_max_in_flight=1)
    settings = settings.model_copy(update={"webhook_timer_interval_s": 60.0})
    receiver = Receiver()
    accounts = [new_account() for _ in range(8)]
    async with receiving(receiver), endpoint_store(settings) as store:
        ep, secret = await create_endpoint(store, "ws_a", receiver.url)
        receiver.secrets.append(secret)
        async with running_dispatcher(settings) as running:
            events = [status_event(a, 1) for a in accounts]
            await publish_events(settings, events)
            await wait_until(lambda: len(receiver.verified_once()) == len(events), timeout=45)
            waited = sample(running, "passkey_webhook_attempts_deferred_total", reason="capacity")
    assert set(receiver.verified_once()) == {webhook_id(ev.event_id, ep.id) for ev in events}
    assert waited > 0, "pairs waited in the endpoint's line for its one slot"


def legacy_pending(event: AuthStatusChanged, endpoint_id: str) -> Pending:
    hook = from_status(event.model_dump_json().encode())
    return Pending(
        webhook_id=webhook_id(hook.event_id, endpoint_id),
        event_type=hook.event_type,
        event_id=hook.event_id,
        version=hook.version,
        body=hook.body,
        occurred_at=hook.occurred_at,
        enqueued_at=time.time(),
        next_attempt_at=time.time(),
    )


async def test_old_form_records_are_restored_delivered_and_migrated(
    make_settings: SettingsFactory,
) -> None:
    settings = settings_for(make_settings)
    hook = Receiver()
    account = new_account()
    async with receiving(hook), endpoint_store(settings) as store:
        endpoint, secret = await create_endpoint(store, "ws_a", hook.url)
        hook.secrets.append(secret)
        events = [status_event(account, v) for v in (1, 2, 3)]
        # as the previous version wrote it: every endpoint's queue in one record, labelled
        # with the workspace of the account's first event (here another workspace's)
        queue = tuple(legacy_pending(ev, endpoint.id) for ev in events[:2])
        old = AccountDeliveries(
            account_id=account,
            workspace_id="ws_b",
            endpoints={
                endpoint.id: DeliveryState(
                    endpoint_id=endpoint.id,
                    account_id=account,
                    workspace_id="ws_b",
                    queue=queue,
                    seen=tuple(p.webhook_id for p in queue),
                )
            },
        )
        partition = home_partition(account.encode(), settings.other_partitions)
        producer = build_producer(settings.kafka_config())
        await producer.start()
        try:
            await producer.send_and_wait(
                settings.topics.webhook_state,
                old.model_dump_json().encode(),
                key=account.encode(),
                partition=partition,
            )
        finally:
            await producer.stop()
        async with running_dispatcher(settings) as running:
            await wait_until(lambda: len(hook.verified_once()) == 2)
            await wait_until(lambda: sample(running, "passkey_webhook_state_migrated_total") == 1)
            await publish_events(settings, [events[2]])
            await wait_until(lambda: len(hook.verified_once()) == 3)
        records = await read_topic(settings, settings.topics.webhook_state)

    assert [d.body["data"]["version"] for d in hook.seen] == [1, 2, 3]
    assert set(hook.verified_once()) == {webhook_id(ev.event_id, endpoint.id) for ev in events}
    latest: dict[str, bytes | None] = {}
    for r in records:
        assert r.partition == partition, "pairs live in their account's partition"
        latest[r.key.decode()] = r.value
    assert latest[account] is None, "the old record is tombstoned"
    assert latest[state_key(endpoint.id, account)] is None, "a done pair is tombstoned"
