"""What a delivery costs in delivery-state records, and that the saving loses nothing
(docs/architecture.md, "Webhook fan-out"): a delivery that succeeds at its first attempt is
never written to ``webhook.delivery-state`` (its event's offset stays uncommitted until it is
delivered), a delivery that fails once has its pair written, a delivery's first log entry is
its outcome or ``pending`` beside its pair's record, and a dispatcher SIGKILLed while
deliveries are in flight delivers every event after its restart under one webhook-id per
(event, endpoint)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from tests.conftest import SettingsFactory
from tests.webhooks.processes import DispatcherPool, dispatcher_settings
from tests.webhooks.support import (
    Hanging,
    Receiver,
    create_endpoint,
    endpoint_store,
    hanging,
    new_account,
    publish_events,
    read_log,
    read_topic,
    receiving,
    running_dispatcher,
    status_event,
    wait_until,
)
from worker.contract.delivery_log import DeliveryLogEntry, decode_log, webhook_id
from worker.dispatcher.delivery import DeliveryState, state_key
from worker.engine.kafka import build_consumer
from worker.engine.tail import assign_all
from worker.settings import Settings

pytestmark = pytest.mark.integration

ACCOUNTS = 12
VERSIONS = 2


def fail_once(body: object, tries: int) -> int:
    return 500 if tries == 0 else 204


@pytest.mark.parametrize("hold_s", [30.0, 0.0], ids=["held", "written-at-take-in"])
async def test_first_time_successes_write_no_state_and_a_failed_attempt_writes_its_pair(
    make_settings: SettingsFactory, hold_s: float
) -> None:
    settings = dispatcher_settings(
        make_settings,
        webhook_retry_schedule_s="0.2,0.2,0.2",
        webhook_take_in_hold_s=hold_s,
        # every first attempt to the flaky endpoint fails: no back-off of it as a whole
        webhook_endpoint_backoff_after=1000,
    )
    steady = Receiver()
    flaky = Receiver(answer=fail_once)
    accounts = [new_account() for _ in range(ACCOUNTS)]
    events = [status_event(a, v) for v in range(1, VERSIONS + 1) for a in accounts]
    async with receiving(steady), receiving(flaky), endpoint_store(settings) as store:
        ep_steady, secret = await create_endpoint(store, "ws_a", steady.url)
        steady.secrets.append(secret)
        ep_flaky, secret = await create_endpoint(store, "ws_a", flaky.url)
        flaky.secrets.append(secret)
        async with running_dispatcher(settings):
            await publish_events(settings, events)
            await wait_until(
                lambda: (
                    len(steady.verified_once()) == len(events)
                    and len(flaky.verified_once()) == len(events)
                ),
                timeout=60,
            )
        # read with a consumer of its own, after the dispatcher stopped (all writes acked)
        records = [r for r in await read_topic(settings, settings.topics.webhook_state)]

    by_key = Counter(r.key.decode() for r in records)
    steady_pairs = {state_key(ep_steady.id, a) for a in accounts}
    flaky_pairs = {state_key(ep_flaky.id, a) for a in accounts}
    deliveries = 2 * len(events)
    print(
        f"hold_s={hold_s}: {len(records)} delivery-state records for {deliveries} deliveries "
        f"({len(records) / deliveries:.2f} per delivery); steady pairs "
        f"{sum(by_key[k] for k in steady_pairs)}, flaky pairs {sum(by_key[k] for k in flaky_pairs)}"
    )
    assert set(by_key) <= steady_pairs | flaky_pairs
    assert flaky_pairs <= set(by_key), "a delivery whose attempt failed has its pair written"
    if hold_s > 0:
        assert not steady_pairs & set(by_key), "no record for a first-time success"
    else:
        assert steady_pairs <= set(by_key), "the old way writes every pair at take-in"
    # what was written says the flaky pairs are done: a done pair's record is tombstoned
    last = {r.key.decode(): r.value for r in records}
    for key in flaky_pairs:
        assert last[key] is None, "a done pair's record is tombstoned"
    assert all(d.verified for d in steady.seen + flaky.seen)


async def test_a_hanging_endpoint_has_its_pairs_written_once_the_hold_is_overdue(
    make_settings: SettingsFactory,
) -> None:
    """A delivery stuck in an attempt does not pin its event's offset (and so every later
    offset of its partition, other workspaces' included) for the attempt's time-out: after
    ``WEBHOOK_TAKE_IN_HOLD_S`` its pair is written (the pending delivery is then in the
    changelog) and the offset is committed."""
    settings = dispatcher_settings(make_settings, webhook_timeout_s=5.0, webhook_take_in_hold_s=0.5)
    server = Hanging()
    account = new_account()
    async with hanging(server), endpoint_store(settings) as store:
        endpoint, _ = await create_endpoint(store, "ws_a", server.url)
        async with running_dispatcher(settings) as running:
            await publish_events(settings, [status_event(account, 1)])
            key = state_key(endpoint.id, account).encode()

            async def written() -> list[bytes]:
                records = await read_topic(settings, settings.topics.webhook_state)
                return [r.value for r in records if r.key == key and r.value]

            deadline = time.monotonic() + 20
            found: list[bytes] = []
            while not found and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                found = await written()
            assert found, "the held delivery's pair was written while its attempt hangs"
            # ... and its offset is committed, though the attempt still hangs
            status = [
                t
                for tp, t in running.worker.trackers.items()
                if tp.topic == settings.topics.status and t.next_offset is not None
            ]
            await wait_until(lambda: all(t.committed == t.next_offset for t in status), timeout=10)
            assert status and server.open >= 1, "committed while the attempt is under way"
    state = DeliveryState.model_validate_json(found[-1])
    assert [p.version for p in state.queue] == [1]


async def log_entries(settings: Settings) -> dict[str, list[DeliveryLogEntry]]:
    """Every delivery-log entry written, by webhook-id, in the order written."""
    out: dict[str, list[DeliveryLogEntry]] = defaultdict(list)
    for entry in await read_log(settings):
        out[entry.webhook_id].append(entry)
    return out


async def test_a_delivery_attempted_within_its_hold_has_its_outcome_as_its_first_log_entry(
    make_settings: SettingsFactory,
) -> None:
    """Events queued behind their account's earlier one, whose attempt is under way, and
    delivered within the hold: each delivery's log has one entry, its outcome; no ``pending``
    entry was written for a delivery that was never written to its pair's record."""
    settings = dispatcher_settings(make_settings, webhook_take_in_hold_s=30.0)
    slow = SlowReceiver(delay_s=0.3)
    accounts = [new_account() for _ in range(3)]
    events = [status_event(a, v) for a in accounts for v in (1, 2, 3)]
    async with receiving(slow), endpoint_store(settings) as store:
        endpoint, secret = await create_endpoint(store, "ws_a", slow.url)
        slow.secrets.append(secret)
        async with running_dispatcher(settings):
            await publish_events(settings, events)
            await wait_until(lambda: len(slow.verified_once()) == len(events), timeout=30)
        log = await log_entries(settings)
        written = await read_topic(settings, settings.topics.webhook_state)

    assert not written, "every delivery settled within its hold: no pair written"
    ids = {webhook_id(ev.event_id, endpoint.id) for ev in events}
    assert set(log) == ids
    for entries in log.values():
        assert [(e.state, e.attempts) for e in entries] == [("delivered", 1)]


