"""A workspace's limits hold across front-end replicas (issue 31, deliverable 3): three
front-ends on the real broker, a workspace's requests spread round-robin over them, as a load
balancer would (docs/operations.md, "Front-door limits" and "Quotas"). Each test prints the
measured ratio to the configured limit; on the code before ``worker.api.presence`` each was
about 3 (every replica enforced the whole limit on its own)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from tests.api.support import headers, running_api, wait_until
from tests.api.webhooks.test_quotas import events_of, hold_replays, quota_settings, replay
from tests.api.webhooks.test_routes import ENDPOINTS, URL, create, hooks, read_all
from worker.api.app import ApiRuntime
from worker.api.webhooks import creates
from worker.contract.webhook_endpoints import decode_endpoint
from worker.settings import Settings

__all__ = ["quota_settings"]  # the fixture, used here

pytestmark = pytest.mark.integration

REPLICAS = 3
#: The acceptance bound: a workspace's limit holds within this factor whatever the replicas.
BOUND = 1.2


@contextlib.asynccontextmanager
async def replicas(settings: Settings) -> AsyncIterator[list[ApiRuntime]]:
    """Three front-ends, each seeing the other two live."""
    async with contextlib.AsyncExitStack() as stack:
        apis = [await stack.enter_async_context(running_api(settings)) for _ in range(REPLICAS)]
        for api in apis:
            presence = getattr(api, "presence", None)  # absent before: measured all the same
            if presence is None:
                continue
            await wait_until(
                lambda p=presence: p.live() == REPLICAS,  # type: ignore[misc]
                what="every replica sees three",
            )
        yield apis


async def test_the_rate_limit_holds_for_the_workspace_across_three_replicas(
    quota_settings: Callable[..., Settings],
) -> None:
    rate, burst, seconds = 20.0, 10, 4.0
    settings = quota_settings(api_rate_limit_per_s=rate, api_rate_limit_burst=burst)
    async with replicas(settings) as apis, httpx.AsyncClient() as http:
        turn = itertools.cycle(apis)
        admitted: list[tuple[float, float]] = []  # (sent, answered), seconds from the start
        refused = 0
        started = time.monotonic()
        deadline = started + seconds

        async def client() -> None:
            nonlocal refused
            while time.monotonic() < deadline:
                api = next(turn)
                sent = time.monotonic() - started
                resp = await http.get(api.url + ENDPOINTS, headers=headers())
                if resp.status_code == 200:
                    admitted.append((sent, time.monotonic() - started))
                else:
                    assert resp.status_code == 429, resp.text
                    refused += 1

        await asyncio.gather(*(client() for _ in range(6)))
        ended = time.monotonic() - started
    # After the first second (the burst), what is admitted per second is the rate's work. Each
    # admission was decided between its request's sending and its answer: the windows below
    # hold them all however slowly the machine answers (a slow answer is no extra admission).
    steady = [(sent, answered) for sent, answered in admitted if answered >= 1.0]
    since = min((sent for sent, _ in steady), default=1.0)
    ratio = len(steady) / (rate * (ended - since))
    total = len(admitted) / (burst + rate * ended)
    print(
        f"\nrate limit, {REPLICAS} replicas: {len(admitted)} admitted, {refused} refused in"
        f" {ended:.2f} s; steady {len(steady)} in {ended - since:.2f} s = {ratio:.2f} x the"
        f" rate; all {total:.2f} x (burst + rate x time)"
    )
    assert refused > 0
    assert ratio <= BOUND
    assert total <= BOUND


async def test_concurrent_creates_over_three_replicas_leave_at_most_the_quota(
    quota_settings: Callable[..., Settings],
) -> None:
    quota = 4
    settings = quota_settings(webhook_endpoints_per_workspace=quota)
    async with replicas(settings) as apis:
        clients = [httpx.AsyncClient(base_url=api.url) for api in apis]
        try:
            answers = await asyncio.gather(
                *(
                    clients[n % REPLICAS].post(ENDPOINTS, json={"url": URL}, headers=headers())
                    for n in range(24)
                )
            )
            codes = sorted(r.status_code for r in answers)
            created = codes.count(201)
            assert set(codes) <= {201, 409}, [r.text for r in answers if r.status_code >= 500]
            for api in apis:  # every replica, once it has read every write, agrees
                registry = hooks(api).store.registry
                await wait_until(
                    lambda r=registry: r.count("ws_a") == created,  # type: ignore[misc]
                    what="the replica lists what was created",
                )
        finally:
            for http in clients:
                await http.aclose()
    live: dict[bytes, bool] = {}
    for msg in await read_all(settings, settings.topics.webhook_endpoints):
        if msg.value is None:
            live[msg.key] = False
        elif decode_endpoint(msg.value).workspace_id == "ws_a":
            live[msg.key] = True
    left = sum(live.values())
    print(
        f"\nendpoint quota {quota}, 24 creates over {REPLICAS} replicas: {created} answered 201,"
        f" {left} left on the topic = {left / quota:.2f} x the quota"
    )
    assert left == created == quota  # exact: the rolled-back creates answered 409


async def test_replays_in_flight_over_three_replicas_stay_within_the_quota(
    quota_settings: Callable[..., Settings],
) -> None:
    per_workspace = 2
    settings = quota_settings(
        webhook_replays_per_workspace=per_workspace,
        webhook_replay_max_running=2,
        webhook_replay_max_queued=8,
    )
    await events_of(settings, "ws_a")
    async with replicas(settings) as apis:
        held = [hold_replays(api, settings, "ws_a") for api in apis]
        clients = [httpx.AsyncClient(base_url=api.url) for api in apis]
        try:
            endpoint = await create(clients[0])

            def active_everywhere() -> bool:
                found = [hooks(a).store.registry.get("ws_a", endpoint["id"]) for a in apis]
                return all(r is not None and not creates.is_pending(r) for r in found)

            # A create is written pending, then activated: each replica answers the endpoint
            # once it has read the activation (docs/architecture.md, "Endpoint creates and
            # the quota").
            await wait_until(active_everywhere, what="every replica has the endpoint, active")
            answers = await asyncio.gather(
                *(replay(clients[n % REPLICAS], endpoint["id"]) for n in range(9))
            )
            started = sum(1 for r in answers if r.status_code == 202)
            assert all(r.status_code in (202, 429) for r in answers), [r.text for r in answers]
            in_flight = sum(hooks(a).replays.active for a in apis)  # ws_a's: the only ones
            print(
                f"\nreplay quota {per_workspace}, 9 replays over {REPLICAS} replicas: {started}"
                f" started, {in_flight} in flight = {in_flight / per_workspace:.2f} x the quota"
            )
            assert started == in_flight <= per_workspace
            assert started >= 1
        finally:
            for h in held:
                h.released.set()
            for http in clients:
                await http.aclose()
