"""Replays that can be followed (issue 34, item 4), against the session's real broker: the state
and counts read on another replica than the one running the replay, a cancellation asked on
another replica and honoured by the runner, another workspace's replay ids answered as unknown
ones, and the bounds of what is kept (per workspace, by age, a silent runner)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_B, headers, produce, running_api, wait_until
from tests.api.test_api_http import assert_error
from tests.api.webhooks.test_routes import status_event
from tests.webhooks.support import replay_scan
from worker.api.presence import Presence
from worker.api.webhooks.quotas import Refused
from worker.api.webhooks.replay import ReplayRunner
from worker.api.webhooks.replay_status import ReplayBoard
from worker.contract.webhook_endpoints import EndpointRecord, is_active
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.settings import Settings
from worker.webhooks.replay_scan import ReplayProgress
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration

ENDPOINTS = "/v1/webhook-endpoints"
URL = "https://hooks.example.com/in"


@pytest.fixture
def hook_settings(api_settings: ApiSettings) -> Callable[..., Settings]:
    key = generate_key()  # one key for every replica of a test

    def factory(**overrides: object) -> Settings:
        return api_settings(**{"webhook_secrets_key": key, **overrides})

    return factory


def data(resp: httpx.Response, status: int = 200) -> Any:
    assert resp.status_code == status, resp.text
    return resp.json()["data"]


async def follow(http: httpx.AsyncClient, path: str, *, until: set[str]) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def ended() -> bool:
        nonlocal seen
        seen = data(await http.get(path, headers=headers()))
        return seen["state"] in until

    for _ in range(300):
        if await ended():
            return seen
        await asyncio.sleep(0.1)
    raise AssertionError(f"replay still {seen}")


async def test_a_replay_started_on_one_replica_is_followed_on_another(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings()
    now = datetime.now(UTC)
    events = [status_event(f"acc_{i}", "ws_a", now, version=i + 1) for i in range(6)]
    other = status_event("acc_b", "ws_b", now)
    await produce(
        settings,
        settings.topics.status,
        [(e.account_id.encode(), e.model_dump_json().encode()) for e in (*events, other)],
    )
    async with (
        running_api(settings) as one,
        running_api(settings) as two,
        httpx.AsyncClient(base_url=one.url) as http_one,
        httpx.AsyncClient(base_url=two.url) as http_two,
    ):
        endpoint = data(await http_one.post(ENDPOINTS, json={"url": URL}, headers=headers()), 201)[
            "id"
        ]
        since = (now - timedelta(minutes=5)).isoformat()
        accepted = data(
            await http_one.post(
                f"{ENDPOINTS}/{endpoint}/replay", json={"since": since}, headers=headers()
            ),
            202,
        )
        path = f"{ENDPOINTS}/{endpoint}/replays/{accepted['replay_id']}"
        await wait_until(lambda: two.webhooks is not None, what="webhooks")
        # the other replica: it has read the endpoint and the replay's record
        await wait_until(
            lambda: (
                two.webhooks is not None
                and is_active(two.webhooks.store.registry.get("ws_a", endpoint))
            ),
            what="registry",
        )
        done = await follow(http_two, path, until={"done"})
        assert done["replay_id"] == accepted["replay_id"]
        assert done["endpoint_id"] == endpoint
        assert (done["events_found"], done["events_sent"], done["events_failed"]) == (6, 6, 0)
        assert done["records_scanned"] >= 7
        assert done["error"] is None and done["cancel_requested"] is False
        assert data(await http_one.get(path, headers=headers())) == done

        # cancelling an ended replay changes nothing: 200 with it as it is
        assert data(await http_two.post(f"{path}/cancel", headers=headers())) == done

        # another workspace's key, another endpoint, an unknown id: the same 404
        unknown = f"{ENDPOINTS}/{endpoint}/replays/rp_{uuid.uuid4().hex}"
        b_endpoint = data(
            await http_one.post(ENDPOINTS, json={"url": URL}, headers=headers(KEY_B)), 201
        )["id"]
        # asked of the other replica: it has read ws_b's endpoint active (while it holds the
        # create's pending record, its 404 is the endpoint's)
        await wait_until(
            lambda: (
                two.webhooks is not None
                and is_active(two.webhooks.store.registry.get("ws_b", b_endpoint))
            ),
            what="ws_b's endpoint on the other replica",
        )
        theirs = f"{ENDPOINTS}/{b_endpoint}/replays/{accepted['replay_id']}"
        pairs = [
            # ws_b on ws_a's endpoint: as on an endpoint that does not exist
            (
                await http_two.get(path, headers=headers(KEY_B)),
                await http_two.get(
                    f"{ENDPOINTS}/ep_{uuid.uuid4().hex}/replays/{accepted['replay_id']}",
                    headers=headers(KEY_B),
                ),
            ),
            (
                await http_two.post(f"{path}/cancel", headers=headers(KEY_B)),
                await http_two.post(f"{unknown}/cancel", headers=headers(KEY_B)),
            ),
            # ws_b's own endpoint and ws_a's replay id: as an unknown replay id
            (
                await http_two.get(theirs, headers=headers(KEY_B)),
                await http_two.get(
                    f"{ENDPOINTS}/{b_endpoint}/replays/rp_{uuid.uuid4().hex}",
                    headers=headers(KEY_B),
                ),
            ),
            (
                await http_two.post(f"{theirs}/cancel", headers=headers(KEY_B)),
                await http_two.post(
                    f"{ENDPOINTS}/{b_endpoint}/replays/rp_{uuid.uuid4().hex}/cancel",
                    headers=headers(KEY_B),
                ),
            ),
        ]
        for mine, unknown_one in pairs:
            assert (
                assert_error(mine, 404, "not_found", 10001)["error"]
                == assert_error(unknown_one, 404, "not_found", 10001)["error"]
            )
        # ws_a's own endpoint, an unknown replay id: the replay's 404
        assert_error(await http_two.get(unknown, headers=headers()), 404, "not_found", 10001)
        # malformed replay ids, hostile ones included
        for bad in ("rp_XYZ", "rp_" + "0" * 33, "x" * 300, "rp_%2e%2e"):
            resp = await http_two.get(f"{ENDPOINTS}/{endpoint}/replays/{bad}", headers=headers())
            assert resp.status_code in (400, 404), resp.text


class SlowStart:
    """A consumer whose ``start`` waits first (up to ``wait_s``, or until ``released``): a
    replay that stays running a while. A cancelled start is not cut short (it runs on aside,
    ``worker.engine.client_start``), so the test releases it rather than wait it out."""

    def __init__(self, consumer: Any, wait_s: float, released: asyncio.Event) -> None:
        self._consumer = consumer
        self._wait_s = wait_s
        self._released = released

    async def start(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), self._wait_s)
        await self._consumer.start()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


@asynccontextmanager
async def replica(settings: Settings, producer: Any, **board: Any) -> AsyncIterator[ReplayBoard]:
    """One front-end replica's presence and board on the real topic."""
    presence = Presence(
        build_consumer(settings.kafka_config(), fetch_max_wait_ms=50),
        settings.topics.api_presence,
        producer,
    )
    made = ReplayBoard(presence, **board)
    await presence.start()
    await made.start()
    try:
        await presence.wait_caught_up(20)
        yield made
    finally:
        await made.stop()
        await presence.stop()


