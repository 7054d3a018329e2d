"""What a dispatcher keeps per endpoint stays bounded when a workspace creates and deletes
endpoints over and over (docs/architecture.md, "Resource bounds": the gate's entries, the
last successes), and a pair its endpoint paused is forgotten with its partition when that is
revoked. The dispatcher over an in-memory store, without a broker (the fakes of
tests/dispatcher/test_instrumentation.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tests.dispatcher.test_instrumentation import AnsweringSender, NotingPublisher, Writer
from worker.contract.webhook_endpoints import EndpointRecord
from worker.dispatcher.delivery import DeliveryState, Pending, state_key
from worker.dispatcher.delivery_store import DeliveryStore
from worker.dispatcher.dispatch_ports import Ports
from worker.dispatcher.dispatcher import DispatchConfig, Dispatcher
from worker.dispatcher.endpoint_gate import SWEEP_FLOOR
from worker.dispatcher.metrics import WebhookMetrics
from worker.webhooks.endpoints import EndpointRegistry

NOW = 1_700_000_000.0
PARTITION = 3


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def dispatcher(
    endpoints: EndpointRegistry, sender: AnsweringSender, clock: Clock
) -> tuple[Dispatcher, DeliveryStore]:
    store = DeliveryStore(workspace_of=endpoints.workspace_of)
    built = Dispatcher(
        store=store,
        ports=Ports(
            endpoints=endpoints,
            writer=Writer(),
            sender=sender,
            sign=lambda secrets, wid, ts, body: {"webhook-id": wid},
            publisher=NotingPublisher(),  # type: ignore[arg-type]
        ),
        config=DispatchConfig(
            status_topic="auth.status",
            replay_topic="webhook.replays",
            schedule=(60.0,),
            disable_after_s=5 * 86400.0,
        ),
        metrics=WebhookMetrics(CollectorRegistry()),
        clock=clock,
    )
    return built, store


def endpoint(endpoint_id: str, *, rate_limit: int | None = None) -> EndpointRecord:
    return EndpointRecord(
        id=endpoint_id,
        workspace_id="ws_churn",
        url="https://hooks.example.test/in",
        rate_limit=rate_limit,
        created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:00Z",
        revision=1,
    )


def pending_pair(store: DeliveryStore, endpoint_id: str, account_id: str, at: float) -> str:
    head = Pending(
        webhook_id=f"msg_{endpoint_id}_{account_id}",
        event_type="account.auth_status_changed",
        event_id=f"evt_{account_id}",
        body='{"type":"account.auth_status_changed"}',
        occurred_at="2023-11-14T22:13:10Z",
        enqueued_at=at,
        next_attempt_at=at,
    )
    store.put(
        PARTITION,
        DeliveryState(
            endpoint_id=endpoint_id, account_id=account_id, workspace_id="ws_churn", queue=(head,)
        ),
    )
    return state_key(endpoint_id, account_id)


async def test_endpoints_created_and_deleted_leave_bounded_state_behind() -> None:
    """Each round: an endpoint is created, a delivery to it is attempted (every other one
    succeeds, the rest fail: an entry the gate keeps for its failures, a success the
    dispatcher keeps for its disable rule), and the endpoint is deleted. Before, the gate
    kept one entry per endpoint ever attempted and the dispatcher one time per endpoint that
    ever succeeded: 600 and 300 here, growing for as long as the churn goes on."""
    registry = EndpointRegistry()
    sender = AnsweringSender()
    clock = Clock()
    d, store = dispatcher(registry, sender, clock)
    rounds = 600
    for i in range(rounds):
        clock.now = NOW + i
        endpoint_id = f"ep_{i:04d}"
        registry.apply(endpoint(endpoint_id))
        key = pending_pair(store, endpoint_id, f"acc_{i}", clock.now)
        sender.status = 204 if i % 2 else 500
        await d.follow_up(PARTITION, key)
        registry.delete(endpoint_id)
    assert len(sender.urls) == rounds, "every delivery was attempted"
    assert len(d.gate._endpoints) <= SWEEP_FLOOR, len(d.gate._endpoints)
    assert sum(map(len, d.gate._workspace_endpoints.values())) <= SWEEP_FLOOR
    assert len(d.disabling.last_success) <= SWEEP_FLOOR + 1, len(d.disabling.last_success)


async def test_a_live_endpoints_last_success_survives_the_sweeps() -> None:
    """The sweep drops deleted endpoints' successes only: a live endpoint's still counts."""
    registry = EndpointRegistry()
    sender = AnsweringSender(204)
    clock = Clock()
    d, store = dispatcher(registry, sender, clock)
    registry.apply(endpoint("ep_keep"))
    await d.follow_up(PARTITION, pending_pair(store, "ep_keep", "acc_keep", NOW))
    for i in range(3 * SWEEP_FLOOR):
        endpoint_id = f"ep_{i:04d}"
        registry.apply(endpoint(endpoint_id))
        await d.follow_up(PARTITION, pending_pair(store, endpoint_id, f"acc_{i}", NOW))
        registry.delete(endpoint_id)
    assert d.disabling.last_success.get("ep_keep") == NOW


async def test_a_pair_parked_when_its_partition_is_revoked_is_forgotten() -> None:
    """A pair its endpoint's rate limit paused is marked parked until its next follow-up; the
    partition revoked (the loop drops it from the store) takes the mark with it. Before, the
    mark stayed in ``Dispatcher._parked`` for ever, one more per pair per rebalance."""
    registry = EndpointRegistry()
    registry.apply(endpoint("ep_1", rate_limit=1))
    clock = Clock()
    d, store = dispatcher(registry, AnsweringSender(204), clock)
    first = pending_pair(store, "ep_1", "acc_a", NOW)
    second = pending_pair(store, "ep_1", "acc_b", NOW)
    await d.follow_up(PARTITION, first)
    await d.follow_up(PARTITION, second)
    assert store.parked(PARTITION, second), "the rate limit paused it"
    assert not store.parked(PARTITION, first)

    store.drop(PARTITION)  # what ConsumeLoop.on_partitions_revoked does
    assert not store.parked(PARTITION, second)


async def test_a_parked_pair_is_unmarked_by_its_next_follow_up_or_when_dropped_idle() -> None:
    registry = EndpointRegistry()
    registry.apply(endpoint("ep_1", rate_limit=1))
    clock = Clock()
    d, store = dispatcher(registry, AnsweringSender(204), clock)
    first = pending_pair(store, "ep_1", "acc_a", NOW)
    second = pending_pair(store, "ep_1", "acc_b", NOW)
    await d.follow_up(PARTITION, first)
    await d.follow_up(PARTITION, second)
    assert store.parked(PARTITION, second)
    clock.now = NOW + 1.5  # a token again
    await d.follow_up(PARTITION, second)
    assert store.pair(PARTITION, second) is None, "delivered: the pair is idle and dropped"
    assert not store.parked(PARTITION, second)
