"""What the dispatcher keeps per (endpoint, account) pair, on a real broker with a real
receiver on loopback: a pair with nothing pending is held neither in memory nor on the
delivery-state topic (its record tombstoned), and the pairs with something pending are bounded
per endpoint (``QueueLimits.max_pairs_per_endpoint`` per partition), so error events for ever
new made-up accounts sent to a failing endpoint hold at most that many, and a restart reloads
at most that many (docs/architecture.md, "Webhook fan-out")."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from tests.conftest import SettingsFactory
from tests.dispatcher.test_isolation import confirm_error, publish_errors
from tests.webhooks.processes import dispatcher_settings
from tests.webhooks.support import (
    Receiver,
    create_endpoint,
    endpoint_store,
    new_account,
    publish_events,
    read_topic,
    receiving,
    running_dispatcher,
    status_event,
    wait_until,
)
from worker.contract.delivery_log import webhook_id
from worker.dispatcher.delivery_store import DeliveryStore

pytestmark = pytest.mark.integration

ACCOUNTS = 2000
WARM_UP = 200
#: Memory the dispatcher (and the lean receiver's set of delivered ids, ~100 B) may keep per
#: account once all its deliveries are done: traced Python allocations, whatever holds them.
MAX_BYTES_PER_ACCOUNT = 1000
CAP = 20
PARTITIONS = 3


@dataclass
class LeanReceiver:
    """Fails each webhook-id's first attempt, then takes it; keeps only the delivered ids
    (its own memory is counted with the dispatcher's), checking every signature."""

    secret: str = ""
    url: str = ""
    ok: set[str] = field(default_factory=set)
    failed_once: set[str] = field(default_factory=set)
    unverified: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            Webhook(self.secret).verify(raw, dict(request.headers))
        except Exception:
            self.unverified += 1
            return web.Response(status=401)
        wid = request.headers["webhook-id"]
        if wid not in self.failed_once and wid not in self.ok:
            self.failed_once.add(wid)
            return web.Response(status=500)
        self.failed_once.discard(wid)
        self.ok.add(wid)
        return web.Response(status=204)


def _latest(records: list[Any]) -> dict[str, bytes | None]:
    latest: dict[str, bytes | None] = {}
    for r in records:
        latest[r.key.decode()] = r.value
    return latest


async def test_fully_delivered_pairs_are_dropped_and_their_records_tombstoned(
    make_settings: SettingsFactory,
) -> None:
    settings = dispatcher_settings(
        make_settings,
        partitions=PARTITIONS,
        webhook_retry_schedule_s="0.2,0.2,0.2",
        # every first attempt fails: no back-off of the endpoint as a whole
        webhook_endpoint_backoff_after=100_000,
    )
    # Every webhook-id fails once: each pair is written (its retry), then delivered.
    receiver = LeanReceiver()
    warm = [new_account() for _ in range(WARM_UP)]
    accounts = [new_account() for _ in range(ACCOUNTS)]
    async with receiving(receiver), endpoint_store(settings) as endpoints:
        endpoint, receiver.secret = await create_endpoint(endpoints, "ws_a", receiver.url)
        async with running_dispatcher(settings) as running:
            store = running.worker.store
            assert isinstance(store, DeliveryStore)
            await publish_events(settings, [status_event(a, 1) for a in warm])
            await wait_until(lambda: len(receiver.ok) == WARM_UP, timeout=60)
            await wait_until(lambda: len(store) == 0, timeout=20)
            gc.collect()
            tracemalloc.start(1)
            try:
                before = tracemalloc.get_traced_memory()[0]
                await publish_events(settings, [status_event(a, 1) for a in accounts])
                want = WARM_UP + ACCOUNTS
                await wait_until(lambda: len(receiver.ok) == want, timeout=180)
                await wait_until(lambda: len(store) == 0, timeout=20)
                gc.collect()
                per_account = (tracemalloc.get_traced_memory()[0] - before) / ACCOUNTS
            finally:
                tracemalloc.stop()
            print(f"dispatcher memory kept per delivered account: {per_account:.0f} B")
            assert len(store) == 0, "no pair with nothing pending is held"
            assert len(store.timers.live) == 0 and len(store.unsaved) == 0
            assert per_account < MAX_BYTES_PER_ACCOUNT
        states = await read_topic(settings, settings.topics.webhook_state)
    expected = {webhook_id(status_event(a, 1).event_id, endpoint.id) for a in warm + accounts}
    assert receiver.ok == expected, "one webhook-id per (event, endpoint)"
    assert receiver.unverified == 0 and not receiver.failed_once
    latest = _latest(states)
    assert len(latest) == WARM_UP + ACCOUNTS, "each pair was written once (its retry)"
    live = [key for key, value in latest.items() if value is not None]
    assert live == [], f"{len(live)} delivery-state records still live, e.g. {live[:3]}"


async def test_a_failing_endpoint_holds_at_most_its_cap_of_pairs_across_a_restart(
    make_settings: SettingsFactory,
) -> None:
    # The cap of the dispatcher run_dispatcher builds (WEBHOOK_MAX_PAIRS_PER_ENDPOINT: 1000).
    settings = dispatcher_settings(
        make_settings,
        partitions=PARTITIONS,
        webhook_retry_schedule_s="60",
        webhook_max_pairs_per_endpoint=CAP,
    )
    down = Receiver(answer=lambda body, tries: 503)
    healthy = Receiver()
    made_up = [new_account() for _ in range(300)]
    async with receiving(down), receiving(healthy), endpoint_store(settings) as endpoints:
        failing, secret = await create_endpoint(endpoints, "ws_attacker", down.url)
        down.secrets.append(secret)
        _, other_secret = await create_endpoint(endpoints, "ws_other", healthy.url)
        healthy.secrets.append(other_secret)
        async with running_dispatcher(settings) as running:
            store = running.worker.store
            assert isinstance(store, DeliveryStore)

            def refused() -> float:
                value = running.registry.get_sample_value(
                    "passkey_webhook_deliveries_refused_total"
                )
                return 0.0 if value is None else value

            # 404 error events of confirms on ids that do not exist, credited to the caller.
            errors = [confirm_error(a, owner=None, caller="ws_attacker") for a in made_up]
            await publish_errors(settings, errors)
            await wait_until(lambda: len(store) + refused() == len(made_up), timeout=60)
            held = len(store)
            per_partition = [store.pending_pairs(p, failing.id) for p in range(PARTITIONS)]
            # The failing endpoint's cap does not touch another workspace's endpoint.
            account = new_account()
            await publish_events(settings, [status_event(account, 1, workspace="ws_other")])
            await wait_until(lambda: len(healthy.verified_once()) == 1)
            attempted = len({d.webhook_id for d in down.seen})
        assert max(per_partition) <= CAP and sum(per_partition) == held
        assert held <= CAP * PARTITIONS
        dlq = await read_topic(settings, settings.topics.webhook_dlq)
        reasons: dict[bytes, int] = defaultdict(int)
        for r in dlq:
            reasons[dict(r.headers)["webhook.last_error"]] += 1
        assert reasons == {b"endpoint_queue_full": len(made_up) - held}
        states = _latest(await read_topic(settings, settings.topics.webhook_state))
        assert 0 < len([v for v in states.values() if v is not None]) <= held
        async with running_dispatcher(settings) as again:
            restored = again.worker.store
            assert isinstance(restored, DeliveryStore)
            assert 0 < len(restored) <= CAP * PARTITIONS, "a restart reloads at most the cap"
            # events whose pairs were in memory only are read again: the cap holds for them
            await asyncio.sleep(1.0)
            again_held = [restored.pending_pairs(p, failing.id) for p in range(PARTITIONS)]
            assert max(again_held) <= CAP
    assert {d.body["data"]["account_id"] for d in down.seen} <= set(made_up)
    assert attempted <= held, "only the held pairs were attempted"
