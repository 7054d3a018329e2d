"""A recovery replay's time budget (issue 49): past it the scan stops between fetches, the
record keeps ``replaying`` and notes where it stopped (``recovery.resume``), and the next sweep
reads on from there under the same replay id until every missed event is queued
(docs/architecture.md, "Endpoints that heal")."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.conftest import SettingsFactory
from tests.webhooks.processes import dispatcher_settings
from tests.webhooks.support import endpoint_store, new_account, read_topic, status_event
from worker.contract.delivery_log import Replay
from worker.contract.messages import AuthStatusChanged
from worker.contract.webhook_endpoints import Recovery
from worker.dispatcher.disabling import ProbeConfig
from worker.dispatcher.dispatch_ports import Ports
from worker.dispatcher.probing import Prober
from worker.engine.kafka import build_consumer, build_producer
from worker.settings import Settings
from worker.webhooks.replay_scan import ReplayScan, recovery_replay_id

pytestmark = pytest.mark.integration

MISSED = 600


class Slow:
    """A scan's consumer whose fetches take a while and bring few records: a scan longer
    than its budget."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    async def getmany(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.05)
        return await self._consumer.getmany(*args, **(kwargs | {"max_records": 20}))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


async def publish(settings: Settings, events: list[AuthStatusChanged]) -> None:
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        sends = [
            await producer.send(
                settings.topics.status, e.model_dump_json().encode(), key=e.account_id.encode()
            )
            for e in events
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def test_a_recovery_replay_past_its_budget_is_resumed_where_it_stopped(
    make_settings: SettingsFactory,
) -> None:
    settings = dispatcher_settings(make_settings)
    disabled_at = time.time() - 1.0  # before the events: they occur while it is disabled
    accounts = [new_account() for _ in range(10)]
    missed = [status_event(a, v) for v in range(1, MISSED // 10 + 1) for a in accounts]
    producer = build_producer(settings.kafka_config())
    await producer.start()
    async with endpoint_store(settings) as store:
        ep, _ = await store.create(
            "ws_a", url="http://127.0.0.1:9/", event_types=None, description=None
        )
        rid = recovery_replay_id(ep.id, disabled_at)
        left = Recovery(disabled_at=disabled_at, interval_s=1.0, replay_id=rid, replaying=True)
        await store.update(ep, recovery=left)  # active: as a probe's re-enable writes it
        await publish(settings, missed)
        scan = ReplayScan(
            consumer_factory=lambda: Slow(
                build_consumer(settings.kafka_config(), fetch_max_wait_ms=50)
            ),
            producer=producer,
            topics=settings.topics,
        )
        prober = Prober(
            ports=Ports(store.registry, store, None, None, None),  # type: ignore[arg-type]
            owns=lambda _: True,
            config=ProbeConfig(first_s=0.2),
            scan=scan,
            replay_budget_s=1.0,
        )
        paused: list[dict[str, int]] = []
        runner = asyncio.create_task(prober.run())
        try:
            deadline = time.monotonic() + 120.0
            while (now := store.registry.get("ws_a", ep.id)) is None or now.replaying:
                assert time.monotonic() < deadline, "the recovery replay never finished"
                held = None if now is None or now.recovery is None else now.recovery.resume
                if held and held not in paused:
                    paused.append(held)
                await asyncio.sleep(0.02)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            await producer.stop()
        final = store.registry.get("ws_a", ep.id)

    assert paused  # the budget ran out: the replay was resumed where it stopped
    assert final is not None and final.recovery is not None
    assert final.recovery.replay_id == rid and final.recovery.resume == {}
    replays = [
        Replay.model_validate_json(r.value)
        for r in await read_topic(settings, settings.topics.webhook_replays)
        if r.value is not None and b"webhook_replay" in r.value
    ]
    mine = [r for r in replays if r.replay_id == rid]
    events = {AuthStatusChanged.model_validate_json(r.event).event_id for r in mine}
    assert events == {e.event_id for e in missed}  # every missed event, under the one replay id
    assert len(mine) == MISSED  # read on from where it stopped, not again from disabled_at
    print(f"paused {len(paused)} times; {len(mine)} records for {MISSED} events")
