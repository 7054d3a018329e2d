"""An account's event history (issue 34, item 5) over real HTTP against the real broker: the
account's status and error events in order with their webhook's id, version and body, paged by
a cursor that new events extend; another workspace's account answered as an unknown one;
tampered, moved and foreign cursors refused; huge scans bounded (the window, the per-request
read, one read per workspace)."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_B, headers, produce, running_api, wait_until
from tests.api.test_api_http import assert_error
from tests.api.webhooks.test_routes import error_event, hooks, status_event
from worker.api.keys import KeyEntry, KeyStore, hash_key
from worker.api.portal.tokens import PortalTokens
from worker.api.webhooks.account_events import AccountEvents, Cursor, CursorCodec, CursorError
from worker.api.webhooks.quotas import Refused
from worker.contract.webhook_events import from_error, from_status
from worker.engine.kafka import build_consumer
from worker.runtime.admission import Admission, TimeCharge
from worker.settings import Settings
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration

EVENTS = "/v1/accounts/{}/events"


@pytest.fixture
def hook_settings(api_settings: ApiSettings) -> Callable[..., Settings]:
    def factory(**overrides: object) -> Settings:
        return api_settings(**{"webhook_secrets_key": generate_key(), **overrides})

    return factory


def page(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"request_id", "data", "next_cursor", "has_more"}
    return dict(body)


async def read_all(http: httpx.AsyncClient, account: str, **query: Any) -> tuple[list[Any], str]:
    """Every page from ``query``: the events and the last cursor."""
    got: list[Any] = []
    params = dict(query)
    for _ in range(200):
        body = page(await http.get(EVENTS.format(account), params=params, headers=headers()))
        got += body["data"]
        params = {
            "cursor": body["next_cursor"],
            **({"limit": query["limit"]} if "limit" in query else {}),
        }
        if not body["has_more"]:
            return got, body["next_cursor"]
    raise AssertionError("no end")


def records(events: list[Any]) -> list[tuple[bytes, bytes]]:
    return [(e.account_id.encode(), e.model_dump_json().encode()) for e in events]


async def test_the_accounts_events_in_order_with_their_webhook_ids_and_bodies(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings()
    now = datetime.now(UTC)
    account = f"acc_{uuid.uuid4().hex[:8]}"
    mine = [status_event(account, "ws_a", now, version=v) for v in (1, 2, 3)]
    error = error_event(account, "ws_a", now)
    later = status_event(account, "ws_a", now, version=4)
    noise = [status_event(f"acc_other_{i}", "ws_a", now) for i in range(20)]
    await produce(settings, settings.topics.status, records([mine[0], *noise[:10], mine[1]]))
    await produce(settings, settings.topics.errors, records([error]))
    await produce(settings, settings.topics.status, records([*noise[10:], mine[2]]))
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        got, cursor = await read_all(http, account, limit=2)
        expected = [
            from_status(mine[0].model_dump_json().encode()),
            from_status(mine[1].model_dump_json().encode()),
            from_error(error.model_dump_json().encode()),
            from_status(mine[2].model_dump_json().encode()),
        ]
        assert [e["event_id"] for e in got] == [e.event_id for e in expected]
        assert [e["version"] for e in got] == [1, 2, None, 3]
        assert [e["body"] for e in got] == [json.loads(e.body) for e in expected]
        assert [e["event_type"] for e in got] == [e.event_type for e in expected]
        assert {e["account_id"] for e in got} == {account}

        # the cursor of the last page: nothing new yet, then the new event, once
        assert (
            page(
                await http.get(EVENTS.format(account), params={"cursor": cursor}, headers=headers())
            )["data"]
            == []
        )
        await produce(settings, settings.topics.status, records([later]))
        newer = page(
            await http.get(EVENTS.format(account), params={"cursor": cursor}, headers=headers())
        )
        assert [e["event_id"] for e in newer["data"]] == [later.event_id]

        # from a since after the first events: only what occurred at or after it
        since = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
        resp = await http.get(EVENTS.format(account), params={"since": since}, headers=headers())
        assert_error(resp, 404, "not_found", 10001)


async def test_another_workspaces_account_answers_as_an_unknown_one(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings()
    now = datetime.now(UTC)
    account = f"acc_{uuid.uuid4().hex[:8]}"
    await produce(settings, settings.topics.status, records([status_event(account, "ws_a", now)]))
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        assert len(page(await http.get(EVENTS.format(account), headers=headers()))["data"]) == 1
        theirs = await http.get(EVENTS.format(account), headers=headers(KEY_B))
        unknown = await http.get(EVENTS.format("acc_nobody_at_all"), headers=headers(KEY_B))
        assert (
            assert_error(theirs, 404, "not_found", 10001)["error"]
            == assert_error(unknown, 404, "not_found", 10001)["error"]
        )
        # ws_a's cursor presented by ws_b: refused as any cursor not issued to the caller
        cursor = page(await http.get(EVENTS.format(account), headers=headers()))["next_cursor"]
        moved = await http.get(
            EVENTS.format(account), params={"cursor": cursor}, headers=headers(KEY_B)
        )
        assert_error(moved, 400, "invalid_request", 10000)
        # the key check and the rate limit come first: no key, no answer
        assert (await http.get(EVENTS.format(account))).status_code == 401


def tampered(cursor: str) -> list[str]:
    prefix, body, mac = cursor.split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["s"][1] = 0
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return [
        f"{prefix}.{forged}.{mac}",  # offsets changed, the old MAC
        f"{prefix}.{body}.{'A' * len(mac)}",  # another MAC
        f"{prefix}.{body}{mac}",  # no separator
        f"{body}.{mac}",  # no version prefix: the first form's shape
        "not a cursor",
        "%%%.%%%",
        "a" * 600,  # oversized
        f"{prefix}.{body}.{mac}.{mac}",
    ]


def test_a_cursor_is_never_a_portal_token_nor_a_portal_token_a_cursor() -> None:
    """Both are signed by one codec and may share a secret (the portal's falls back to
    ``WEBHOOK_SECRETS_KEY``); each kind signs under its own label, so neither verifies as the
    other, not even with its prefix changed to the other kind's."""
    secret = generate_key()
    cursors, portal = CursorCodec(secret.encode()), PortalTokens(secret)
    cursor = cursors.encode(Cursor("acc_1", "ws_a", (0, 5), (1, 7)))
    token = portal.mint("ws_a", KeyEntry("ws_a", "key_a", bytes.fromhex(hash_key("pk_a"))), 60)
    assert portal.verify(token.token) is not None
    for as_token in (cursor, "pts1." + cursor.split(".", 1)[1]):
        assert portal.verify(as_token) is None
    for as_cursor in (token.token, "evc2." + token.token.split(".", 1)[1]):
        with pytest.raises(CursorError):
            cursors.decode(as_cursor, account_id="acc_1", workspace_id="ws_a")


