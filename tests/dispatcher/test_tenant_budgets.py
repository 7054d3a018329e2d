"""Each workspace's budget of the dispatcher's shared slots and state (issue "Tenant budgets",
rows 5 and 12; docs/architecture.md, "Admission", "Resource bounds"): attempts in flight are
connections of the pool taken through the one admission rule, so workspaces at their share
leave connections to the others; an attempt that finds no slot of ours is deferred, never
counted as its receiver's failure; and a workspace's pending deliveries stop at its cap while
another workspace's are still taken in.

Receivers are real servers on loopback (one answers, one never does); the dispatcher runs
over an in-memory store and a publisher that notes its calls (``test_instrumentation``)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from tests.dispatcher.test_instrumentation import NotingPublisher, Writer
from tests.webhooks.support import Hanging, hanging, receiving, status_event, wait_until
from worker.contract.webhook_endpoints import EndpointRecord
from worker.dispatcher.delivery import DeliveryState, Finished, Pending, QueueLimits, state_key
from worker.dispatcher.delivery_store import DeliveryStore
from worker.dispatcher.dispatch_ports import Ports
from worker.dispatcher.dispatcher import DispatchConfig, Dispatcher
from worker.dispatcher.endpoint_gate import EndpointGate, GateConfig
from worker.dispatcher.metrics import WebhookMetrics
from worker.dispatcher.sender import DeliveryResult, Sender, open_session
from worker.webhooks.endpoints import EndpointRegistry
from worker.webhooks.targets import TargetPolicy

LAX = TargetPolicy(allow_http=True, allow_private=True)
NOW = 1_700_000_000.0
PARTITION = 1
STATUS = "auth.status"


def endpoint(endpoint_id: str, workspace: str, url: str) -> EndpointRecord:
    return EndpointRecord(
        id=endpoint_id,
        workspace_id=workspace,
        url=url,
        created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:00Z",
        revision=1,
    )


class FailuresNoted(NotingPublisher):
    """Notes each failed delivery's ``last_error`` too (what the DLQ and the log carry)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str | None] = []

    async def dead_letter(self, state: DeliveryState, head: Pending, finished: Finished) -> None:
        self.errors.append(finished.last_error)
        await super().dead_letter(state, head, finished)


def dispatcher(
    registry: EndpointRegistry,
    sender: Any,
    *,
    limits: QueueLimits | None = None,
    gate: GateConfig | None = None,
) -> tuple[Dispatcher, DeliveryStore, FailuresNoted, CollectorRegistry]:
    store = DeliveryStore(workspace_of=registry.workspace_of)
    publisher = FailuresNoted()
    metrics = CollectorRegistry()
    built = Dispatcher(
        store=store,
        ports=Ports(
            endpoints=registry,
            writer=Writer(),
            sender=sender,
            sign=lambda secrets, wid, ts, body: {"webhook-id": wid},
            publisher=publisher,  # type: ignore[arg-type]
        ),
        config=DispatchConfig(
            status_topic=STATUS,
            replay_topic="webhook.replays",
            schedule=(60.0, 60.0),
            disable_after_s=5 * 86400.0,
            limits=limits or QueueLimits(),
            gate=gate or GateConfig(backoff_after=1),
        ),
        metrics=WebhookMetrics(metrics),
        clock=lambda: NOW,
    )
    return built, store, publisher, metrics


class Answering:
    """A receiver that answers 204 to whatever comes."""

    url = ""

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=204)


async def test_four_workspaces_at_their_share_leave_connections_for_a_fifth() -> None:
    """A pool of 16 connections, a workspace's in-flight bound 4: four workspaces whose
    attempts all hang hold 3 each (``Share.split``: a quarter kept for workspaces holding
    none), so a fifth workspace's attempt is admitted, finds a connection and is delivered.
    Before, the four held 4 x 4 = 16, every connection, and the fifth's attempt waited for
    one until its time-out: a failure counted against its own receiver."""
    config = GateConfig(max_in_flight=4, workspace_max_in_flight=4, max_connections=16)
    gate = EndpointGate(config, wake=lambda *_: True)
    session = open_session(LAX, max_connections=16, max_connections_per_host=16)
    slow = Sender(session, timeout_s=20.0)
    quick = Sender(session, timeout_s=1.0)
    async with hanging(Hanging()) as stuck, receiving(Answering()) as receiver:

        def admit(workspace: str, endpoint_id: str, key: str) -> bool:
            return gate.admit(
                endpoint_id,
                revision=1,
                rate_limit=None,
                partition=0,
                key=f"{endpoint_id}/{key}",
                now=NOW,
                workspace_id=workspace,
            ).admitted

        held: list[asyncio.Task[DeliveryResult]] = []
        for w in range(4):
            for i in range(8):  # two endpoints of each workspace, four pairs each
                endpoint_id = f"ep_{w}_{i % 2}"
                if admit(f"ws_{w}", endpoint_id, f"acc_{i}"):
                    held.append(asyncio.create_task(slow.post(stuck.url, b"{}", {})))
        try:
            await wait_until(lambda: stuck.open == len(held), 5.0)
            assert len(held) == 12, "3 a workspace, not its in-flight bound of 4"
            assert [gate.connections(f"ws_{w}") for w in range(4)] == [3, 3, 3, 3]
            assert admit("ws_new", "ep_new", "acc_0")
            answer = await quick.post(receiver.url, b"{}", {})
            assert (answer.status, answer.error) == (204, None), answer
            in_use = sum(gate.connections(ws) for ws in ["ws_0", "ws_1", "ws_2", "ws_3", "ws_new"])
            assert in_use == 13 <= config.max_connections
        finally:
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            await session.close()


