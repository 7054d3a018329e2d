"""Per-workspace quotas of the webhook routes over real HTTP against the real broker, as a
hostile workspace would probe them (docs/operations.md, "Quotas"): endpoints per workspace
(also raced, and on a replica still reading the topic), replays in flight per workspace and per
process, signing secrets per endpoint (40 rotations, expire-previous, records of the unbounded
form) and the field limits. Each refusal is the catalogued answer and counted in
``passkey_api_quota_refusals``; the other workspace is served throughout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_B, headers, produce, running_api, wait_until
from tests.api.test_api_http import assert_error
from tests.api.webhooks.test_routes import (
    ENDPOINTS,
    ONE,
    URL,
    create,
    hooks,
    ok,
    read_all,
    replay_ended,
    status_event,
)
from worker.api.app import ApiRuntime
from worker.api.webhooks import creates, quotas
from worker.contract.delivery_log import decode_replay
from worker.contract.webhook_endpoints import EndpointRecord, StoredSecret, decode_endpoint
from worker.settings import Settings
from worker.webhooks.secrets_box import SecretsBox, generate_key
from worker.webhooks.signing import generate_secret, sign
from worker.webhooks.signing import headers as signed_headers

pytestmark = pytest.mark.integration

ENDPOINT_QUOTA_CODE = ("webhook_endpoint_quota_exceeded", 90004)
TOO_MANY = ("rate_limited", 90002)


@pytest.fixture
def quota_settings(api_settings: ApiSettings) -> Callable[..., Settings]:
    """``api_settings`` with a webhook secrets key."""

    def factory(**overrides: object) -> Settings:
        return api_settings(**{"webhook_secrets_key": generate_key(), **overrides})

    return factory


def refusals(registry: CollectorRegistry, quota: str) -> float:
    value = registry.get_sample_value("passkey_api_quota_refusals_total", {"quota": quota})
    assert value is not None, f"passkey_api_quota_refusals{{quota={quota!r}}} is not exported"
    return value


def dropped(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value(
        "passkey_api_webhook_secrets_dropped_total", {"reason": reason}
    )
    assert value is not None
    return value


def over_quota(resp: httpx.Response, limit: int) -> None:
    message = assert_error(resp, 409, *ENDPOINT_QUOTA_CODE)["error"]["message"]
    assert f"quota of {limit} webhook endpoints" in message, message


# -- endpoints per workspace ----------------------------------------------------------------


async def test_endpoints_up_to_the_quota_then_refused(
    quota_settings: Callable[..., Settings],
) -> None:
    registry = CollectorRegistry()
    settings = quota_settings(webhook_endpoints_per_workspace=3)
    async with (
        running_api(settings, registry=registry) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        mine = [await create(http, description=f"n{i}") for i in range(3)]
        # an inactive endpoint still counts: it exists and can be activated again
        ok(await http.post(ONE.format(mine[0]["id"]) + "/deactivate", headers=headers()))
        over_quota(await http.post(ENDPOINTS, json={"url": URL}, headers=headers()), 3)
        assert refusals(registry, quotas.ENDPOINTS) == 1
        assert len(ok(await http.get(ENDPOINTS, headers=headers()))) == 3  # nothing created

        # the other workspace has its own quota
        theirs = [await create(http, KEY_B) for _ in range(3)]
        assert {e["workspace_id"] for e in theirs} == {"ws_b"}

        # a deleted endpoint frees its place
        gone = await http.delete(ONE.format(mine[1]["id"]), headers=headers())
        assert gone.status_code == 204
        again = await create(http)
        over_quota(await http.post(ENDPOINTS, json={"url": URL}, headers=headers()), 3)
        listed = {e["id"] for e in ok(await http.get(ENDPOINTS, headers=headers()))}
        assert listed == {mine[0]["id"], mine[2]["id"], again["id"]}
        assert refusals(registry, quotas.ENDPOINTS) == 2


async def test_concurrent_creates_never_pass_the_quota(
    quota_settings: Callable[..., Settings],
) -> None:
    """An attacker fires many creates at once at one replica: each waits for the broker's
    ack, so on main all of them passed a count taken before any was written."""
    settings = quota_settings(webhook_endpoints_per_workspace=4)
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        answers = await asyncio.gather(
            *(http.post(ENDPOINTS, json={"url": URL}, headers=headers()) for _ in range(24))
        )
        assert sorted(r.status_code for r in answers) == [201] * 4 + [409] * 20
        for resp in answers:
            if resp.status_code != 201:
                over_quota(resp, 4)
        assert len(ok(await http.get(ENDPOINTS, headers=headers()))) == 4
    written = {
        msg.key
        for msg in await read_all(settings, settings.topics.webhook_endpoints)
        if msg.value is not None and decode_endpoint(msg.value).workspace_id == "ws_a"
    }
    assert len(written) == 4  # nothing beyond the quota reached the topic either


async def test_a_replica_counts_the_endpoints_other_replicas_wrote(
    quota_settings: Callable[..., Settings],
) -> None:
    """A second replica counts what the first wrote once its registry has read it, and a
    replica that has just started counts the endpoints on the topic (create waits for its
    registry to catch up, like the reads do)."""
    settings = quota_settings(webhook_endpoints_per_workspace=2)
    async with (
        running_api(settings) as first,
        running_api(settings) as second,
        httpx.AsyncClient(base_url=first.url) as one,
        httpx.AsyncClient(base_url=second.url) as two,
    ):
        await create(one)
        await create(one)
        await wait_until(
            lambda: hooks(second).store.registry.count("ws_a") == 2, what="second replica read"
        )
        over_quota(await two.post(ENDPOINTS, json={"url": URL}, headers=headers()), 2)
    # a replica that has just started (not waited for: the request may reach it first)
    async with (
        running_api(settings, ready=False) as fresh,
        httpx.AsyncClient(base_url=fresh.url) as http,
    ):
        over_quota(await http.post(ENDPOINTS, json={"url": URL}, headers=headers()), 2)


# -- replays in flight ----------------------------------------------------------------------


class HeldReplays:
    """The front-end's producer with the replay records of ``workspace`` held back until
    ``release``: its replays stay in flight for as long as the test needs."""

    def __init__(self, producer: Any, topic: str, workspace: str) -> None:
        self._producer = producer
        self._topic = topic
        self._workspace = workspace
        self.released = asyncio.Event()
        self.held = 0

    async def send(self, topic: str, value: bytes | None, **kwargs: Any) -> Any:
        mine = (
            topic == self._topic
            and value is not None
            and decode_replay(value).workspace_id == self._workspace
        )
        if mine:
            self.held += 1
            await self.released.wait()
        return await self._producer.send(topic, value, **kwargs)


def hold_replays(api: ApiRuntime, settings: Settings, workspace: str) -> HeldReplays:
    runner = hooks(api).replays
    held = HeldReplays(api.producer, settings.topics.webhook_replays, workspace)
    runner.scan.producer = held  # the runner's scan sends through it from now on
    return held


async def events_of(settings: Settings, *workspaces: str) -> None:
    now = datetime.now(UTC)
    events = [status_event(f"acc_{w}", w, now) for w in workspaces]
    await produce(
        settings,
        settings.topics.status,
        [(e.account_id.encode(), e.model_dump_json().encode()) for e in events],
    )


def replay(http: httpx.AsyncClient, endpoint_id: str, key: str | None = None) -> Any:
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    return http.post(
        ONE.format(endpoint_id) + "/replay",
        json={"since": since},
        headers=headers(*([key] if key else [])),
    )


async def test_replays_per_workspace_and_the_other_workspace_still_served(
    quota_settings: Callable[..., Settings],
) -> None:
    """ws_a fills its replay quota with replays that do not end; its next is refused 429
    with Retry-After, and ws_b's replay runs to its end meanwhile: ws_a runs one replay at
    a time, so it holds one of the two running slots, never both (on main its two replays
    held both and ws_b's waited behind them; a third answered 500)."""
    registry = CollectorRegistry()
    settings = quota_settings(
        webhook_replays_per_workspace=2, webhook_replay_max_running=2, webhook_replay_max_queued=8
    )
    await events_of(settings, "ws_a", "ws_b")
    async with (
        running_api(settings, registry=registry) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        held = hold_replays(api, settings, "ws_a")
        try:
            mine = await create(http)
            theirs = await create(http, KEY_B)
            started = [ok(await replay(http, mine["id"]), 202)["replay_id"] for _ in range(2)]
            refused = await replay(http, mine["id"])
            message = assert_error(refused, 429, *TOO_MANY)["error"]["message"]
            assert "quota" in message and "Nothing was started" in message
            assert refused.headers["retry-after"] == "30"
            assert refusals(registry, quotas.REPLAYS) == 1
            assert hooks(api).replays.active == 2  # ws_a's two

            other = ok(await replay(http, theirs["id"], KEY_B), 202)["replay_id"]
            ended = await replay_ended(api, theirs["id"], other, "ws_b")
            assert (ended.state, ended.events_sent) == ("done", 1)
            await wait_until(lambda: held.held == 1, what="ws_a's first replay holding")
            # ws_b's slot is given back once its task is done, a moment after its last record
            await wait_until(lambda: hooks(api).replays.active == 2, what="ws_a's two in flight")
            assert registry.get_sample_value("passkey_api_webhook_replays_in_flight") == 2
        finally:
            held.released.set()
        for replay_id in started:
            done = await replay_ended(api, mine["id"], replay_id)
            assert (done.state, done.events_sent) == ("done", 1)
        await wait_until(lambda: hooks(api).replays.active == 0, what="the slots given back")
        # the quota is free again
        ok(await replay(http, mine["id"]), 202)


async def test_a_full_process_refuses_with_429_not_500(
    quota_settings: Callable[..., Settings],
) -> None:
    registry = CollectorRegistry()
    settings = quota_settings(
        webhook_replays_per_workspace=2, webhook_replay_max_running=1, webhook_replay_max_queued=0
    )
    await events_of(settings, "ws_a")
    async with (
        running_api(settings, registry=registry) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        held = hold_replays(api, settings, "ws_a")
        try:
            mine = await create(http)
            theirs = await create(http, KEY_B)
            ok(await replay(http, mine["id"]), 202)
            refused = await replay(http, theirs["id"], KEY_B)
            message = assert_error(refused, 429, *TOO_MANY)["error"]["message"]
            assert "on this service" in message
            assert int(refused.headers["retry-after"]) > 0
            assert refusals(registry, quotas.REPLAY_CAPACITY) == 1
            assert refusals(registry, quotas.REPLAYS) == 0
        finally:
            held.released.set()


async def test_a_workspace_at_its_share_of_replays_leaves_a_place_for_another(
    quota_settings: Callable[..., Settings],
) -> None:
    """Two places in all (one running, one queued), two per workspace: through the admission
    rule ws_a's second replay would leave no place for a workspace holding none, so it is
    refused 429 and ws_b's first is taken (before the rule, ws_a took both and ws_b was
    refused)."""
    registry = CollectorRegistry()
    settings = quota_settings(
        webhook_replays_per_workspace=2, webhook_replay_max_running=1, webhook_replay_max_queued=1
    )
    await events_of(settings, "ws_a", "ws_b")
    async with (
        running_api(settings, registry=registry) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        held = hold_replays(api, settings, "ws_a")
        try:
            mine = await create(http)
            theirs = await create(http, KEY_B)
            ok(await replay(http, mine["id"]), 202)
            refused = await replay(http, mine["id"])
            assert_error(refused, 429, *TOO_MANY)
            assert int(refused.headers["retry-after"]) > 0
            assert refusals(registry, quotas.REPLAY_CAPACITY) == 1
            queued = ok(await replay(http, theirs["id"], KEY_B), 202)["replay_id"]
            progress = hooks(api).replays.board.get("ws_b", theirs["id"], queued)
            assert progress is not None and not progress.ended  # in flight behind ws_a's
        finally:
            held.released.set()


# -- deliveries scans per workspace ---------------------------------------------------------


async def test_forty_rotations_leave_two_secrets_and_a_bounded_record(
    quota_settings: Callable[..., Settings],
) -> None:
    registry = CollectorRegistry()
    settings = quota_settings(webhook_secret_overlap_s=3600.0)
    async with (
        running_api(settings, registry=registry) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        endpoint = await create(http)
        rotate = ONE.format(endpoint["id"]) + "/rotate-secret"
        first = ok(await http.post(rotate, headers=headers()))["secret"]
        store = hooks(api).store
        after_one = store.registry.get("ws_a", endpoint["id"])
        assert after_one is not None
        secrets = [first]
        for _ in range(39):
            secrets.append(ok(await http.post(rotate, headers=headers()))["secret"])
        record = store.registry.get("ws_a", endpoint["id"])
        assert record is not None and record.revision == after_one.revision + 39
        assert len(record.secrets) == 2
        assert store.signing_secrets(record) == [secrets[-1], secrets[-2]]
        # the same size as after one rotation, give or take the digits of the revision and
        # of the expiry's float
        size = len(record.model_dump_json())
        assert abs(size - len(after_one.model_dump_json())) <= 8 and size < 1024
        assert dropped(registry, "rotated") == 39  # every rotation but the first dropped one
    # as stored: the last record on the topic is as small, for every reader
    stored = [
        msg.value
        for msg in await read_all(settings, settings.topics.webhook_endpoints)
        if msg.key == endpoint["id"].encode()
    ]
    assert stored[-1] is not None and len(stored[-1]) < 1024
    assert len(decode_endpoint(stored[-1]).secrets) == 2


async def test_expire_previous_leaves_one_signature(
    quota_settings: Callable[..., Settings],
) -> None:
    registry = CollectorRegistry()
    settings = quota_settings(webhook_secret_overlap_s=3600.0)
    async with (
        running_api(settings, registry=registry) as api,
        running_api(settings) as dispatcher_view,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        created = await create(http)
        one = ONE.format(created["id"])
        rotated = ok(await http.post(f"{one}/rotate-secret", headers=headers()))["secret"]
        store = hooks(api).store
        record = store.registry.get("ws_a", created["id"])
        assert record is not None
        body = b'{"type":"account.auth_error"}'
        both = signed_headers(store.signing_secrets(record), "msg_1", 1_700_000_000, body)
        assert both["webhook-signature"].count("v1,") == 2

        # another workspace cannot expire it: the same 404 as an unknown endpoint
        assert_error(
            await http.post(f"{one}/expire-previous-secret", headers=headers(KEY_B)),
            404,
            "not_found",
            10001,
        )
        expired = ok(await http.post(f"{one}/expire-previous-secret", headers=headers()))
        assert "secret" not in expired and expired["id"] == created["id"]
        assert dropped(registry, "expired") == 1

        record = store.registry.get("ws_a", created["id"])
        assert record is not None and len(record.secrets) == 1
        assert store.signing_secrets(record) == [rotated]
        signature = signed_headers(store.signing_secrets(record), "msg_1", 1_700_000_000, body)
        assert signature["webhook-signature"] == sign([rotated], "msg_1", 1_700_000_000, body)
        assert (
            sign([created["secret"]], "msg_1", 1_700_000_000, body)
            not in (signature["webhook-signature"])
        )
        # any other reader of the topic (a dispatcher) signs with the one secret too
        other = hooks(dispatcher_view).store
        await wait_until(
            lambda: (
                (r := other.registry.get("ws_a", created["id"])) is not None
                and r.revision == record.revision
            ),
            what="the other reader caught up",
        )
        theirs = other.registry.get("ws_a", created["id"])
        assert theirs is not None and other.signing_secrets(theirs) == [rotated]

        # nothing left to expire: answered, nothing written
        again = ok(await http.post(f"{one}/expire-previous-secret", headers=headers()))
        assert again == expired
        held = store.registry.get("ws_a", created["id"])
        assert held is not None and held.revision == record.revision


async def test_records_with_many_secrets_stay_readable_and_shrink_on_the_next_write(
    quota_settings: Callable[..., Settings],
) -> None:
    """A record written by an earlier version after 40 rotations inside the overlap: it
    decodes, only its two newest secrets sign, and the next write stores just those."""
    key = generate_key()
    registry = CollectorRegistry()
    settings = quota_settings(webhook_secrets_key=key)
    box = SecretsBox(key)
    endpoint_id = "ep_" + "1" * 32
    plain = [generate_secret() for _ in range(41)]  # newest first, as rotations stored them
    later = time.time() + 3600
    old = EndpointRecord(
        id=endpoint_id,
        workspace_id="ws_a",
        url=URL,
        created_at="2026-01-01T00:00:00.000Z",
        updated_at="2026-01-01T00:00:00.000Z",
        revision=41,
        secrets=tuple(
            StoredSecret(
                ciphertext=box.encrypt(p, endpoint_id.encode()),
                created_at="2026-01-01T00:00:00.000Z",
                expires_at=None if i == 0 else later - i,
            )
            for i, p in enumerate(plain)
        ),
    )
    raw = old.model_dump_json().encode()
    assert len(raw) > 8000
    await produce(settings, settings.topics.webhook_endpoints, [(endpoint_id.encode(), raw)])
    async with (
        running_api(settings, registry=registry) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        got = ok(await http.get(ONE.format(endpoint_id), headers=headers()))
        assert got["id"] == endpoint_id
        store = hooks(api).store
        held = store.registry.get("ws_a", endpoint_id)
        assert held is not None and len(held.secrets) == 41
        assert store.signing_secrets(held) == plain[:2]
        ok(await http.patch(ONE.format(endpoint_id), json={"description": "x"}, headers=headers()))
        trimmed = store.registry.get("ws_a", endpoint_id)
        assert trimmed is not None and len(trimmed.secrets) == 2
        assert store.signing_secrets(trimmed) == plain[:2]
        assert dropped(registry, "trimmed") == 39
    stored = [
        msg.value
        for msg in await read_all(settings, settings.topics.webhook_endpoints)
        if msg.key == endpoint_id.encode()
    ]
    assert stored[-1] is not None and len(stored[-1]) < 1024


# -- field limits ---------------------------------------------------------------------------


async def test_over_long_fields_are_refused(quota_settings: Callable[..., Settings]) -> None:
    registry = CollectorRegistry()
    settings = quota_settings(
        webhook_url_max_chars=64, webhook_description_max_chars=10, webhook_event_types_max_items=3
    )
    url_at_limit = "https://hooks.example.com/" + "p" * (64 - len("https://hooks.example.com/"))
    assert len(url_at_limit) == 64
    async with (
        running_api(settings, registry=registry) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):

        def too_long(resp: httpx.Response, fragment: str) -> None:
            message = assert_error(resp, 400, "invalid_request", 10000)["error"]["message"]
            assert fragment in message, message
            assert "pppp" not in message  # never the value

        post = http.post
        too_long(
            await post(ENDPOINTS, json={"url": url_at_limit + "p"}, headers=headers()),
            "url is longer than 64 characters",
        )
        too_long(
            await post(ENDPOINTS, json={"url": URL, "description": "d" * 11}, headers=headers()),
            "description is longer than 10 characters",
        )
        types = ["account.auth_error"] * 4
        too_long(
            await post(ENDPOINTS, json={"url": URL, "event_types": types}, headers=headers()),
            "event_types has more than 3 entries",
        )
        assert ok(await http.get(ENDPOINTS, headers=headers())) == []
        endpoint = await create(http, url=url_at_limit, description="d" * 10, event_types=types[:3])
        assert endpoint["event_types"] == ["account.auth_error"]
        one = ONE.format(endpoint["id"])
        too_long(
            await http.patch(one, json={"description": "d" * 11}, headers=headers()),
            "description is longer than 10 characters",
        )
        too_long(
            await http.patch(one, json={"url": url_at_limit + "p"}, headers=headers()),
            "url is longer than 64 characters",
        )
        assert ok(await http.get(one, headers=headers()))["description"] == "d" * 10
        assert refusals(registry, quotas.URL_LENGTH) == 2
        assert refusals(registry, quotas.DESCRIPTION_LENGTH) == 2
        assert refusals(registry, quotas.EVENT_TYPES_ITEMS) == 1
        served = (await http.get("/openapi.json")).json()["components"]["schemas"]
        assert served["CreateEndpointBody"]["properties"]["url"]["maxLength"] == 64


async def test_the_default_limits_refuse_what_fills_the_body_limit(
    quota_settings: Callable[..., Settings],
) -> None:
    """What an attacker would send: fields as large as the 64 KiB body allows."""
    async with (
        running_api(quota_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for body, fragment in (
            ({"url": URL, "description": "d" * 60_000}, "longer than 512"),
            ({"url": "https://hooks.example.com/" + "p" * 60_000}, "longer than 2048"),
            ({"url": URL, "event_types": ["account.auth_error"] * 3_000}, "more than 16"),
        ):
            resp = await http.post(ENDPOINTS, json=body, headers=headers())
            message = assert_error(resp, 400, "invalid_request", 10000)["error"]["message"]
            assert fragment in message, message
        assert ok(await http.get(ENDPOINTS, headers=headers())) == []


# -- endpoint creates: never deliverable before the quota check (issue "Tenant budgets") ----


class HeldCreate:
    """A front-end's producer whose first record of ``workspace`` on the endpoints topic is held
    until ``released`` and then sent, even when its caller has stopped waiting (a write that
    timed out and still lands); every other record goes through."""

    def __init__(self, producer: Any, topic: str, workspace: str) -> None:
        self._producer = producer
        self._topic = topic
        self._workspace = workspace
        self.released = asyncio.Event()
        self.held = 0
        self.late: list[asyncio.Task[Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    async def send(self, topic: str, value: bytes | None, **kwargs: Any) -> Any:
        mine = (
            topic == self._topic
            and value is not None
            and decode_endpoint(value).workspace_id == self._workspace
        )
        if not mine or self.held:
            return await self._producer.send(topic, value, **kwargs)
        self.held += 1

        async def late() -> Any:
            await self.released.wait()
            return await self._producer.send(topic, value, **kwargs)

        self.late.append(asyncio.create_task(late()))
        return await asyncio.shield(self.late[-1])


def hold_create(api: ApiRuntime, settings: Settings, workspace: str) -> HeldCreate:
    store = hooks(api).store
    held = HeldCreate(store.producer, settings.topics.webhook_endpoints, workspace)
    store.producer = held  # the store writes through it from now on
    return held


async def records_of(settings: Settings, workspace: str) -> list[EndpointRecord]:
    """Every endpoint record of ``workspace`` on the topic, in order (tombstones left out)."""
    return [
        record
        for msg in await read_all(settings, settings.topics.webhook_endpoints)
        if msg.value is not None
        and (record := decode_endpoint(msg.value)).workspace_id == workspace
    ]


async def test_an_endpoint_over_the_quota_across_replicas_is_never_active(
    quota_settings: Callable[..., Settings],
) -> None:
    """Two replicas each admit the workspace's last endpoint (quota 1): replica one's create is
    held on its way to the topic while replica two's is written and kept. Released, replica
    one's lands after it on the workspace's partition, is not kept and answers the quota's
    409; it was written pending (inactive) and deleted, so no active record of it ever
    reached the topic and no dispatcher could deliver to it. On main it was written active,
    checked, then deleted: deliverable for as long as the check took."""
    registry = CollectorRegistry()
    settings = quota_settings(webhook_endpoints_per_workspace=1)
    async with (
        running_api(settings, registry=registry) as one,
        running_api(settings) as two,
        httpx.AsyncClient(base_url=one.url, timeout=30) as http_one,
        httpx.AsyncClient(base_url=two.url, timeout=30) as http_two,
    ):
        held = hold_create(one, settings, "ws_a")
        first = asyncio.create_task(http_one.post(ENDPOINTS, json={"url": URL}, headers=headers()))
        await wait_until(lambda: held.held == 1, what="replica one's create held")
        kept = await create(http_two)  # replica two has not read replica one's: admitted
        held.released.set()
        over_quota(await first, 1)
        assert refusals(registry, quotas.ENDPOINTS) == 1
        for http in (http_one, http_two):
            listed = [e["id"] for e in ok(await http.get(ENDPOINTS, headers=headers()))]
            assert listed == [kept["id"]]
    written = await records_of(settings, "ws_a")
    refused = {r.id for r in written} - {kept["id"]}
    assert len(refused) == 1, written  # replica one's create reached the topic, pending
    assert [r.status for r in written if r.id in refused] == ["inactive"]
    assert [r.status for r in written if r.id == kept["id"]][-1] == "active"


async def test_a_create_whose_write_timed_out_is_never_an_endpoint_and_is_cleaned(
    quota_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create whose write times out answers 500 "nothing was created"; the record that
    still lands later is pending, so it is never listed, found or delivered to, and the
    workspace's next create deletes it once it is stale (``STALE_S``, shortened here) and is
    admitted (quota 1). On main the late record was an active endpoint the answer denied,
    never re-checked against the quota."""
    monkeypatch.setattr(creates, "STALE_S", 0.5)
    settings = quota_settings(webhook_endpoints_per_workspace=1, webhook_store_timeout_s=1.0)
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        held = hold_create(api, settings, "ws_a")
        timed_out = await http.post(ENDPOINTS, json={"url": URL}, headers=headers())
        message = assert_error(timed_out, 500, "create_webhook_endpoint_failed", 40001)
        assert "nothing was created" in message["error"]["message"]
        held.released.set()
        await asyncio.gather(*held.late)
        registry = hooks(api).store.registry
        await wait_until(lambda: registry.count("ws_a") == 1, what="the late record read")
        (late,) = registry.of_workspace("ws_a")
        assert creates.is_pending(late)
        assert ok(await http.get(ENDPOINTS, headers=headers())) == []
        gone = await http.get(ONE.format(late.id), headers=headers())
        assert gone.status_code == 404
        await asyncio.sleep(0.6)  # past the (shortened) STALE_S
        admitted = await create(http)
        assert [r.id for r in registry.of_workspace("ws_a")] == [admitted["id"]]
    written = await records_of(settings, "ws_a")
    assert {r.status for r in written if r.id == late.id} == {"inactive"}
