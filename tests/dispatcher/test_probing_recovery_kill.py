"""A dispatcher process killed (SIGKILL) while its recovery replay is queuing the events an
endpoint missed (issue 49, "done when"): the record still says ``replaying``, so the next
process scans again under the same replay id; the receiver gets every missed event at least
once, each under the one webhook-id it would have had (docs/architecture.md, "Endpoints that
heal")."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import SettingsFactory
from tests.webhooks.processes import DispatcherPool, dispatcher_settings
from tests.webhooks.support import (
    Receiver,
    endpoint_of,
    endpoint_store,
    new_account,
    read_topic,
    receiving,
    status_event,
    wait_until,
)
from worker.contract.delivery_log import Replay, webhook_id
from worker.contract.messages import AuthStatusChanged
from worker.contract.webhook_endpoints import EndpointRecord, Recovery
from worker.engine.kafka import build_producer
from worker.settings import Settings
from worker.webhooks.replay_scan import recovery_replay_id

pytestmark = pytest.mark.integration

MISSED = 120  # the endpoint's events while disabled, 6 accounts x 20 versions
NOISE = 12_000  # another workspace's events around them: what makes the scan take a while


async def publish_bulk(settings: Settings, events: list[AuthStatusChanged]) -> None:
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        sent = [
            await producer.send(
                settings.topics.status,
                e.model_dump_json().encode(),
                key=e.account_id.encode(),
            )
            for e in events
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def queued(settings: Settings, replay_id: str) -> int:
    """Records of ``replay_id`` on webhook.replays now."""
    records = await read_topic(settings, settings.topics.webhook_replays)
    return sum(
        1
        for r in records
        if r.value is not None and b"webhook_replay" in r.value
        if Replay.model_validate_json(r.value).replay_id == replay_id
    )


async def test_a_dispatcher_killed_mid_recovery_replay_is_finished_by_the_next(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = dispatcher_settings(make_settings, webhook_retry_schedule_s="30")
    target, watcher = Receiver(), Receiver()  # watcher: an active endpoint, sees what was read
    disabled_at = time.time() - 1.0  # before the events: they occur while it is disabled
    accounts = [new_account() for _ in range(6)]
    missed = [status_event(a, v) for v in range(1, MISSED // 6 + 1) for a in accounts]
    noise = [status_event(new_account(), 1, workspace="ws_b") for _ in range(NOISE)]
    step = NOISE // MISSED
    mixed = [e for i, m in enumerate(missed) for e in (m, *noise[i * step : (i + 1) * step])]
    pool = DispatcherPool(settings, 1, tmp_path, WEBHOOK_PROBE_FIRST_S="0.5")
    async with receiving(target), receiving(watcher), endpoint_store(settings) as store:
        ep = await endpoint_of(store, target)
        await endpoint_of(store, watcher, event_types=("account.auth_status_changed",))
        off = Recovery(disabled_at=disabled_at, interval_s=3600.0)  # no probe until we say
        await store.update(ep, status="disabled", recovery=off)
        rid = recovery_replay_id(ep.id, disabled_at)

        def current() -> EndpointRecord:
            record = store.registry.get("ws_a", ep.id)
            assert record is not None
            return record

        try:
            pool.start(0)
            await pool.wait_ready()
            await publish_bulk(settings, mixed)
            # read by the dispatcher while the endpoint was disabled: missed, nothing sent to it
            await wait_until(lambda: len(watcher.verified_once()) == MISSED, 90.0)
            assert target.seen == []
            due = off.model_copy(update={"next_probe_at": time.time()})
            await store.update(current(), recovery=due)
            await wait_until(lambda: current().replaying, 30.0)  # probed (204), re-enabled
            deadline = time.monotonic() + 60.0
            while (at_kill := await queued(settings, rid)) == 0:
                assert time.monotonic() < deadline, "the recovery replay queued nothing"
            pool.signal(0, signal.SIGKILL)  # mid-queue: the scan had written its first record(s)
            at_kill = await queued(settings, rid)
            assert current().replaying  # the kill left the marker set
            pool.start(0)
            await pool.wait_ready()
            await wait_until(lambda: not current().replaying, 90.0)
            await wait_until(lambda: len(target.verified_once()) >= MISSED, 90.0)
            total = await queued(settings, rid)
        finally:
            pool.close()

    expected = {(e.account_id, e.version): webhook_id(e.event_id, ep.id) for e in missed}
    ids_of: dict[tuple[str, int], set[str]] = defaultdict(set)
    got = [d for d in target.seen if 200 <= d.status < 300 and d.body["type"] != "endpoint.probe"]
    for d in got:
        ids_of[d.body["data"]["account_id"], d.body["data"]["version"]].add(d.webhook_id)
    assert set(ids_of) == set(expected)  # every missed event, at least once
    assert all(ids == {expected[event]} for event, ids in ids_of.items())  # never a second id
    assert current().recovery.replay_id == rid  # type: ignore[union-attr]
    # the numbers, for the record: records queued before the kill, in all, and the deliveries
    # beyond one per event (at-least-once: the same webhook-id again)
    print(f"queued at kill {at_kill}/{MISSED}, in all {total}, duplicates {len(got) - MISSED}")
    assert at_kill > 0 and total >= MISSED
