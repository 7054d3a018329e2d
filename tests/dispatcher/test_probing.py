"""Endpoints that heal (issue 49), against the real broker, a dispatcher in this loop and
loopback receivers: an endpoint the dispatcher disabled is probed with a signed
``endpoint.probe`` on a backing-off schedule kept on its record, re-enabled by a 2xx (announced
as ``endpoint.enabled``, reason ``recovered``; each probe an entry of its delivery log), never
when its owner opted out or deactivated it, and a receiver that takes probes and fails
deliveries is disabled again by the usual rule with a longer probe interval."""

from __future__ import annotations

import asyncio
import time
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
    read_log,
    receiving,
    running_dispatcher,
    status_event,
    wait_until,
)
from worker.contract.operational_events import (
    EndpointDisabledEvent,
    EndpointEnabledEvent,
    EndpointProbeEvent,
)
from worker.contract.webhook_endpoints import EndpointRecord, EventType, Recovery
from worker.dispatcher.disabling import ProbeConfig
from worker.dispatcher.dispatch_ports import Ports
from worker.dispatcher.probing import PER_WORKSPACE, Prober
from worker.dispatcher.publish import DeliveryPublisher
from worker.dispatcher.sender import DeliveryResult
from worker.engine.kafka import build_producer
from worker.webhooks.endpoint_writes import EndpointStore
from worker.webhooks.signing import headers as signed_headers

pytestmark = pytest.mark.integration

OPS: tuple[EventType, ...] = ("endpoint.disabled", "endpoint.enabled")


def probes(receiver: Receiver) -> list[Any]:
    return [d for d in receiver.seen if d.body["type"] == "endpoint.probe"]


def current(store: EndpointStore, workspace: str, endpoint_id: str) -> EndpointRecord:
    record = store.registry.get(workspace, endpoint_id)
    assert record is not None
    return record


async def test_a_disabled_endpoint_is_probed_backing_off_and_re_enabled_by_a_2xx(
    make_settings: SettingsFactory,
) -> None:
    settings = dispatcher_settings(
        make_settings,
        webhook_retry_schedule_s="30",
        webhook_probe_first_s=0.3,
        webhook_probe_max_s=0.6,
    )
    probe_answer = [410]
    target = Receiver(
        answer=lambda body, _: probe_answer[0] if body["type"] == "endpoint.probe" else 410
    )
    watcher = Receiver()
    async with receiving(target), receiving(watcher), endpoint_store(settings) as store:
        ep = await endpoint_of(store, target, description="orders")
        await endpoint_of(store, watcher, event_types=OPS)
        async with running_dispatcher(settings):
            await publish_events(settings, [status_event(new_account(), 1)])
            await wait_until(lambda: len(probes(target)) >= 2)
            # the schedule lives on the record: the wait doubled (to its cap), last answer
            await wait_until(
                lambda: (r := current(store, "ws_a", ep.id).recovery) is not None and r.probes >= 2
            )
            failing = current(store, "ws_a", ep.id)
            probe_answer[0] = 204
            await wait_until(lambda: current(store, "ws_a", ep.id).status == "active")
            await wait_until(lambda: len(watcher.seen) >= 2)
        log = [e for e in await read_log(settings) if e.endpoint_id == ep.id]

    assert failing.status == "disabled" and failing.recovery is not None
    assert failing.recovery.interval_s == 0.6  # 0.3 doubled, at its cap
    assert failing.recovery.last_probe is not None
    assert failing.recovery.last_probe.status == 410
    assert failing.recovery.next_probe_at is not None
    sent = probes(target)
    assert all(d.verified for d in sent)  # signed like a delivery
    bodies = [EndpointProbeEvent.model_validate(d.body) for d in sent]
    assert [b.data.probe for b in bodies] == list(range(1, len(sent) + 1))
    assert len({d.webhook_id for d in sent}) == len(sent)  # one id per probe
    assert sent[-1].status == 204
    healed = current(store, "ws_a", ep.id)
    assert healed.recovery is not None and healed.recovery.recovered_at is not None
    assert healed.recovery.next_probe_at is None
    # announced: disabled with the failure that decided it, enabled as recovered
    assert [d.body["type"] for d in watcher.seen] == list(OPS)
    off = EndpointDisabledEvent.model_validate(watcher.seen[0].body)
    on = EndpointEnabledEvent.model_validate(watcher.seen[1].body)
    assert [f.status for f in off.data.last_failures] == [410]
    assert on.data.reason == "recovered" and on.data.endpoint_id == ep.id
    # each probe is an attempt of its own in the endpoint's delivery log
    logged = {e.webhook_id: e for e in log if e.event_type == "endpoint.probe"}
    assert set(logged) == {d.webhook_id for d in sent}
    assert logged[sent[-1].webhook_id].state == "delivered"
    assert logged[sent[0].webhook_id].state == "failed"
    assert logged[sent[0].webhook_id].attempt is not None
    assert logged[sent[0].webhook_id].attempt.status == 410  # type: ignore[union-attr]