async def test_an_attempt_that_finds_no_connection_of_ours_is_deferred_not_failed() -> None:
    """ws_b's endpoint shares a host with a hanging one whose attempt holds the only
    connection the pool gives that host: ws_b's attempt waits for the pool until its
    time-out. That wait was ours, not the receiver's: the attempt is deferred (its pair looks
    again about a second later), its head keeps its attempt count and schedule, and its
    endpoint's failures, back-off (here after one failure) and disable clock (failing-since)
    are untouched. Before, it was a ``timeout`` failure: a retry step spent, the endpoint
    backing off and failing since then."""
    session = open_session(LAX, max_connections=8, max_connections_per_host=1)
    blocker = Sender(session, timeout_s=20.0)
    async with hanging(Hanging()) as stuck:
        registry = EndpointRegistry()
        registry.apply(endpoint("ep_b", "ws_b", stuck.url))
        d, store, publisher, metrics = dispatcher(registry, Sender(session, timeout_s=0.3))
        head = Pending(
            webhook_id="msg_b",
            event_type="account.auth_status_changed",
            event_id="evt_b",
            body='{"type":"account.auth_status_changed"}',
            occurred_at="2023-11-14T22:13:10Z",
            enqueued_at=NOW,
            next_attempt_at=NOW,
        )
        state = DeliveryState(
            endpoint_id="ep_b", account_id="acc_b", workspace_id="ws_b", queue=(head,)
        )
        store.put(PARTITION, state)
        key = state_key("ep_b", "acc_b")
        busy = asyncio.create_task(blocker.post(stuck.url, b"{}", {}))
        try:
            await wait_until(lambda: stuck.open == 1, 5.0)
            await asyncio.wait_for(d.follow_up(PARTITION, key), 5.0)
            after = store.pair(PARTITION, key)
            assert after is not None and after.failing_since is None
            assert after.queue[0].attempts == 0 and after.queue[0].last_error is None
            assert d.gate.failing_since("ep_b") is None
            assert metrics.get_sample_value("passkey_webhook_endpoints_backing_off") == 0
            assert publisher.what() == [], "no retry, no failure, no log entry"
            due, _, _ = store.timers.live[key]
            assert NOW + 1.0 <= due <= NOW + 1.5, "looked at again shortly"
            deferred = metrics.get_sample_value(
                "passkey_webhook_attempts_deferred_total", {"reason": "capacity"}
            )
            assert deferred == 1
            errors = metrics.get_sample_value(
                "passkey_webhook_attempt_errors_total", {"kind": "timeout"}
            )
            assert errors == 0, "no request was sent: no attempt counted"
        finally:
            busy.cancel()
            await asyncio.gather(busy, return_exceptions=True)
            await session.close()


def event_record(account_id: str, workspace: str) -> ConsumerRecord[bytes, bytes]:
    value = status_event(account_id, 1, workspace=workspace).model_dump_json().encode()
    return ConsumerRecord(
        STATUS, PARTITION, 7, 0, 0, account_id.encode(), value, None, 5, len(value), []
    )


async def test_a_workspaces_pending_deliveries_stop_at_its_cap_and_others_are_taken_in() -> None:
    """A cap of 6 pending deliveries a workspace: ws_evil's two failing endpoints are sent
    an event for each of 10 made-up accounts; 6 deliveries are taken in, the other 14 fail at
    once as ``workspace_queue_full`` (DLQ copy and log entry each, nothing kept), and
    ws_other's event is still taken in. Before, nothing counted a workspace's deliveries:
    all 20 were held (memory and a timer each), charged to no one."""
    registry = EndpointRegistry()
    registry.apply(endpoint("ep_e1", "ws_evil", "http://127.0.0.1:9/a"))
    registry.apply(endpoint("ep_e2", "ws_evil", "http://127.0.0.1:9/b"))
    registry.apply(endpoint("ep_o", "ws_other", "http://127.0.0.1:9/c"))
    d, store, publisher, metrics = dispatcher(
        registry, None, limits=QueueLimits(workspace_max_pending=6)
    )
    for i in range(10):
        await d.handle(event_record(f"acc_made_up_{i}", "ws_evil"))
    assert store.pending_deliveries("ws_evil") == 6
    assert len(store) == 6
    assert publisher.errors == ["workspace_queue_full"] * 14
    assert publisher.what().count("log_finished") == 14
    assert await d.handle(event_record("acc_real", "ws_other")) == ["ep_o/acc_real"]
    assert store.pending_deliveries("ws_other") == 1
    refused = metrics.get_sample_value("passkey_webhook_deliveries_refused_total")
    assert refused == 14
    # The count follows the pairs: a pair gone idle or a partition dropped gives room back.
    some = store.pair(PARTITION, state_key("ep_e1", "acc_made_up_0"))
    assert some is not None
    store.put(PARTITION, some.model_copy(update={"queue": ()}))
    assert store.pending_deliveries("ws_evil") == 5
    store.drop(PARTITION)
    assert (store.pending_deliveries("ws_evil"), store.pending_deliveries("ws_other")) == (0, 0)