async def test_successes_do_not_wait_for_their_log_entries_and_a_stop_commits_past_them(
    make_settings: SettingsFactory,
) -> None:
    """An account's versions queued in one pair are attempted one after the other without
    each waiting for the previous one's log entry (its window, 1 s here, and ack): their
    entries share one log record, where a pair waiting for each would write one record per
    delivery. Nothing waits for those entries, which hold their events' offsets until
    acknowledged: a stop within the window waits for them before its last commit (the
    handler's ``flush``), so a restart reads none of the events again."""
    settings = dispatcher_settings(
        make_settings, webhook_take_in_hold_s=30.0, webhook_log_flush_s=1.0
    )
    receiver = Receiver()
    accounts = [new_account() for _ in range(4)]
    events = [status_event(a, v) for a in accounts for v in (1, 2, 3)]
    async with receiving(receiver), endpoint_store(settings) as store:
        endpoint, secret = await create_endpoint(store, "ws_a", receiver.url)
        receiver.secrets.append(secret)
        await publish_events(settings, events)  # before it starts: taken in together
        async with running_dispatcher(settings):
            await wait_until(lambda: len(receiver.verified_once()) == len(events), timeout=30)
        committed, ends = await group_offsets(settings)
        records = await read_topic(settings, settings.topics.webhook_deliveries)

    assert committed == ends, "every event committed: none is read again after a restart"
    ids = [webhook_id(ev.event_id, endpoint.id) for ev in events]
    assert sorted(d.webhook_id for d in receiver.seen) == sorted(ids), "each once"
    (record,) = [decode_log(r.value) for r in records]  # one window for all of them
    assert sorted(e.webhook_id for e in record) == sorted(ids)
    assert all(e.state == "delivered" for e in record)
    for account in accounts:
        assert [e.version for e in record if e.account_id == account] == [1, 2, 3]