def endpoint(workspace: str = "ws_a") -> EndpointRecord:
    stamp = datetime.now(UTC).isoformat()
    return EndpointRecord(
        id="ep_follow",
        workspace_id=workspace,
        url=URL,
        created_at=stamp,
        updated_at=stamp,
        revision=1,
    )


async def test_a_cancellation_asked_on_another_replica_is_honoured_by_the_runner(
    hook_settings: Callable[..., Settings],
) -> None:
    """The runner is on replica A; replica B writes the cancellation; A reads it within a
    progress interval, stops the replay and writes ``cancelled``, which B then reads. A second
    replay of the workspace, queued behind the first, is followed as ``queued`` meanwhile."""
    settings = hook_settings()
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    producer = build_producer(settings.kafka_config())
    await producer.start()
    released = asyncio.Event()
    try:
        async with replica(settings, producer) as a, replica(settings, producer) as b:
            runner = ReplayRunner(
                scan=replay_scan(
                    settings, producer, wrap=lambda consumer: SlowStart(consumer, 30.0, released)
                ),
                board=a,
                progress_every_s=0.2,
            )
            ep = endpoint()
            first = await runner.begin(ep, datetime.now(UTC))
            second = await runner.begin(ep, datetime.now(UTC))
            await wait_until(
                lambda: (got := b.get("ws_a", ep.id, first)) is not None and got.state == "running",
                what="running on B",
            )
            queued = b.get("ws_a", ep.id, second)
            assert queued is not None and queued.state == "queued"
            progress = b.get("ws_a", ep.id, first)
            assert progress is not None
            await b.request_cancel(progress)
            await wait_until(
                lambda: (
                    (got := b.get("ws_a", ep.id, first)) is not None and got.state == "cancelled"
                ),
                timeout=10,
                what="cancelled on B",
            )
            mine = a.get("ws_a", ep.id, first)  # as the runner wrote it
            assert mine is not None and mine.state == "cancelled"
            ended = b.get("ws_a", ep.id, first)
            assert ended is not None and ended.cancel_requested and ended.error is None
            # the workspace's other replay is not affected; stopping the replica is no
            # cancellation anybody asked for: it reads as failed. The starts the cancellations
            # cut short are let finish, so the runner's stop (which waits for them) ends.
            released.set()
            await runner.stop()
            await wait_until(
                lambda: (got := b.get("ws_a", ep.id, second)) is not None and got.state == "failed",
                timeout=10,
                what="second failed",
            )
            stopped = b.get("ws_a", ep.id, second)
            assert stopped is not None and "stopped" in (stopped.error or "")
            # another workspace's key cannot see either, nor through another endpoint id
            assert b.get("ws_b", ep.id, first) is None
            assert b.get("ws_a", "ep_other", first) is None
    finally:
        await producer.stop()