async def test_cursor_tampering_and_hostile_queries_are_refused(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings()
    account = f"acc_{uuid.uuid4().hex[:8]}"
    await produce(
        settings,
        settings.topics.status,
        records([status_event(account, "ws_a", datetime.now(UTC))]),
    )
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        cursor = page(await http.get(EVENTS.format(account), headers=headers()))["next_cursor"]
        path = EVENTS.format(account)
        for bad in tampered(cursor):
            resp = await http.get(path, params={"cursor": bad}, headers=headers())
            assert_error(resp, 400, "invalid_request", 10000)
        # another account of the same workspace cannot use it either
        other = await http.get(
            EVENTS.format("acc_someone_else"), params={"cursor": cursor}, headers=headers()
        )
        assert_error(other, 400, "invalid_request", 10000)
        old = (datetime.now(UTC) - timedelta(days=8)).isoformat()
        huge = await http.get(path, params={"since": old}, headers=headers())
        assert_error(huge, 400, "event_history_window_exceeded", 90010)
        for params in (
            {"limit": "0"},
            {"limit": "101"},
            {"limit": "1e9"},
            {"limit": "²"},
            {"limit": "-1"},
            {"since": "yesterday"},
            {"cursor": cursor, "since": "yesterday"},  # with a cursor, still its form
            {"unknown": "1"},
        ):
            resp = await http.get(path, params=params, headers=headers())
            assert_error(resp, 400, "invalid_request", 10000)
        repeated = await http.get(f"{path}?limit=1&limit=2", headers=headers())
        assert_error(repeated, 400, "invalid_request", 10000)
        bad_id = await http.get(EVENTS.format("-bad"), headers=headers())
        assert_error(bad_id, 400, "invalid_request", 10000)


async def test_a_huge_scan_is_read_a_bounded_slice_per_request(
    hook_settings: Callable[..., Settings],
) -> None:
    """2,000 other accounts' records on the account's home partition ahead of its one event:
    a request reads at most ``scan_records`` of them and hands back a cursor (``has_more``,
    no events yet), the next ones continue, and the event arrives; a second read of the same
    workspace while one runs is refused with 429."""
    settings = hook_settings(partitions=1)
    now = datetime.now(UTC)
    account = f"acc_{uuid.uuid4().hex[:8]}"
    noise = [status_event(f"acc_n{i}", "ws_a", now) for i in range(2000)]
    await produce(
        settings, settings.topics.status, records([*noise, status_event(account, "ws_a", now)])
    )
    reader = AccountEvents(
        lambda: build_consumer(settings.kafka_config(), fetch_max_wait_ms=50),
        topics=settings.topics,
        scan_records=500,
    )
    first = await reader.page("ws_a", account, cursor=None, since=None, limit=10)
    assert first.events == [] and first.has_more and reader.records_read <= 500
    pages, cursor = 1, first.cursor
    found: list[Any] = []
    while True:
        nxt = await reader.page("ws_a", account, cursor=cursor, since=None, limit=10)
        pages += 1
        found += nxt.events
        cursor = nxt.cursor
        if not nxt.has_more:
            break
    assert [f.event.account_id for f in found] == [account]
    assert pages == 5 and reader.records_read == 2001

    with reader.turn("ws_a"):
        with pytest.raises(Refused) as refused, reader.turn("ws_a"):
            pass
        assert refused.value.quota == "account_event_scans"
        assert refused.value.error.http_status == 429
        with reader.turn("ws_b"):  # another workspace is still served
            pass

    codec = CursorCodec(b"k" * 32)
    text = codec.encode(cursor)
    assert codec.decode(text, account_id=account, workspace_id="ws_a") == cursor
    for account_id, workspace_id in ((account, "ws_b"), ("acc_x", "ws_a")):
        with pytest.raises(CursorError):
            codec.decode(text, account_id=account_id, workspace_id=workspace_id)
    with pytest.raises(CursorError):
        CursorCodec(b"j" * 32).decode(text, account_id=account, workspace_id="ws_a")
    await asyncio.sleep(0)


# -- the reads' admission (issue "Tenant budgets", row 3) -----------------------------------

LOOPERS = ("ws_l1", "ws_l2", "ws_l3", "ws_l4")
FIFTH = "ws_fifth"


def five_workspaces() -> KeyStore:
    return KeyStore(
        [KeyEntry(w, f"key_{w}", bytes.fromhex(hash_key(f"pk_{w}"))) for w in (*LOOPERS, FIFTH)]
    )


async def test_workspaces_looping_on_reads_spend_their_own_time_and_a_fifth_is_served(
    hook_settings: Callable[..., Settings],
) -> None:
    """Four workspaces loop on reads, each holding one of the four read slots. Each spends its
    own read time (a small budget here, so the test does not wait): once it is in debt its
    reads are refused 429 with Retry-After and a message saying so, while a fifth workspace is
    served. On main the loopers held all four slots for as long as they looped: they were
    never refused, and a fifth got 429 whenever all four were reading."""
    settings = hook_settings(api_rate_limit_per_s=0)
    now = datetime.now(UTC)
    accounts = {w: f"acc_{w}_{uuid.uuid4().hex[:6]}" for w in (*LOOPERS, FIFTH)}
    await produce(
        settings,
        settings.topics.status,
        records([status_event(a, w, now) for w, a in accounts.items()]),
    )
    refused: dict[str, httpx.Response] = {}
    served = dict.fromkeys(LOOPERS, 0)
    stop = asyncio.Event()
    async with (
        running_api(settings, keys=five_workspaces()) as api,
        httpx.AsyncClient(base_url=api.url, timeout=30) as http,
    ):
        events = hooks(api).events
        assert events is not None
        # The same rule, with a budget of 0.3 slot-seconds and almost no refill.
        events.admission = Admission(
            events.admission.name,
            events.admission.share,
            time=TimeCharge(rate=0.01, burst_s=0.3),
        )

        async def loop(workspace: str) -> None:
            path = EVENTS.format(accounts[workspace])
            for _ in range(2000):  # bounded: stops long before
                if stop.is_set():
                    return
                resp = await http.get(path, headers=headers(f"pk_{workspace}"))
                if resp.status_code == 200:
                    served[workspace] += 1
                elif resp.status_code == 429:
                    refused.setdefault(workspace, resp)
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError(resp.text)

        loopers = [asyncio.create_task(loop(w)) for w in LOOPERS]
        try:
            await wait_until(lambda: set(refused) == set(LOOPERS), what="every looper in debt")
            answers = []
            for _ in range(20):  # while the loopers go on looping
                resp = await http.get(
                    EVENTS.format(accounts[FIFTH]), headers=headers(f"pk_{FIFTH}")
                )
                answers.append(resp.status_code)
                if resp.status_code == 200:
                    break
                await asyncio.sleep(0.1)
            assert answers[-1] == 200, answers
            assert not any(task.done() for task in loopers), "the loopers still loop"
        finally:
            stop.set()
            await asyncio.gather(*loopers)
    for workspace, resp in refused.items():
        body = assert_error(resp, 429, "rate_limited", 90002)
        assert "share of read time" in body["error"]["message"], body
        assert int(resp.headers["retry-after"]) >= 1
        assert served[workspace] >= 1
    assert events.admission.refused["time"] >= len(LOOPERS)


async def test_a_cursor_with_the_first_pages_since_continues_from_the_cursor(
    hook_settings: Callable[..., Settings],
) -> None:
    """The document allows ``cursor`` and ``since`` together: the cursor decides where the
    page starts, ``since`` (sent again as the first page's, or any other) is ignored but for
    its form, even once it is older than the window. On main: 400 for both."""
    settings = hook_settings()
    now = datetime.now(UTC)
    account = f"acc_{uuid.uuid4().hex[:8]}"
    events = [status_event(account, "ws_a", now, version=v) for v in (1, 2, 3)]
    await produce(settings, settings.topics.status, records(events))
    since = (now - timedelta(minutes=5)).isoformat()
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        path = EVENTS.format(account)
        first = page(await http.get(path, params={"since": since, "limit": 1}, headers=headers()))
        assert [e["version"] for e in first["data"]] == [1]
        cursor = first["next_cursor"]
        alone = page(await http.get(path, params={"cursor": cursor}, headers=headers()))
        for other in (since, (now + timedelta(days=1)).isoformat(), "2000-01-01T00:00:00Z"):
            both = page(
                await http.get(path, params={"cursor": cursor, "since": other}, headers=headers())
            )
            assert [e["event_id"] for e in both["data"]] == [e["event_id"] for e in alone["data"]]
        assert [e["version"] for e in alone["data"]] == [2, 3]
