"""Endpoints that heal, part 2 (issue 49), against the real broker, a dispatcher in this loop and
a loopback receiver: a probe's 2xx re-enables an endpoint with ``recovery.replaying``, and the
dispatcher replays the events it missed since ``disabled_at`` under the webhook-ids their failed
deliveries carried, in each account's order, its progress on the replay board; a dispatcher
that stopped before clearing it replays again under the same replay id; none when the owner
turned recovery off."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import SettingsFactory
from tests.webhooks.processes import dispatcher_settings
from tests.webhooks.support import (
    Receiver,
    endpoint_of,
    endpoint_store,
    new_account,
    publish_events,
    read_topic,
    receiving,
    running_dispatcher,
    status_event,
    wait_until,
)
from worker.api.presence import Presence
from worker.api.webhooks.replay_status import ReplayBoard
from worker.contract.delivery_log import webhook_id
from worker.contract.webhook_endpoints import EndpointRecord, Recovery
from worker.dispatcher.disabling import ProbeConfig
from worker.dispatcher.dispatch_ports import Ports
from worker.dispatcher.probing import Prober
from worker.engine.kafka import build_producer
from worker.webhooks.endpoint_writes import EndpointStore
from worker.webhooks.replay_scan import (
    ReplayProgress,
    ReplayScan,
    progress_record,
    recovery_replay_id,
)

pytestmark = pytest.mark.integration


def record(store: EndpointStore, endpoint_id: str) -> EndpointRecord:
    found = store.registry.get("ws_a", endpoint_id)
    assert found is not None
    return found


def delivered(receiver: Receiver) -> list[Any]:
    """The events (not probes) the receiver took with a 2xx, in arrival order."""
    return [
        d for d in receiver.seen if 200 <= d.status < 300 and d.body["type"] != "endpoint.probe"
    ]


async def progress_of(settings: Any, replay_id: str) -> list[ReplayProgress]:
    return [
        ReplayProgress.model_validate_json(r.value)
        for r in await read_topic(settings, settings.topics.api_presence)
        if r.key == replay_id.encode() and r.value is not None
    ]


async def test_a_recovered_endpoint_receives_what_it_missed_under_its_webhook_ids_in_order(
    make_settings: SettingsFactory,
) -> None:
    settings = dispatcher_settings(
        make_settings,
        webhook_retry_schedule_s="30",
        webhook_probe_first_s=0.5,
        webhook_probe_max_s=0.5,
    )
    healed = [False]
    target = Receiver(answer=lambda body, _: 204 if healed[0] else 410)
    watcher = Receiver()  # an active endpoint of the workspace: sees when events were read
    accounts = [new_account(), new_account()]
    async with receiving(target), receiving(watcher), endpoint_store(settings) as store:
        ep = await endpoint_of(store, target)
        await endpoint_of(store, watcher, event_types=("account.auth_status_changed",))
        async with running_dispatcher(settings):
            await publish_events(settings, [status_event(new_account(), 1)])  # 410: disabled
            await wait_until(lambda: record(store, ep.id).status == "disabled")
            missed = [status_event(a, v) for v in (1, 2, 3) for a in accounts]
            await publish_events(settings, missed)
            # read by the dispatcher while it was disabled: not a target, nothing sent
            await wait_until(lambda: len(delivered(watcher)) == 1 + len(missed))
            healed[0] = True
            await wait_until(lambda: len(delivered(target)) >= len(missed), 30.0)
            await wait_until(lambda: not record(store, ep.id).replaying)
        healed_record = record(store, ep.id)
        assert healed_record.recovery is not None and healed_record.recovery.replay_id
        progress = await progress_of(settings, healed_record.recovery.replay_id)

    got = delivered(target)
    # every missed event, under the webhook-id it would have had (the watcher's are its own)
    assert {d.webhook_id for d in got} == {webhook_id(e.event_id, ep.id) for e in missed}
    assert len(got) == len(missed)
    for account in accounts:  # each account's events in their order
        versions = [
            d.body["data"]["version"] for d in got if d.body["data"]["account_id"] == account
        ]
        assert versions == [1, 2, 3]
    recovery = healed_record.recovery
    assert healed_record.status == "active" and recovery.replaying is False
    assert recovery.replay_id == recovery_replay_id(ep.id, recovery.disabled_at)
    # readable as the front-end's replays are: its last progress record says done
    assert progress and progress[-1].state == "done" and progress[-1].recovery
    assert progress[-1].events_sent == len(missed) and progress[-1].endpoint_id == ep.id


async def test_events_arriving_during_a_recovery_reach_the_receiver_after_what_it_missed(
    make_settings: SettingsFactory,
) -> None:
    """Issue 49: the accounts' events keep arriving, one a version every 50 ms, from before
    the disable to well after the recovery's replay was queued; each account's events reach the
    receiver (the first delivery of each webhook-id) in version order, none missing. A live
    delivery waits while the replay is queued, then until this dispatcher has taken
    webhook.replays in to where it ended (``recovery.replays_end``)."""
    settings = dispatcher_settings(
        make_settings,
        webhook_retry_schedule_s="30",
        webhook_probe_first_s=0.5,
        webhook_probe_max_s=0.5,
    )
    healed = [False]
    target = Receiver(answer=lambda body, _: 204 if healed[0] else 410)
    accounts = [new_account() for _ in range(3)]
    published: dict[str, list[str]] = {a: [] for a in accounts}
    after_recovery = [0]  # rounds published since the replay was queued

    async def keep_publishing(producer: Any, ep_id: str) -> None:
        for version in range(1, 400):  # bounded: ~20 s of rounds at most
            for account in accounts:
                event = status_event(account, version)
                await producer.send_and_wait(
                    settings.topics.status, event.model_dump_json().encode(),
                    key=account.encode(),
                )  # fmt: skip
                published[account].append(webhook_id(event.event_id, ep_id))
            if version == 3:
                healed[0] = True  # 1-3 missed while disabled; the probe re-enables it
            recovery = record(store, ep_id).recovery
            after_recovery[0] += bool(recovery and recovery.replay_id and not recovery.replaying)
            if after_recovery[0] >= 20:
                return
            await asyncio.sleep(0.05)

    async with receiving(target), endpoint_store(settings) as store:
        ep = await endpoint_of(store, target)
        async with running_dispatcher(settings):
            await publish_events(settings, [status_event(new_account(), 1)])  # 410: disabled
            await wait_until(lambda: record(store, ep.id).status == "disabled")
            producer = build_producer(settings.kafka_config())
            await producer.start()
            try:
                await keep_publishing(producer, ep.id)
            finally:
                await producer.stop()
            want = {w for ids in published.values() for w in ids}
            await wait_until(lambda: want <= {d.webhook_id for d in delivered(target)}, 60.0)

    assert after_recovery[0] >= 20, "the recovery's replay was queued while events arrived"
    for account, ids in published.items():
        firsts = list(dict.fromkeys(d.webhook_id for d in delivered(target)))
        mine = [w for w in firsts if w in set(ids)]
        versions = [ids.index(w) + 1 for w in mine]
        assert versions == list(range(1, len(ids) + 1)), (account, versions)


async def test_a_recovery_left_unfinished_is_replayed_again_under_the_same_id(
    make_settings: SettingsFactory,
) -> None:
    """The record as a dispatcher stopped (or killed) between the re-enable and the end of its
    replay leaves it: active, ``replaying``. The next dispatcher replays under the same id."""
    settings = dispatcher_settings(make_settings, webhook_retry_schedule_s="30")
    target = Receiver()
    account = new_account()
    async with receiving(target), endpoint_store(settings) as store:
        ep = await endpoint_of(store, target)
        disabled_at = time.time() - 1.0
        events = [status_event(account, v) for v in (1, 2)]
        await publish_events(settings, events)  # occurred while it was disabled
        rid = recovery_replay_id(ep.id, disabled_at)
        left = Recovery(
            disabled_at=disabled_at, interval_s=1.0, replay_id=rid, replaying=True, probes=1
        )
        await store.update(ep, recovery=left)  # active: as the re-enable wrote it
        async with running_dispatcher(settings):
            await wait_until(lambda: not record(store, ep.id).replaying, 30.0)
            await wait_until(lambda: len(delivered(target)) >= 4)
        progress = await progress_of(settings, rid)

    # live (its first delivery) and replayed: the same two webhook-ids, the replay's id kept
    assert {d.webhook_id for d in delivered(target)} == {
        webhook_id(e.event_id, ep.id) for e in events
    }
    assert record(store, ep.id).recovery.replay_id == rid  # type: ignore[union-attr]
    assert progress and progress[-1].state == "done" and progress[-1].events_sent == 2


async def test_no_replay_when_the_owner_turned_recovery_off(
    make_settings: SettingsFactory,
) -> None:
    settings = dispatcher_settings(make_settings)
    async with endpoint_store(settings) as store:
        ep, _ = await store.create(
            "ws_a", url="http://127.0.0.1:9/", event_types=None, description=None
        )
        left = Recovery(disabled_at=1.0, interval_s=1.0, replay_id="rp_" + "0" * 32, replaying=True)
        on = await store.update(ep, recovery=left)
        prober = Prober(
            ports=Ports(store.registry, store, None, None, None),  # type: ignore[arg-type]
            owns=lambda _: True,
            config=ProbeConfig(),
            scan=ReplayScan(
                consumer_factory=lambda: None,
                producer=None,
                topics=settings.topics,
            ),
        )
        await wait_until(lambda: record(store, ep.id).revision == on.revision)
        assert [e.id for e in prober.due(time.time())] == [ep.id]  # the control
        off = await store.update(on, auto_recover=False)
        await wait_until(lambda: record(store, ep.id).revision == off.revision)
        assert not record(store, ep.id).replaying
        assert prober.due(time.time()) == []


async def test_a_stalled_recovery_replay_says_a_dispatcher_stopped_and_that_it_resumes() -> None:
    """A replay board read: a recovery's replay whose notes stopped is not said to be a
    front-end replica's, and is said to be resumed (the marker stays set)."""
    now = time.time()
    board = ReplayBoard(Presence(None, "api.presence", None), clock=lambda: now + 60)
    stamp = "2026-01-01T00:00:00Z"
    ep = EndpointRecord(
        id="ep_a", workspace_id="ws_a", url="http://x/", created_at=stamp, updated_at=stamp,
        revision=1,
    )  # fmt: skip
    since = datetime.fromtimestamp(now, UTC)
    for rid, recovery in (("rp_" + "1" * 32, True), ("rp_" + "2" * 32, False)):
        record = progress_record(rid, ep, since, "running", now, recovery=recovery)
        board.take(SimpleNamespace(key=rid.encode(), value=record.model_dump_json().encode()))
    recovered = board.get("ws_a", "ep_a", "rp_" + "1" * 32)
    fronted = board.get("ws_a", "ep_a", "rp_" + "2" * 32)
    assert recovered is not None and recovered.state == "failed" and recovered.error
    assert "dispatcher" in recovered.error and "resumes" in recovered.error
    assert (
        fronted is not None and fronted.error == "the front-end replica running the replay stopped"
    )
