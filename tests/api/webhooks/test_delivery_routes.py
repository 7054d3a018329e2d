"""The integrator's delivery routes over real HTTP against the real broker, with a real
dispatcher and receivers on loopback: a test send arrives signed (checked with the
``standardwebhooks`` library) and shows in the log; a failing receiver's attempts carry their
status, latency, capped body excerpt and error kind; a resend arrives under the same
webhook-id with the same body; the cursor pages without repeats or gaps while deliveries are
appended; the filters; and what an attacker would send (docs/api.md, "Sending a test",
"Reading the delivery log", "Resending one delivery")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_B, headers, produce, running_api, wait_until
from tests.api.test_api_http import assert_error
from tests.webhooks.support import receiving, running_dispatcher
from worker.api.webhooks.delivery_log import Cursor
from worker.api.webhooks.sends import SendBudget
from worker.contract.delivery_log import EXCERPT_CHARS, DeliveryLogEntry
from worker.contract.messages import AuthStatusChanged, rfc3339
from worker.contract.webhook_endpoints import EVENT_ERROR, EVENT_STATUS_CHANGED
from worker.contract.webhook_events import from_status
from worker.engine.home_partition import home_partition
from worker.settings import Settings
from worker.webhooks.samples import TEST_ACCOUNT
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration

ENDPOINTS = "/v1/webhook-endpoints"
ASYNCAPI = Path(__file__).resolve().parents[3] / "schemas" / "asyncapi.json"
HOSTILE = b"<script>alert(1)</script>\xff\xfe\x00" + b"B" * 2000


@dataclass
class Seen:
    webhook_id: str
    raw: bytes
    verified: bool


@dataclass
class RawReceiver:
    """Keeps every request's raw body, verified with ``standardwebhooks``; answers
    ``status`` with ``body``."""

    secret: str = ""
    status: int = 204
    body: bytes = b""
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        hdrs = {k.lower(): v for k, v in request.headers.items()}
        verified = False
        with contextlib.suppress(Exception):
            Webhook(self.secret).verify(raw, hdrs)
            verified = True
        self.seen.append(Seen(hdrs["webhook-id"], raw, verified))
        return web.Response(status=self.status, body=self.body)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hooks"


@pytest.fixture
def hook_settings(api_settings: ApiSettings) -> Callable[..., Settings]:
    def factory(**overrides: object) -> Settings:
        settings = api_settings(
            **{
                "webhook_secrets_key": generate_key(),
                "webhook_allow_http": True,
                "webhook_allow_private_targets": True,
                **overrides,
            }
        )
        return settings.model_copy(
            update={"webhook_consumer_group": f"{settings.kafka_consumer_group}.webhooks"}
        )

    return factory


def data(resp: httpx.Response, status: int = 200) -> Any:
    assert resp.status_code == status, resp.text
    return resp.json()["data"]


async def create(http: httpx.AsyncClient, url: str, key: str | None = None) -> dict[str, Any]:
    resp = await http.post(ENDPOINTS, json={"url": url}, headers=headers(*([key] if key else [])))
    assert resp.status_code == 201, resp.text
    created: dict[str, Any] = resp.json()["data"]
    return created


async def delivery_when(
    http: httpx.AsyncClient, path: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """``GET path`` (one delivery) until ``done`` holds for it."""
    deadline = time.monotonic() + 30
    while True:
        resp = await http.get(path, headers=headers())
        if resp.status_code == 200 and done(resp.json()["data"]):
            found: dict[str, Any] = resp.json()["data"]
            return found
        assert resp.status_code in (200, 404, 429), resp.text
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: {resp.text}")
        await asyncio.sleep(0.1)


async def test_a_test_send_arrives_signed_shows_in_the_log_and_a_resend_repeats_it(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings()
    receiver = RawReceiver()
    async with (
        receiving(receiver),
        running_dispatcher(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        endpoint = await create(http, receiver.url)
        receiver.secret = endpoint["secret"]
        one = f"{ENDPOINTS}/{endpoint['id']}"
        queued = data(
            await http.post(
                f"{one}/test", json={"event_type": EVENT_STATUS_CHANGED}, headers=headers()
            ),
            202,
        )
        assert queued["kind"] == "test" and queued["account_id"] == TEST_ACCOUNT
        assert queued["delivery_id"].startswith(queued["webhook_id"] + ".ts_")
        await wait_until(lambda: len(receiver.seen) == 1, what="the test send")
        (first,) = receiver.seen
        assert first.verified and first.webhook_id == queued["webhook_id"]
        body = json.loads(first.raw)
        assert body["test"] is True and body["type"] == EVENT_STATUS_CHANGED
        # ``data`` is the published event: the real event model reads it back, and the
        # whole body, test marker included, is valid against the published schema
        AuthStatusChanged.model_validate(body["data"])
        published = json.loads(ASYNCAPI.read_text())
        jsonschema_rs.validate(
            {"$ref": "#/components/schemas/WebhookBody", "components": published["components"]},
            body,
        )

        path = f"{one}/deliveries/{queued['delivery_id']}"
        detail = await delivery_when(http, path, lambda d: d["status"] == "succeeded")
        assert detail["test"] is True and detail["body"] == first.raw.decode()
        (attempt,) = detail["attempts_detail"]
        assert attempt["status"] == 204 and attempt["error_kind"] is None
        assert isinstance(attempt["latency_ms"], int) and attempt["latency_ms"] >= 0
        listed = data(await http.get(f"{one}/deliveries", headers=headers()))
        assert [d["delivery_id"] for d in listed] == [queued["delivery_id"]]

        resent = data(await http.post(f"{path}/resend", headers=headers()), 202)
        assert resent["webhook_id"] == queued["webhook_id"] and resent["kind"] == "resend"
        await wait_until(lambda: len(receiver.seen) == 2, what="the resend")
        second = receiver.seen[1]
        assert second.verified
        assert (second.webhook_id, second.raw) == (first.webhook_id, first.raw)
        again = await delivery_when(
            http,
            f"{one}/deliveries/{resent['delivery_id']}",
            lambda d: d["status"] == "succeeded",
        )
        assert again["replay_id"].startswith("rs_") and again["test"] is False


async def test_a_resend_of_a_real_event_goes_behind_the_accounts_newer_events(
    hook_settings: Callable[..., Settings],
) -> None:
    """The resend is queued on the account's lane: it arrives after the account's events
    that were already queued, never ahead of them, and carries the original bytes."""
    settings = hook_settings(webhook_retry_schedule_s="0.3,0.3,0.3,0.3,0.3,0.3")
    receiver = RawReceiver()
    account = "acc_resend_order"
    async with (
        receiving(receiver),
        running_dispatcher(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        endpoint = await create(http, receiver.url)
        receiver.secret = endpoint["secret"]
        one = f"{ENDPOINTS}/{endpoint['id']}"
        events = [
            AuthStatusChanged(
                event_id=f"ev-order-{v}",
                account_id=account,
                workspace_id="ws_a",
                previous_status=None,
                status="authorized",
                auth_status="authorized",
                version=v,
                occurred_at=rfc3339(time.time()),
            )
            for v in (1, 2)
        ]
        await produce(
            settings,
            settings.topics.status,
            [(account.encode(), events[0].model_dump_json().encode())],
        )
        await wait_until(lambda: len(receiver.seen) == 1, what="the first event")
        original = receiver.seen[0]
        listed: list[dict[str, Any]] = []

        async def logged() -> bool:
            listed[:] = data(
                await http.get(f"{one}/deliveries?status=succeeded", headers=headers())
            )
            return any(d["event_id"] == "ev-order-1" for d in listed)

        deadline = time.monotonic() + 20
        while not await logged():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        wanted = next(d for d in listed if d["event_id"] == "ev-order-1")
        # The receiver now fails: event 2 waits for its retry at the head of the lane.
        receiver.status = 500
        await produce(
            settings,
            settings.topics.status,
            [(account.encode(), events[1].model_dump_json().encode())],
        )
        await wait_until(lambda: len(receiver.seen) == 2, what="event 2's first attempt")
        path = f"{one}/deliveries/{wanted['delivery_id']}/resend"
        data(await http.post(path, json={}, headers=headers()), 202)
        await asyncio.sleep(1.0)  # event 2 is retried meanwhile; the resend must wait
        assert all(s.webhook_id != original.webhook_id for s in receiver.seen[1:])
        receiver.status = 204
        await wait_until(
            lambda: any(s.webhook_id == original.webhook_id for s in receiver.seen[1:]),
            what="the resend",
        )
        order = [s.webhook_id for s in receiver.seen]
        two = from_status(events[1].model_dump_json().encode())
        resend_at = order.index(original.webhook_id, 1)
        ok_two = [
            i for i, s in enumerate(receiver.seen) if json.loads(s.raw) == json.loads(two.body)
        ]
        assert ok_two and max(ok_two) < resend_at  # event 2 (delivered) before the resend
        assert receiver.seen[resend_at].raw == original.raw and receiver.seen[resend_at].verified


async def test_a_failing_receivers_attempts_carry_status_latency_excerpt_and_error_kind(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings(webhook_retry_schedule_s="0.2,0.2")
    receiver = RawReceiver(status=500, body=HOSTILE)
    async with (
        receiving(receiver),
        running_dispatcher(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        failing = await create(http, receiver.url)
        receiver.secret = failing["secret"]
        gone = await create(http, closed_port_url())
        sent = {}
        for endpoint in (failing, gone):
            one = f"{ENDPOINTS}/{endpoint['id']}"
            sent[endpoint["id"]] = data(
                await http.post(f"{one}/test", json={"event_type": EVENT_ERROR}, headers=headers()),
                202,
            )
        one = f"{ENDPOINTS}/{failing['id']}"
        detail = await delivery_when(
            http,
            f"{one}/deliveries/{sent[failing['id']]['delivery_id']}",
            lambda d: d["status"] == "failed",
        )
        attempts = detail["attempts_detail"]
        assert len(attempts) == 3 == detail["attempts"]
        for attempt in attempts:
            assert attempt["status"] == 500 and attempt["error_kind"] is None
            assert isinstance(attempt["latency_ms"], int)
            text = attempt["response_excerpt"]
            assert text.startswith("<script>alert(1)</script>\\xff\\xfe\x00BBB")  # as text
            assert len(text) <= EXCERPT_CHARS and attempt["response_truncated"] is True
        assert [a["at"] for a in attempts] == sorted(a["at"] for a in attempts)
        failed = data(await http.get(f"{one}/deliveries?status=failed", headers=headers()))
        assert [d["delivery_id"] for d in failed] == [sent[failing["id"]]["delivery_id"]]
        assert data(await http.get(f"{one}/deliveries?status=succeeded", headers=headers())) == []

        other = f"{ENDPOINTS}/{gone['id']}"
        # (the endpoint gate backs an unreachable endpoint off: two attempts are enough)
        unreachable = await delivery_when(
            http,
            f"{other}/deliveries/{sent[gone['id']]['delivery_id']}",
            lambda d: len(d["attempts_detail"]) >= 2,
        )
        assert unreachable["status"] in ("failing", "failed")
        assert {a["error_kind"] for a in unreachable["attempts_detail"]} == {"connect"}
        assert {a["status"] for a in unreachable["attempts_detail"]} == {None}


def log_entry(endpoint_id: str, webhook_id: str, state: str, **fields: Any) -> DeliveryLogEntry:
    values: dict[str, Any] = {
        "webhook_id": webhook_id,
        "endpoint_id": endpoint_id,
        "workspace_id": "ws_a",
        "account_id": "acc_1",
        "event_type": EVENT_STATUS_CHANGED,
        "event_id": f"ev-{webhook_id}",
        "attempts": 1,
        "state": state,
        "updated_at": rfc3339(time.time()),
        "body": '{"type":"account.auth_status_changed"}',
        **fields,
    }
    return DeliveryLogEntry.model_validate(values)


async def log(settings: Settings, entries: list[DeliveryLogEntry], **kw: Any) -> None:
    await produce(
        settings,
        settings.topics.webhook_deliveries,
        [(e.endpoint_id.encode(), e.model_dump_json().encode()) for e in entries],
        **kw,
    )


async def test_the_cursor_pages_without_repeats_or_gaps_while_deliveries_arrive(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings()
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        ep = (await create(http, "https://hooks.example.com/in"))["id"]
        path = f"{ENDPOINTS}/{ep}/deliveries"
        await log(
            settings, [log_entry(ep, f"msg_{i:02d}", "pending", attempts=0) for i in range(30)]
        )
        first = await http.get(path, params={"limit": 7}, headers=headers())
        shown = [d["delivery_id"] for d in data(first)]
        cursor = first.json()["next_cursor"]
        arrived = 0
        while cursor is not None:
            # meanwhile: new deliveries, and new states of ones already shown and not yet
            await log(
                settings,
                [
                    log_entry(ep, f"msg_new_{arrived}", "pending", attempts=0),
                    log_entry(ep, "msg_29", "delivered"),
                    log_entry(ep, "msg_00", "delivered"),
                ],
            )
            arrived += 1
            resp = await http.get(path, params={"limit": 7, "cursor": cursor}, headers=headers())
            shown += [d["delivery_id"] for d in data(resp)]
            cursor = resp.json()["next_cursor"]
        assert shown == [f"msg_{i:02d}" for i in range(29, -1, -1)]  # no repeat, no gap
        fresh = data(await http.get(path, params={"limit": 100}, headers=headers()))
        assert [d["delivery_id"] for d in fresh][:arrived] == [
            f"msg_new_{i}" for i in range(arrived - 1, -1, -1)
        ]
        by_id = {d["delivery_id"]: d for d in fresh}
        assert by_id["msg_00"]["status"] == "succeeded" and by_id["msg_01"]["status"] == "pending"


async def test_hostile_inputs_answer_400_and_other_workspaces_ids_the_same_404(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings()
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        mine = (await create(http, "https://hooks.example.com/a"))["id"]
        theirs = (await create(http, "https://hooks.example.com/b", KEY_B))["id"]
        await log(
            settings,
            [
                log_entry(mine, "msg_mine", "failed"),
                log_entry(theirs, "msg_theirs", "failed", workspace_id="ws_b"),
            ],
        )
        path = f"{ENDPOINTS}/{mine}/deliveries"
        assert [d["delivery_id"] for d in data(await http.get(path, headers=headers()))] == [
            "msg_mine"
        ]
        bad_queries: list[dict[str, Any]] = [
            {"limit": 0},
            {"limit": 101},
            {"limit": 10**30},
            {"limit": "-1"},
            {"limit": "ten"},
            {"status": "delivered"},
            {"since": "yesterday"},
            {"until": "2026-13-01T00:00:00Z"},
            {"account_id": "../etc"},
            {"event_type": "x" * 129},
            {"cursor": "garbage!"},
            {"cursor": "c1." + "1." * 5000 + "1"},
            {"cursor": "c1.0.0.10.-5.0"},
        ]
        for query in bad_queries:
            assert_error(
                await http.get(path, params=query, headers=headers()), 400, "invalid_request", 10000
            )
        # a forged cursor of the right form reads no more than a page: an empty page here
        partition = home_partition(mine.encode(), settings.other_partitions)
        for forged in (
            Cursor(partition, 0, 10**17, (10**17, 0)),  # far past the end
            Cursor(partition + 1, 0, 1, (0, 0)),  # another partition
            Cursor(partition, 5, 0, (0, 0)),  # backwards
        ):
            started = time.monotonic()
            resp = await http.get(path, params={"cursor": forged.encode()}, headers=headers())
            assert resp.status_code == 200, resp.text
            assert resp.json()["data"] == [] and time.monotonic() - started < 3.0

        def same_404(resp: httpx.Response) -> str:
            body = assert_error(resp, 404, "not_found", 10001)
            return str(body["error"]["message"])

        # another workspace's endpoint answers as an unknown one, on every route
        for endpoint in (theirs, "ep_unknown"):
            one = f"{ENDPOINTS}/{endpoint}"
            answers = {
                same_404(await http.get(f"{one}/deliveries", headers=headers())),
                same_404(await http.get(f"{one}/deliveries/msg_theirs", headers=headers())),
                same_404(await http.post(f"{one}/deliveries/msg_theirs/resend", headers=headers())),
                same_404(
                    await http.post(
                        f"{one}/test", json={"event_type": EVENT_ERROR}, headers=headers()
                    )
                ),
            }
            assert len(answers) == 1
        # another workspace's delivery id under my endpoint answers as an unknown one
        one = f"{ENDPOINTS}/{mine}"
        messages = {
            same_404(await http.get(f"{one}/deliveries/{d}", headers=headers()))
            for d in ("msg_theirs", "msg_unknown")
        } | {
            same_404(await http.post(f"{one}/deliveries/{d}/resend", headers=headers()))
            for d in ("msg_theirs", "msg_unknown")
        }
        assert len(messages) == 1
        for bad_id in ("msg%20x", "a" * 200, "%2e%2e"):
            resp = await http.get(f"{one}/deliveries/{bad_id}", headers=headers())
            assert resp.status_code in (400, 404), resp.text
        bodies: list[Any] = [{"event_type": "account.deleted"}, {"event_type": 1}, {}, {"x": 1}, []]
        for body in bodies:
            assert_error(
                await http.post(f"{one}/test", json=body, headers=headers()),
                400,
                "invalid_request",
                10000,
            )
        assert_error(
            await http.post(f"{one}/test", content=b"x" * 200_000, headers=headers()),
            400,
            "invalid_request",
            10000,
        )


async def test_sends_are_bounded_per_workspace_and_the_other_workspace_still_sends(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings()
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        mine = (await create(http, "https://hooks.example.com/a"))["id"]
        theirs = (await create(http, "https://hooks.example.com/b", KEY_B))["id"]
        body = {"event_type": EVENT_STATUS_CHANGED}
        burst = SendBudget(settings.webhook_sends_per_minute).burst
        answers = [
            await http.post(f"{ENDPOINTS}/{mine}/test", json=body, headers=headers())
            for _ in range(burst + 1)
        ]
        assert [r.status_code for r in answers[:burst]] == [202] * burst
        refused = answers[-1]
        assert_error(refused, 429, "rate_limited", 90002)
        assert int(refused.headers["retry-after"]) >= 1
        other = await http.post(f"{ENDPOINTS}/{theirs}/test", json=body, headers=headers(KEY_B))
        assert other.status_code == 202, other.text


async def test_a_queued_send_is_in_the_log_when_it_is_answered(
    hook_settings: Callable[..., Settings],
) -> None:
    """Read-your-writes: the answered ``delivery_id`` reads at once (its pending entry is
    acknowledged before the answer), again and again, also as the log's newest record."""
    settings = hook_settings()
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        one = f"{ENDPOINTS}/{(await create(http, 'https://hooks.example.com/a'))['id']}"
        for _ in range(5):
            queued = data(
                await http.post(f"{one}/test", json={"event_type": EVENT_ERROR}, headers=headers()),
                202,
            )
            got = data(
                await http.get(f"{one}/deliveries/{queued['delivery_id']}", headers=headers())
            )
            assert got["status"] == "pending" and got["attempts_detail"] == []
            listed = data(await http.get(f"{one}/deliveries", headers=headers()))
            assert listed[0]["delivery_id"] == queued["delivery_id"]
            again = data(
                await http.post(f"{one}/deliveries/{got['delivery_id']}/resend", headers=headers()),
                202,
            )
            assert again["webhook_id"] == queued["webhook_id"]