async def test_no_probes_when_the_owner_opted_out_or_deactivated_it(
    make_settings: SettingsFactory,
) -> None:
    settings = dispatcher_settings(
        make_settings, webhook_retry_schedule_s="30", webhook_probe_first_s=1.0
    )

    def answer(body: dict[str, Any], _: int) -> int:
        return 204 if body["type"] == "endpoint.probe" else 410

    control, opted_out, deactivated = (Receiver(answer=answer) for _ in range(3))
    async with (
        receiving(control),
        receiving(opted_out),
        receiving(deactivated),
        endpoint_store(settings) as store,
    ):
        eps = []
        for workspace, receiver, recover in (
            ("ws_a", control, True),
            ("ws_b", opted_out, False),
            ("ws_c", deactivated, True),
        ):
            ep, secret = await store.create(
                workspace,
                url=receiver.url,
                event_types=None,
                description=None,
                auto_recover=recover,
            )
            receiver.secrets.append(secret)
            eps.append(ep)
        async with running_dispatcher(settings) as _:
            await publish_events(
                settings,
                [status_event(new_account(), 1, workspace=w) for w in ("ws_a", "ws_b", "ws_c")],
            )
            await wait_until(
                lambda: all(current(store, e.workspace_id, e.id).status == "disabled" for e in eps)
            )
            gone = current(store, "ws_c", eps[2].id)
            off = await store.set_status(gone, "inactive")  # before its first probe is due
            assert off.recovery is None
            await wait_until(lambda: current(store, "ws_a", eps[0].id).status == "active")
            await asyncio.sleep(1.5)  # three more sweeps (a sweep every first_s / 2)

    assert len(probes(control)) == 1
    assert probes(opted_out) == [] and probes(deactivated) == []
    assert current(store, "ws_b", eps[1].id).status == "disabled"
    assert current(store, "ws_c", eps[2].id).status == "inactive"


async def test_a_receiver_taking_probes_but_failing_deliveries_is_disabled_again_probed_slower(
    make_settings: SettingsFactory,
) -> None:
    settings = dispatcher_settings(
        make_settings,
        webhook_retry_schedule_s="0.1",
        webhook_disable_after_s=1.0,
        webhook_probe_first_s=0.3,
        webhook_probe_max_s=10.0,
        webhook_endpoint_backoff_base_s=0.05,
        webhook_endpoint_backoff_max_s=0.1,
    )
    flaky = Receiver(answer=lambda body, _: 204 if body["type"] == "endpoint.probe" else 500)
    seen: list[EndpointRecord] = []
    async with receiving(flaky), endpoint_store(settings) as store:
        ep = await endpoint_of(store, flaky)
        async with running_dispatcher(settings):
            for _ in range(200):  # events keep coming; bounded
                await publish_events(settings, [status_event(new_account(), 1)])
                await asyncio.sleep(0.1)
                record = current(store, "ws_a", ep.id)
                if not seen or seen[-1].revision != record.revision:
                    seen.append(record)
                r = record.recovery
                if record.status == "disabled" and r is not None and r.recovered_at is not None:
                    break

    again = seen[-1]
    assert again.status == "disabled" and again.recovery is not None
    assert [r.status for r in seen].count("active") >= 1 and len(probes(flaky)) >= 1
    recovered_at = again.recovery.recovered_at
    assert recovered_at is not None
    # the usual rule ran again from the recovery: failing for disable_after_s since
    assert again.recovery.disabled_at - recovered_at >= 1.0
    assert again.recovery.interval_s == 0.6  # the recovery did not hold: twice the first