def record(replay_id: str, workspace: str, at: float, state: str = "done") -> ReplayProgress:
    return ReplayProgress.model_validate(
        {
            "replay_id": replay_id,
            "workspace_id": workspace,
            "endpoint_id": "ep_follow",
            "since": "2026-01-01T00:00:00Z",
            "state": state,
            "created_at": at,
            "updated_at": at,
        }
    )


async def test_what_is_kept_is_bounded_per_workspace_by_age_and_in_all(
    hook_settings: Callable[..., Settings],
) -> None:
    """A workspace's newest ``kept_per_workspace`` ended replays are kept, older ones and any
    past ``kept_for_s`` are tombstoned by a sweep (a new replica reads none of them back), a
    record past ``max_tracked`` is ignored, and a running replay whose runner went silent
    reads as failed."""
    settings = hook_settings()
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    producer = build_producer(settings.kafka_config())
    await producer.start()
    clock = [1_000_000.0]
    bounds = {"kept_per_workspace": 3, "kept_for_s": 3600.0, "max_tracked": 9}
    try:
        async with replica(settings, producer, clock=lambda: clock[0], **bounds) as a:
            ids = [f"rp_{uuid.uuid4().hex}" for _ in range(6)]
            for n, rid in enumerate(ids):
                await a.publish(record(rid, "ws_a", clock[0] + n))
            old_b = f"rp_{uuid.uuid4().hex}"
            await a.publish(record(old_b, "ws_b", clock[0] - 7200))
            silent = f"rp_{uuid.uuid4().hex}"
            await a.publish(record(silent, "ws_b", clock[0] - 60, state="running"))
            flood = [f"rp_{uuid.uuid4().hex}" for _ in range(5)]
            refused = 0
            for rid in flood:
                try:
                    await a.publish(record(rid, "ws_c", clock[0]))
                except Refused:
                    refused += 1  # nothing written: nothing left behind unswept
            assert len(a) == 9 and refused == 4  # max_tracked
            stale = a.get("ws_b", "ep_follow", silent)
            assert stale is not None and stale.state == "failed"
            assert a.get("ws_b", "ep_follow", old_b) is None  # past its age, even unswept
            assert await a.sweep() == 4  # 3 oldest of ws_a, the old one of ws_b
            assert {rid for rid in ids if a.get("ws_a", "ep_follow", rid)} == set(ids[3:])
        async with replica(settings, producer, clock=lambda: clock[0], **bounds) as fresh:
            await asyncio.sleep(0.5)
            assert {rid for rid in ids if fresh.get("ws_a", "ep_follow", rid)} == set(ids[3:])
            assert fresh.get("ws_b", "ep_follow", old_b) is None
            assert len(fresh) == 5  # ws_a's 3, the silent one, ws_c's one
    finally:
        await producer.stop()