async def group_offsets(settings: Settings) -> tuple[dict[int, int], dict[int, int]]:
    """The dispatcher group's committed offset and the end of each status partition that
    has records."""
    consumer = build_consumer(settings.kafka_config(), group_id=settings.webhook_consumer_group)
    await consumer.start()
    try:
        tps = await assign_all(consumer, settings.topics.status)
        ends = {tp.partition: end for tp, end in (await consumer.end_offsets(tps)).items() if end}
        committed = {p: await consumer.committed(tp) for tp in tps if (p := tp.partition) in ends}
    finally:
        await consumer.stop()
    return committed, ends


async def test_a_retried_head_and_the_delivery_behind_it_are_each_logged_once_per_step(
    make_settings: SettingsFactory,
) -> None:
    """The head fails once and waits for its retry; the event behind it is then written in
    its pair's record at once, its ``pending`` entry beside it. The head's own retry entry is
    not written a second time as a ``pending`` one."""
    settings = dispatcher_settings(
        make_settings,
        webhook_take_in_hold_s=30.0,
        webhook_retry_schedule_s="1,1",
        webhook_endpoint_backoff_after=1000,
    )
    flaky = Receiver(answer=fail_once)
    account = new_account()
    first, second = status_event(account, 1), status_event(account, 2)
    async with receiving(flaky), endpoint_store(settings) as store:
        endpoint, secret = await create_endpoint(store, "ws_a", flaky.url)
        flaky.secrets.append(secret)
        async with running_dispatcher(settings):
            await publish_events(settings, [first])
            await wait_until(lambda: len(flaky.seen) == 1, timeout=15)
            await publish_events(settings, [second])
            await wait_until(lambda: len(flaky.verified_once()) == 2, timeout=30)
        log = await log_entries(settings)

    head = [(e.state, e.attempts) for e in log[webhook_id(first.event_id, endpoint.id)]]
    behind = [(e.state, e.attempts) for e in log[webhook_id(second.event_id, endpoint.id)]]
    assert head == [("pending", 1), ("delivered", 2)]
    # written behind a head waiting for its retry: pending; then its own first try fails too
    assert behind == [("pending", 0), ("pending", 1), ("delivered", 2)]


