"""A dispatcher process killed (SIGKILL) while it probes a disabled endpoint: the schedule is
on the endpoint's record, so the next process continues it (the probe count goes on, the same
``disabled_at``) and re-enables the endpoint when it answers (issue 49)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SettingsFactory
from tests.webhooks.processes import DispatcherPool, dispatcher_settings
from tests.webhooks.support import (
    Receiver,
    endpoint_store,
    new_account,
    publish_events,
    receiving,
    status_event,
    wait_until,
)
from worker.contract.operational_events import EndpointProbeEvent

pytestmark = pytest.mark.integration


async def test_a_killed_dispatchers_probing_is_continued_by_the_next(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = dispatcher_settings(make_settings, webhook_retry_schedule_s="30")
    healed = [False]

    def answer(body: dict[str, Any], _: int) -> int:
        if body["type"] == "endpoint.probe":
            return 204 if healed[0] else 503
        return 410

    target = Receiver(answer=answer)
    pool = DispatcherPool(
        settings, 1, tmp_path, WEBHOOK_PROBE_FIRST_S="0.3", WEBHOOK_PROBE_MAX_S="0.6"
    )
    async with receiving(target), endpoint_store(settings) as store:
        ep, secret = await store.create("ws_a", url=target.url, event_types=None, description=None)
        target.secrets.append(secret)

        def recovery() -> Any:
            record = store.registry.get("ws_a", ep.id)
            return None if record is None else record.recovery

        try:
            pool.start(0)
            await pool.wait_ready()
            await publish_events(settings, [status_event(new_account(), 1)])
            await wait_until(lambda: (r := recovery()) is not None and r.probes >= 2, 60.0)
            pool.signal(0, signal.SIGKILL)
            before = len(target.seen)
            kept = recovery()
            healed[0] = True
            pool.start(0)
            await pool.wait_ready()
            await wait_until(
                lambda: (
                    (r := store.registry.get("ws_a", ep.id)) is not None and r.status == "active"
                ),
                60.0,
            )
        finally:
            pool.close()

    probes = [EndpointProbeEvent.model_validate(d.body).data for d in target.seen[1:]]
    after = [p.probe for p in probes[before - 1 :]]
    # continued where the record says, not started over at 1 (the probe a kill cut short
    # between its send and its write is sent again: the same number, the same webhook-id)
    assert after and after[0] >= kept.probes >= 2
    assert len({p.disabled_at for p in probes}) == 1  # one probing, across both processes
    assert target.seen[-1].status == 204
