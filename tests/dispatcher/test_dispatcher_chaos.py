"""Chaos for the webhook dispatcher: three ``python -m worker webhooks`` processes in one
group, SIGKILLed at random moments and restarted, while status events are fanned out to a
flaky endpoint (~30 % 500/503), a steady one and, in another workspace, one that must hear
nothing. After the last restart everything must be delivered, signed, under one webhook-id
per (event, endpoint), and the first successful delivery of each version must arrive in
version order per (endpoint, account). A crash may re-send a delivery that already succeeded
(at-least-once) but only under its own webhook-id with the same body; those re-sends are
counted and printed.

Size and schedule come from the environment: DISPATCHER_CHAOS_ACCOUNTS, _VERSIONS, _KILLS,
_SEED, and the children's DISPATCHER_CHAOS_LOG_LEVEL (WARNING; their logs are in the test's
tmp_path). The defaults are CI-sized (about 40 s).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import SettingsFactory
from tests.webhooks.processes import DispatcherPool, dispatcher_settings
from tests.webhooks.support import (
    Delivery,
    Receiver,
    create_endpoint,
    endpoint_store,
    new_account,
    receiving,
    status_event,
)
from worker.contract.delivery_log import webhook_id
from worker.contract.messages import AuthStatusChanged
from worker.engine.kafka import build_producer
from worker.settings import Settings

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.integration]

ACCOUNTS = int(os.environ.get("DISPATCHER_CHAOS_ACCOUNTS", "60"))
VERSIONS = int(os.environ.get("DISPATCHER_CHAOS_VERSIONS", "5"))
KILLS = int(os.environ.get("DISPATCHER_CHAOS_KILLS", "4"))
SEED = int(os.environ.get("DISPATCHER_CHAOS_SEED", str(random.SystemRandom().randrange(10**6))))
LOG_LEVEL = os.environ.get("DISPATCHER_CHAOS_LOG_LEVEL", "WARNING")
DISPATCHERS = 3
PARTITIONS = 6
FLAKY_FAILURE_RATE = 0.3
#: Nothing may exhaust its retries (then it would be failed for good, not delivered): the
#: flaky receiver fails one webhook-id at most this often, the schedule allows more.
FLAKY_MAX_FAILURES = 5
RETRY_SCHEDULE_S = "0.2,0.3,0.5,1,1,1,1,1"
DELIVERED_TIMEOUT_S = 60.0


@dataclass
class TimedReceiver(Receiver):
    """A ``Receiver`` that also notes when each request arrived (``at[i]`` for ``seen[i]``),
    so a re-send can be told apart from the kill that caused it."""

    at: list[float] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        response = await super().handle(request)
        self.at.append(time.time())  # no await since ``seen`` got the request: aligned
        return response


def flaky_answer(rng: random.Random) -> Callable[[dict[str, Any], int], int]:
    def answer(body: dict[str, Any], tries: int) -> int:
        if tries < FLAKY_MAX_FAILURES and rng.random() < FLAKY_FAILURE_RATE:
            return rng.choice((500, 503))
        return 200

    return answer


async def publish_burst(settings: Settings, events: list[AuthStatusChanged]) -> None:
    """One producer, every send in flight at once (per-partition order is kept)."""
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        futures = [
            await producer.send(
                settings.topics.status, ev.model_dump_json().encode(), key=ev.account_id.encode()
            )
            for ev in events
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def chaos_monkey(pool: DispatcherPool, rng: random.Random, kills: list[str]) -> None:
    """Every few seconds SIGKILL a random dispatcher that is ready (joined and restored, so
    it owns work), and start it again at once."""
    for _ in range(KILLS):
        await asyncio.sleep(rng.uniform(2.0, 4.0))
        ready = await pool.ready_slots()
        while not ready:
            await asyncio.sleep(0.2)
            ready = await pool.ready_slots()
        victim = rng.choice(ready)
        code = await asyncio.to_thread(pool.signal, victim, signal.SIGKILL)
        kills.append(f"slot {victim} (exit {code}) at {clock()}")
        pool.start(victim)


def clock(at: float | None = None) -> str:
    at = time.time() if at is None else at
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"


def successes(receiver: Receiver) -> list[Delivery]:
    return [d for d in receiver.seen if 200 <= d.status < 300]


async def test_dispatcher_pool_survives_kills(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    print(f"dispatcher chaos seed={SEED} accounts={ACCOUNTS} versions={VERSIONS} kills={KILLS}")
    settings = dispatcher_settings(
        make_settings, partitions=PARTITIONS, webhook_retry_schedule_s=RETRY_SCHEDULE_S
    )
    flaky = TimedReceiver(answer=flaky_answer(random.Random(rng.random())))
    steady = TimedReceiver()
    other = TimedReceiver()
    accounts = [new_account() for _ in range(ACCOUNTS)]
    events = [status_event(a, v) for v in range(1, VERSIONS + 1) for a in accounts]
    kills: list[str] = []
    async with (
        receiving(flaky),
        receiving(steady),
        receiving(other),
        endpoint_store(settings) as store,
    ):
        ep_flaky, secret = await create_endpoint(store, "ws_a", flaky.url)
        flaky.secrets.append(secret)
        ep_steady, secret = await create_endpoint(store, "ws_a", steady.url)
        steady.secrets.append(secret)
        _, secret = await create_endpoint(store, "ws_other", other.url)
        other.secrets.append(secret)
        endpoints = {ep_flaky.id: flaky, ep_steady.id: steady}
        expected = {
            ep: {webhook_id(ev.event_id, ep) for ev in events} for ep in (ep_flaky.id, ep_steady.id)
        }

        pool = DispatcherPool(
            settings,
            DISPATCHERS,
            tmp_path,
            KAFKA_SESSION_TIMEOUT_MS="6000",
            KAFKA_HEARTBEAT_INTERVAL_MS="300",
            LOG_LEVEL=LOG_LEVEL,
        )
        started = time.monotonic()
        try:
            for i in range(DISPATCHERS):
                pool.start(i)
            await pool.wait_ready()
            monkey = asyncio.create_task(chaos_monkey(pool, rng, kills))
            # One burst per version, so every account has events in flight across the kills.
            for v in range(VERSIONS):
                await publish_burst(settings, events[v * ACCOUNTS : (v + 1) * ACCOUNTS])
                await asyncio.sleep(rng.uniform(1.0, 2.5))
            await monkey
            print(f"kills: {kills}; last restart after {time.monotonic() - started:.1f} s")

            deadline = time.monotonic() + DELIVERED_TIMEOUT_S
            while not all(
                expected[ep] <= {d.webhook_id for d in successes(r)} for ep, r in endpoints.items()
            ):
                if time.monotonic() > deadline:
                    missing = {
                        ep: len(expected[ep] - {d.webhook_id for d in successes(r)})
                        for ep, r in endpoints.items()
                    }
                    tails = "\n".join(
                        f"--- slot {i} ---\n{pool.log_tail(i)}" for i in range(DISPATCHERS)
                    )
                    raise AssertionError(f"undelivered after the last restart: {missing}\n{tails}")
                await asyncio.sleep(0.2)
            delivered_after = time.monotonic() - started
            await pool.wait_ready()  # every process is past start-up: SIGTERM is a clean stop
            codes = await asyncio.to_thread(pool.terminate_all)
        finally:
            pool.close()

    print(
        f"all delivered after {delivered_after:.1f} s; starts={pool.starts}; "
        f"SIGTERM to exit, seconds: {pool.stop_seconds}"
    )
    unclean = [i for i, code in enumerate(codes) if code != 0]
    assert not unclean, f"exit codes {codes} after SIGTERM:\n" + "\n".join(
        f"--- slot {i} ---\n{pool.log_tail(i)}" for i in unclean
    )

    for ep, receiver in endpoints.items():
        unverified = [d.webhook_id for d in receiver.seen if not d.verified]
        assert unverified == [], f"requests that fail standardwebhooks verification: {unverified}"

        # One webhook-id per (event, endpoint), and it is the deterministic one.
        ids_by_event: dict[str, set[str]] = defaultdict(set)
        for d in receiver.seen:
            ids_by_event[d.body["data"]["event_id"]].add(d.webhook_id)
        assert {e: ids for e, ids in ids_by_event.items() if len(ids) != 1} == {}
        assert {e: ids.pop() for e, ids in ids_by_event.items()} == {
            ev.event_id: webhook_id(ev.event_id, ep) for ev in events
        }

        # Re-sends after a crash: same id, same body; counted and shown.
        ok = successes(receiver)
        first_body: dict[str, dict[str, Any]] = {}
        for d in ok:
            assert first_body.setdefault(d.webhook_id, d.body) == d.body, d.webhook_id
        resent = {i: n for i, n in Counter(d.webhook_id for d in ok).items() if n > 1}
        print(
            f"endpoint {ep}: requests={len(receiver.seen)} delivered={len(first_body)} "
            f"failed attempts={len(receiver.seen) - len(ok)} "
            f"re-sent after success={sum(n - 1 for n in resent.values())}"
        )
        for wid, n in sorted(resent.items()):
            body = first_body[wid]["data"]
            when = [
                clock(t)
                for d, t in zip(receiver.seen, receiver.at, strict=True)
                if d.webhook_id == wid and 200 <= d.status < 300
            ]
            print(
                f"  re-sent {wid} x{n}: account={body['account_id']} v{body['version']} at {when}"
            )

        # Order: the first success of each version, per account, in version order.
        firsts: dict[str, list[int]] = defaultdict(list)
        seen_ids: set[str] = set()
        for d in ok:
            if d.webhook_id not in seen_ids:
                seen_ids.add(d.webhook_id)
                firsts[d.body["data"]["account_id"]].append(d.body["data"]["version"])
        out_of_order = {a: vs for a, vs in firsts.items() if vs != sorted(vs)}
        assert out_of_order == {}, f"first deliveries out of version order at {ep}"
        assert {a: len(vs) for a, vs in firsts.items()} == dict.fromkeys(accounts, VERSIONS)

    assert other.seen == [], "the other workspace's endpoint received requests"