async def test_a_delivery_waiting_past_its_hold_is_logged_pending_with_its_pair(
    make_settings: SettingsFactory,
) -> None:
    """Behind a head whose attempt hangs, a delivery is not attempted soon: once the hold is
    overdue its pair is written, and its ``pending`` entry shows it in the log meanwhile."""
    settings = dispatcher_settings(make_settings, webhook_timeout_s=5.0, webhook_take_in_hold_s=0.5)
    server = Hanging()
    account = new_account()
    first, second = status_event(account, 1), status_event(account, 2)
    async with hanging(server), endpoint_store(settings) as store:
        endpoint, _ = await create_endpoint(store, "ws_a", server.url)
        behind = webhook_id(second.event_id, endpoint.id)
        async with running_dispatcher(settings):
            await publish_events(settings, [first, second])
            deadline = time.monotonic() + 20
            log: dict[str, list[DeliveryLogEntry]] = {}
            while behind not in log and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                log = await log_entries(settings)
            assert server.open >= 1, "logged while the head's attempt still hangs"
    assert [(e.state, e.attempts) for e in log[behind]] == [("pending", 0)]


@dataclass
class SlowReceiver(Receiver):
    """A ``Receiver`` that takes a moment to answer, so a kill finds attempts under way."""

    delay_s: float = 0.25

    async def handle(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.delay_s)
        return await super().handle(request)


@pytest.mark.slow
async def test_a_dispatcher_killed_mid_flight_loses_nothing(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = dispatcher_settings(
        make_settings, partitions=3, webhook_retry_schedule_s="0.2,0.3,0.5,1,1"
    )
    steady = SlowReceiver()
    flaky = SlowReceiver(answer=fail_once)
    accounts = [new_account() for _ in range(30)]
    versions = 6
    events = [status_event(a, v) for v in range(1, versions + 1) for a in accounts]
    async with receiving(steady), receiving(flaky), endpoint_store(settings) as store:
        ep_steady, secret = await create_endpoint(store, "ws_a", steady.url)
        steady.secrets.append(secret)
        ep_flaky, secret = await create_endpoint(store, "ws_a", flaky.url)
        flaky.secrets.append(secret)
        receivers = {ep_steady.id: steady, ep_flaky.id: flaky}
        expected = {ep: {webhook_id(ev.event_id, ep) for ev in events} for ep in receivers}

        def delivered() -> int:
            return sum(len(r.verified_once()) for r in receivers.values())

        pool = DispatcherPool(
            settings,
            1,
            tmp_path,
            KAFKA_SESSION_TIMEOUT_MS="6000",
            WEBHOOK_ENDPOINT_BACKOFF_AFTER="1000",
        )
        try:
            pool.start(0)
            await pool.wait_ready()
            await publish_events(settings, events)
            # each pair goes through its versions one at a time: a third in, the later
            # versions of every pair are still to be sent, their events long fetched
            await wait_until(lambda: delivered() >= 2 * len(events) // 3, timeout=60)
            await asyncio.to_thread(pool.signal, 0, signal.SIGKILL)
            at_kill = delivered()
            pool.start(0)
            try:
                await wait_until(
                    lambda: all(
                        expected[ep] <= set(r.verified_once()) for ep, r in receivers.items()
                    ),
                    timeout=90,
                )
            except TimeoutError:
                raise AssertionError(f"undelivered after the restart\n{pool.log_tail(0)}") from None
            await asyncio.to_thread(pool.terminate_all)
        finally:
            pool.close()

    total = 2 * len(events)
    assert at_kill < total, "the kill found deliveries still to do"
    bodies: dict[str, set[str]] = defaultdict(set)
    for ep, receiver in receivers.items():
        seen = {d.webhook_id for d in receiver.seen}
        assert seen <= expected[ep], "one webhook-id per (event, endpoint), nothing else"
        for d in receiver.seen:
            bodies[d.webhook_id].add(repr(sorted(d.body.items())))
        assert all(d.verified for d in receiver.seen)
    assert all(len(b) == 1 for b in bodies.values()), "a re-send is the same body"
    resent = sum(
        len([d for d in r.seen if 200 <= d.status < 300]) - len(r.verified_once())
        for r in receivers.values()
    )
    print(f"killed with {at_kill}/{total} delivered; {resent} deliveries sent again")