class Stalled:
    """A receiver that never answers, at the HTTP boundary: probes stay under way."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult:
        self.urls.append(url)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_probes_at_once_are_capped_per_workspace_by_the_admission_rule(
    make_settings: SettingsFactory,
) -> None:
    settings = dispatcher_settings(make_settings)
    sender = Stalled()
    async with endpoint_store(settings) as store:
        producer = build_producer(settings.kafka_config())
        await producer.start()
        try:
            due = Recovery(disabled_at=1.0, interval_s=1.0, next_probe_at=2.0)
            for workspace, n in (("ws_a", PER_WORKSPACE + 2), ("ws_b", 1)):
                for i in range(n):
                    ep, _ = await store.create(
                        workspace,
                        url=f"http://127.0.0.1:9/{i}",
                        event_types=None,
                        description=None,
                    )
                    await store.disable(ep, "test", due)
            prober = Prober(
                ports=Ports(
                    endpoints=store.registry,
                    writer=store,
                    sender=sender,
                    sign=signed_headers,
                    publisher=DeliveryPublisher(
                        producer,
                        state_topic=settings.topics.webhook_state,
                        log_topic=settings.topics.webhook_deliveries,
                        dlq_topic=settings.topics.webhook_dlq,
                    ),
                ),
                owns=lambda _: True,
                config=ProbeConfig(first_s=0.2, max_in_flight=16),
            )
            runs = asyncio.create_task(prober.run())
            await wait_until(lambda: len(sender.urls) == PER_WORKSPACE + 1)
            await asyncio.sleep(3 * prober.tick_s)  # more sweeps: still no room for ws_a
            assert len(sender.urls) == PER_WORKSPACE + 1
            assert prober.slots.held("ws_a") == PER_WORKSPACE
            assert prober.slots.held("ws_b") == 1
            runs.cancel()
            await asyncio.gather(runs, return_exceptions=True)
            assert prober.slots.in_use == 0  # every slot given back
        finally:
            await producer.stop()


async def test_an_endpoint_disabled_before_recovery_existed_is_probed_from_now(
    make_settings: SettingsFactory,
) -> None:
    """A disabled record with no ``recovery`` (written before probing existed): the dispatcher
    starts its probing at the sweep, ``disabled_at`` now; not when its owner opted out."""
    settings = dispatcher_settings(make_settings)
    async with endpoint_store(settings) as store:
        old, _ = await store.create(
            "ws_a", url="http://127.0.0.1:9/", event_types=None, description=None
        )
        out, _ = await store.create(
            "ws_a", url="http://127.0.0.1:9/", event_types=None, description=None
        )
        await store.update(old, status="disabled")
        await store.update(out, status="disabled", auto_recover=False)
        prober = Prober(
            ports=Ports(store.registry, store, None, None, None),  # type: ignore[arg-type]
            owns=lambda _: True,
            config=ProbeConfig(first_s=60.0),
        )
        before = time.time()
        runner = asyncio.create_task(prober.run())
        try:
            await wait_until(lambda: current(store, "ws_a", old.id).recovery is not None)
            await asyncio.sleep(2 * prober.tick_s)  # sweeps enough to have started the other
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        started = current(store, "ws_a", old.id)
        assert started.recovery is not None and started.status == "disabled"
        assert before <= started.recovery.disabled_at <= time.time()
        assert started.recovery.next_probe_at == started.recovery.disabled_at + 60.0
        assert current(store, "ws_a", out.id).recovery is None
