"""The webhook-endpoint management routes over real HTTP against the real broker: every route
of the table, workspace isolation, read-your-writes, validation, secret rotation, write
failures and replay (docs/api.md, "Webhook endpoints")."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import RequestTimedOutError

from tests.api.conftest import ApiSettings
from tests.api.support import (
    ALLOWED_ORIGIN,
    KEY_B,
    headers,
    produce,
    running_api,
    wait_until,
)
from tests.api.test_api_http import assert_error
from tests.webhooks.support import replay_scan
from worker.api.app import ApiRuntime
from worker.api.webhooks import creates
from worker.api.webhooks.replay import new_replay_id
from worker.api.webhooks.routes import WebhookClients
from worker.contract.delivery_log import DeliveryLogEntry, Replay, decode_replay
from worker.contract.messages import AuthError, AuthStatusChanged, ErrorBody, rfc3339
from worker.contract.webhook_endpoints import (
    EVENT_ERROR,
    EVENT_STATUS_CHANGED,
    EndpointRecord,
    Recovery,
)
from worker.documents.openapi.document import openapi_document
from worker.engine.home_partition import home_partition
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.tail import assign_all
from worker.settings import Settings
from worker.webhooks.endpoint_writes import EndpointStore
from worker.webhooks.replay_scan import ReplayProgress
from worker.webhooks.secrets_box import SecretsBox, generate_key

pytestmark = pytest.mark.integration

ENDPOINTS = "/v1/webhook-endpoints"
ONE = "/v1/webhook-endpoints/{}"
URL = "https://hooks.example.com/in?token=s3cr3t-token"
ENDPOINT_KEYS = {
    "id",
    "workspace_id",
    "url",
    "event_types",
    "description",
    "rate_limit",
    "status",
    "disabled_reason",
    "auto_recover",
    "recovery",
    "created_at",
    "updated_at",
}


@pytest.fixture
def hook_settings(api_settings: ApiSettings) -> Callable[..., Settings]:
    """``api_settings`` with a webhook secrets key."""

    def factory(**overrides: object) -> Settings:
        return api_settings(**{"webhook_secrets_key": generate_key(), **overrides})

    return factory


def hooks(api: ApiRuntime) -> WebhookClients:
    assert api.webhooks is not None
    return api.webhooks


async def replay_ended(
    api: ApiRuntime, endpoint_id: str, replay_id: str, workspace_id: str = "ws_a"
) -> ReplayProgress:
    """The replay's end as the replica's board reads it (what ``GET .../replays/{id}`` answers)."""
    board = hooks(api).replays.board
    await wait_until(
        lambda: (got := board.get(workspace_id, endpoint_id, replay_id)) is not None and got.ended,
        timeout=60,
        what=f"replay {replay_id} ended",
    )
    ended = board.get(workspace_id, endpoint_id, replay_id)
    assert ended is not None
    return ended


def ok(resp: httpx.Response, status: int = 200) -> Any:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"request_id", "data"}
    assert resp.headers["x-request-id"] == body["request_id"]
    return body["data"]


async def create(http: httpx.AsyncClient, key: str | None = None, **body: Any) -> dict[str, Any]:
    data = ok(
        await http.post(
            ENDPOINTS, json={"url": URL, **body}, headers=headers(*([key] if key else []))
        ),
        201,
    )
    assert isinstance(data, dict)
    return data


async def test_every_route_of_the_table(hook_settings: Callable[..., Settings]) -> None:
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        created = await create(http, event_types=[EVENT_ERROR], description="ops")
        assert set(created) == ENDPOINT_KEYS | {"secret"}
        assert created["secret"].startswith("whsec_")
        assert created["workspace_id"] == "ws_a"
        assert created["url"] == URL
        assert created["event_types"] == [EVENT_ERROR]
        assert created["status"] == "active"
        assert created["disabled_reason"] is None
        endpoint_id = created["id"]
        one = ONE.format(endpoint_id)

        # read-your-writes: the same replica answers at once, and never with a secret
        got = ok(await http.get(one, headers=headers()))
        assert got == {k: v for k, v in created.items() if k != "secret"}
        listed = ok(await http.get(ENDPOINTS, headers=headers()))
        assert listed == [got]

        patched = ok(
            await http.patch(
                one, json={"event_types": None, "description": None}, headers=headers()
            )
        )
        assert patched["event_types"] is None
        assert patched["description"] is None
        assert patched["url"] == URL
        assert "secret" not in patched
        assert ok(await http.get(one, headers=headers())) == patched

        inactive = ok(await http.post(f"{one}/deactivate", headers=headers()))
        assert inactive["status"] == "inactive"
        active = ok(await http.post(f"{one}/activate", json={}, headers=headers()))
        assert active["status"] == "active"

        rotated = ok(await http.post(f"{one}/rotate-secret", headers=headers()))
        assert rotated["secret"].startswith("whsec_")
        assert rotated["secret"] != created["secret"]
        assert "secret" not in ok(await http.get(one, headers=headers()))

        empty = await http.get(f"{one}/deliveries", headers=headers())
        assert empty.status_code == 200
        assert empty.json()["data"] == [] and empty.json()["next_cursor"] is None

        since = "2020-01-01T00:00:00Z"
        accepted = ok(
            await http.post(f"{one}/replay", json={"since": since}, headers=headers()), 202
        )
        assert accepted["endpoint_id"] == endpoint_id
        assert accepted["replay_id"].startswith("rp_")
        assert accepted["since"] == "2020-01-01T00:00:00.000000Z"

        deleted = await http.delete(one, headers=headers(**{"X-Request-Id": "del-1"}))
        assert deleted.status_code == 204
        assert deleted.content == b""
        assert deleted.headers["x-request-id"] == "del-1"
        assert_error(await http.get(one, headers=headers()), 404, "not_found", 10001)
        assert ok(await http.get(ENDPOINTS, headers=headers())) == []
        ended = await replay_ended(api, endpoint_id, accepted["replay_id"])
        assert ended.state == "done"


async def test_endpoints_survive_a_restart(hook_settings: Callable[..., Settings]) -> None:
    """The topic is the store: a new replica reads back what the first one wrote."""
    settings = hook_settings()
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        kept = await create(http, description="kept")
        gone = await create(http)
        await http.patch(ONE.format(kept["id"]), json={"description": "v2"}, headers=headers())
        assert (await http.delete(ONE.format(gone["id"]), headers=headers())).status_code == 204
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        listed = ok(await http.get(ENDPOINTS, headers=headers()))
        assert [(e["id"], e["description"]) for e in listed] == [(kept["id"], "v2")]


async def test_workspaces_never_see_each_other(hook_settings: Callable[..., Settings]) -> None:
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        mine = await create(http)
        one = ONE.format(mine["id"])
        b = headers(KEY_B)
        unknown = ONE.format("ep_" + uuid.uuid4().hex)
        attempts: list[tuple[str, str, dict[str, Any] | None]] = [
            ("GET", "", None),
            ("PATCH", "", {"description": "mine now"}),
            ("POST", "/deactivate", None),
            ("POST", "/activate", None),
            ("POST", "/rotate-secret", None),
            ("GET", "/deliveries", None),
            ("GET", "/deliveries/msg_1", None),
            ("POST", "/deliveries/msg_1/resend", None),
            ("POST", "/test", {"event_type": EVENT_ERROR}),
            ("POST", "/replay", {"since": "2020-01-01T00:00:00Z"}),
            ("DELETE", "", None),
        ]
        for method, suffix, body in attempts:
            theirs = await http.request(method, one + suffix, json=body, headers=b)
            missing = await http.request(method, unknown + suffix, json=body, headers=b)
            err = assert_error(theirs, 404, "not_found", 10001)["error"]
            assert err == assert_error(missing, 404, "not_found", 10001)["error"], method
        assert ok(await http.get(ENDPOINTS, headers=b)) == []
        still = ok(await http.get(one, headers=headers()))
        assert still == {k: v for k, v in mine.items() if k != "secret"}
        theirs_created = await create(http, KEY_B)
        assert theirs_created["workspace_id"] == "ws_b"
        assert [e["id"] for e in ok(await http.get(ENDPOINTS, headers=headers()))] == [mine["id"]]


async def test_validation_errors(hook_settings: Callable[..., Settings]) -> None:
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        endpoint = await create(http)
        one = ONE.format(endpoint["id"])

        def bad(resp: httpx.Response, *fragments: str) -> None:
            message = assert_error(resp, 400, "invalid_request", 10000)["error"]["message"]
            for fragment in fragments:
                assert fragment in message, message
            assert "s3cr3t" not in message  # never the URL: it may hold a token

        post = http.post
        bad(await post(ENDPOINTS, content=b"{nope", headers=headers()), "JSON")
        bad(await post(ENDPOINTS, content=b"", headers=headers()), "required")
        bad(await post(ENDPOINTS, json=[URL], headers=headers()), "JSON object")
        bad(await post(ENDPOINTS, json={"url": URL, "colour": "red"}, headers=headers()), "colour")
        bad(await post(ENDPOINTS, json={}, headers=headers()), "url")
        bad(
            await post(
                ENDPOINTS, json={"url": URL, "event_types": ["account.nope"]}, headers=headers()
            ),
            "event_types.0",
        )
        bad(await post(ENDPOINTS, json={"url": URL, "event_types": []}, headers=headers()))
        bad(await post(ENDPOINTS, json={"url": "/relative"}, headers=headers()), "url_")
        bad(
            await post(ENDPOINTS, json={"url": "http://hooks.example.com/"}, headers=headers()),
            "url_scheme_not_allowed",
        )
        for url, reason in (
            ("https://127.0.0.1/s3cr3t", "target_loopback"),
            ("https://localhost:8443/", "target_loopback"),
            ("https://10.1.2.3/", "target_private"),
            ("https://169.254.169.254/latest", "target_link_local"),
            ("https://[::1]/", "target_loopback"),
        ):
            bad(await post(ENDPOINTS, json={"url": url}, headers=headers()), reason)
        for limit in (0, -1, 10_001, 1.5, 10_001.0, "5", True):
            bad(
                await post(ENDPOINTS, json={"url": URL, "rate_limit": limit}, headers=headers()),
                "rate_limit",
            )
            bad(await http.patch(one, json={"rate_limit": limit}, headers=headers()), "rate_limit")
        bad(await http.patch(one, json={}, headers=headers()), "at least one")
        bad(await http.patch(one, json={"url": None}, headers=headers()), "url")
        bad(
            await http.patch(one, json={"url": "https://10.0.0.1/"}, headers=headers()),
            "target_private",
        )
        bad(await post(f"{one}/deactivate", content=b"[1]", headers=headers()))
        for since in ("yesterday", "2026-01-01", "1700000000", "2026-01-01T00:00:00", None):
            bad(await post(f"{one}/replay", json={"since": since}, headers=headers()), "since")
        bad(await post(f"{one}/replay", headers=headers()), "required")
        bad(await http.get(ONE.format("-bad"), headers=headers()), "endpoint_id")
        # nothing above changed the endpoint, and nothing else was created
        assert ok(await http.get(ENDPOINTS, headers=headers())) == [
            {k: v for k, v in endpoint.items() if k != "secret"}
        ]
        # the key is checked first
        assert_error(await post(ENDPOINTS, content=b"{nope"), 401, "missing_api_key", 11000)


async def test_an_endpoint_rate_limit_is_set_changed_and_lifted(
    hook_settings: Callable[..., Settings],
) -> None:
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        assert (await create(http))["rate_limit"] is None
        endpoint = await create(http, rate_limit=5)
        assert endpoint["rate_limit"] == 5
        one = ONE.format(endpoint["id"])
        changed = ok(await http.patch(one, json={"rate_limit": 50}, headers=headers()))
        assert changed["rate_limit"] == 50
        held = hooks(api).store.registry.get("ws_a", endpoint["id"])
        assert held is not None and held.rate_limit == 50, "the record the dispatcher reads"
        # JSON Schema's integer includes 7.0 (a fuzzer sends it): taken as 7
        integral = ok(await http.patch(one, json={"rate_limit": 7.0}, headers=headers()))
        assert integral["rate_limit"] == 7
        lifted = ok(await http.patch(one, json={"rate_limit": None}, headers=headers()))
        assert lifted["rate_limit"] is None


async def test_auto_recover_is_set_on_create_and_update_and_cleared_probing_on_activate(
    hook_settings: Callable[..., Settings],
) -> None:
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        assert (await create(http))["auto_recover"] is True  # on by default
        endpoint = await create(http, auto_recover=False)
        assert endpoint["auto_recover"] is False and endpoint["recovery"] is None
        one = ONE.format(endpoint["id"])
        for value in (None, 0, 1, "false", "yes"):  # a JSON boolean only, never coerced
            bad = await http.patch(one, json={"auto_recover": value}, headers=headers())
            assert bad.status_code == 400, (value, bad.text)
        created = await http.post(
            ENDPOINTS,
            json={"url": "https://hooks.example.com/in", "auto_recover": 0},
            headers=headers(),
        )
        assert created.status_code == 400, created.text
        changed = ok(await http.patch(one, json={"auto_recover": True}, headers=headers()))
        assert changed["auto_recover"] is True
        # disabled by a dispatcher, with its probing: shown, and gone once activated
        store = hooks(api).store
        held = store.registry.get("ws_a", endpoint["id"])
        assert held is not None and held.auto_recover is True
        due = Recovery(disabled_at=time.time(), interval_s=300.0, next_probe_at=time.time() + 300)
        await store.disable(held, "failing for 5 days", due)
        shown = ok(await http.get(one, headers=headers()))
        assert shown["status"] == "disabled"
        assert shown["recovery"]["next_probe_at"] == due.next_probe_at
        activated = ok(await http.post(f"{one}/activate", headers=headers()))
        assert activated["status"] == "active" and activated["recovery"] is None


async def test_the_url_form_the_document_states_is_enforced(
    hook_settings: Callable[..., Settings],
) -> None:
    """What the OpenAPI ``pattern`` refuses is refused even where the SSRF check would let it
    through (a trailing newline, an upper-case scheme, an IDN, a space, a trailing dot), with
    a reason that says so; a public IPv6 literal and a public IPv4 one are of the form."""
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        endpoint = await create(http)
        for url in (
            "https://hooks.example.com/in\n",
            "HTTPS://hooks.example.com/in",
            "https://bücher.example/in",
            "https://hooks.example.com/a b",
            "https://hooks.example.com./in",
        ):
            for resp in (
                await http.post(ENDPOINTS, json={"url": url}, headers=headers()),
                await http.patch(ONE.format(endpoint["id"]), json={"url": url}, headers=headers()),
            ):
                message = assert_error(resp, 400, "invalid_request", 10000)["error"]["message"]
                assert "url_form_not_allowed" in message, (url, message)
                assert "an absolute https URL in ASCII" in message
                assert "bücher" not in message and "hooks" not in message  # never the URL
        for url in ("https://[2606:4700::1111]/hook", "https://8.8.8.8:8443/hook?x=1#f"):
            assert (await create(http, url=url))["url"] == url
        assert len(ok(await http.get(ENDPOINTS, headers=headers()))) == 3


async def test_hostile_values_are_400_not_500(hook_settings: Callable[..., Settings]) -> None:
    """Values JSON can carry but a record cannot, or Python's datetime cannot: a lone
    surrogate escape in ``description`` (no UTF-8 record can hold it) is refused; a ``since``
    that RFC 3339 allows and datetime does not (year 0000, 0001-01-01 east of UTC, 9999-12-31
    west of it) means the earliest or latest instant. On main both answered 500."""
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        endpoint = await create(http)
        one = ONE.format(endpoint["id"])
        lone = b'{"url": "https://hooks.example.com/in", "description": "a\\ud800b"}'
        for resp in (
            await http.post(ENDPOINTS, content=lone, headers=headers()),
            await http.patch(one, content=b'{"description": "\\udfff"}', headers=headers()),
        ):
            message = assert_error(resp, 400, "invalid_request", 10000)["error"]["message"]
            assert "description" in message and "surrogate" in message
        # a surrogate pair is one character: fine
        pair = b'{"description": "\\ud83d\\ude00"}'
        assert ok(await http.patch(one, content=pair, headers=headers()))["description"] == "😀"
        for since, echoed in (
            ("0001-01-01T00:00:00+01:00", "0001-01-01T00:00:00.000000Z"),
            ("0000-02-29T12:00:00Z", "0001-01-01T00:00:00.000000Z"),
            ("9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59.999999Z"),
        ):
            resp = await http.post(f"{one}/replay", json={"since": since}, headers=headers())
            assert ok(resp, 202)["since"] == echoed, since
            # the replays end at once (nothing to scan that late, or little that early):
            # one workspace may hold only two in flight
            await wait_until(lambda: hooks(api).replays.active == 0, what="replay")


async def test_private_http_targets_when_the_policy_allows_them(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings(webhook_allow_http=True, webhook_allow_private_targets=True)
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        for url in ("http://127.0.0.1:9/hook", "http://localhost:8080/x", "https://10.0.0.7/"):
            assert (await create(http, url=url))["url"] == url
        # never-reachable addresses stay blocked whatever the policy
        resp = await http.post(ENDPOINTS, json={"url": "http://0.0.0.0/"}, headers=headers())
        assert (
            "target_unspecified"
            in assert_error(resp, 400, "invalid_request", 10000)["error"]["message"]
        )


async def test_rotation_keeps_the_old_secret_for_the_overlap(
    hook_settings: Callable[..., Settings],
) -> None:
    key = generate_key()
    overlap = 3600.0
    settings = hook_settings(webhook_secrets_key=key, webhook_secret_overlap_s=overlap)
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        created = await create(http)
        rotated = ok(
            await http.post(ONE.format(created["id"]) + "/rotate-secret", headers=headers())
        )
        store = hooks(api).store
        record = store.registry.get("ws_a", created["id"])
        assert record is not None
        assert store.signing_secrets(record) == [rotated["secret"], created["secret"]]
        # the same record, read by a store whose clock is past the overlap
        later = EndpointStore(
            producer=api.producer,
            topic=settings.topics.webhook_endpoints,
            registry=store.registry,
            cipher=SecretsBox(key),
            clock=lambda: time.time() + overlap + 1,
        )
        assert later.signing_secrets(record) == [rotated["secret"]]
        # rotating again inside the overlap: the new one and the previous one sign, the
        # first secret no longer (it is dropped from the record)
        again = ok(await http.post(ONE.format(created["id"]) + "/rotate-secret", headers=headers()))
        record = store.registry.get("ws_a", created["id"])
        assert record is not None
        assert store.signing_secrets(record) == [again["secret"], rotated["secret"]]
        assert len(record.secrets) == 2

    async with (
        running_api(hook_settings(webhook_secret_overlap_s=0)) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        created = await create(http)
        rotated = ok(
            await http.post(ONE.format(created["id"]) + "/rotate-secret", headers=headers())
        )
        record = hooks(api).store.registry.get("ws_a", created["id"])
        assert record is not None
        assert hooks(api).store.signing_secrets(record) == [rotated["secret"]]


async def test_a_write_not_acknowledged_in_time_answers_500(
    hook_settings: Callable[..., Settings],
) -> None:
    """A store timeout far below one broker round trip. The record may still reach the
    topic afterwards (the producer keeps it), but only pending, never an endpoint: the
    message says nothing was created."""
    settings = hook_settings(webhook_store_timeout_s=1e-6)
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        resp = await http.post(ENDPOINTS, json={"url": URL}, headers=headers())
        message = assert_error(resp, 500, "create_webhook_endpoint_failed", 40001)["error"][
            "message"
        ]
        assert message == creates.NOT_WRITTEN
        assert ok(await http.get(ENDPOINTS, headers=headers())) == []


async def test_writes_a_broken_producer_cannot_make_answer_500(
    hook_settings: Callable[..., Settings],
) -> None:
    """The front-end's own producer, closed under it: every write fails at once and nothing
    changes, on this replica or on the topic."""
    settings = hook_settings()
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        existing = await create(http)
        one = ONE.format(existing["id"])
        before = ok(await http.get(one, headers=headers()))
        await api.producer.stop()
        for method, path, body, code, numeric in (
            ("POST", ENDPOINTS, {"url": URL}, "create_webhook_endpoint_failed", 40001),
            ("PATCH", one, {"description": "x"}, "update_webhook_endpoint_failed", 40003),
            ("POST", f"{one}/deactivate", None, "deactivate_webhook_endpoint_failed", 40004),
            ("POST", f"{one}/rotate-secret", None, "update_webhook_endpoint_failed", 40003),
            ("DELETE", one, None, "delete_webhook_endpoint_failed", 40005),
        ):
            resp = await http.request(method, path, json=body, headers=headers())
            assert_error(resp, 500, code, numeric)
        assert ok(await http.get(one, headers=headers())) == before
        assert ok(await http.get(ENDPOINTS, headers=headers())) == [before]
        # activating an active endpoint writes nothing, so it still answers 200
        assert ok(await http.post(f"{one}/activate", headers=headers())) == before
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        assert ok(await http.get(ENDPOINTS, headers=headers())) == [before]


async def test_without_a_secrets_key_the_routes_answer_500(api_settings: ApiSettings) -> None:
    async with (
        running_api(api_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        one = ONE.format("ep_1")
        for method, path, code, numeric in (
            ("POST", ENDPOINTS, "create_webhook_endpoint_failed", 40001),
            ("GET", ENDPOINTS, "list_webhook_endpoints_failed", 40000),
            ("GET", one, "get_webhook_endpoint_failed", 40002),
            ("PATCH", one, "update_webhook_endpoint_failed", 40003),
            ("POST", f"{one}/deactivate", "deactivate_webhook_endpoint_failed", 40004),
            ("DELETE", one, "delete_webhook_endpoint_failed", 40005),
            ("POST", f"{one}/replay", "update_webhook_endpoint_failed", 40003),
        ):
            resp = await http.request(method, path, json={"url": URL}, headers=headers())
            message = assert_error(resp, 500, code, numeric)["error"]["message"]
            assert "not configured for webhooks" in message
        assert_error(await http.get(ENDPOINTS), 401, "missing_api_key", 11000)
        assert (await http.get(f"{api.metrics_url}/readyz")).json()["webhooks"] is None


def log_entry(
    endpoint_id: str, webhook_id: str, state: str, attempts: int, *, workspace_id: str = "ws_a"
) -> DeliveryLogEntry:
    return DeliveryLogEntry(
        webhook_id=webhook_id,
        endpoint_id=endpoint_id,
        workspace_id=workspace_id,
        account_id="acc_1",
        event_type=EVENT_STATUS_CHANGED,
        event_id=f"ev-{webhook_id}",
        version=attempts,
        attempts=attempts,
        state=state,
        last_status=500 if state != "delivered" else 204,
        last_error=None,
        next_attempt_at=rfc3339(time.time() + 60) if state == "pending" else None,
        updated_at=rfc3339(time.time()),
    )


def listed(resp: httpx.Response) -> list[dict[str, Any]]:
    """A page of the delivery log: its ``data``."""
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"request_id", "data", "next_cursor"}
    page: list[dict[str, Any]] = body["data"]
    return page


async def log(settings: Settings, entries: list[DeliveryLogEntry], **kw: Any) -> None:
    await produce(
        settings,
        settings.topics.webhook_deliveries,
        [(e.endpoint_id.encode(), e.model_dump_json().encode()) for e in entries],
        **kw,
    )


async def test_deliveries_come_from_the_delivery_log(
    hook_settings: Callable[..., Settings],
) -> None:
    """Read on demand: a delivery acknowledged on the log shows in the next answer, its
    latest entry only, newest (first logged) first; the front-end keeps no tail on it."""
    settings = hook_settings()
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        assert all(t.topic != settings.topics.webhook_deliveries for t in api.tails)
        endpoint = await create(http)
        path = ONE.format(endpoint["id"]) + "/deliveries"
        assert listed(await http.get(path, headers=headers())) == []
        entries = [
            log_entry(endpoint["id"], "msg_1", "pending", 1),
            log_entry(endpoint["id"], "msg_2", "failed", 8),
            log_entry(endpoint["id"], "msg_1", "delivered", 2),
            log_entry("ep_someone_else", "msg_9", "failed", 1),
        ]
        await log(settings, entries)
        data = listed(await http.get(path, headers=headers()))
        assert [(d["webhook_id"], d["status"], d["attempts"]) for d in data] == [
            ("msg_2", "failed", 8),
            ("msg_1", "succeeded", 2),
        ]
        data.reverse()
        assert data[0]["last_status"] == 204 and data[0]["replay_id"] is None
        assert data[1]["next_attempt_at"] is None
        assert_error(await http.get(path, headers=headers(KEY_B)), 404, "not_found", 10001)


async def test_deliveries_show_the_last_hundred_within_the_scan_window(
    hook_settings: Callable[..., Settings],
) -> None:
    """At most 100, the newest; and only what the last WEBHOOK_DELIVERIES_SCAN_RECORDS
    records of the endpoint's partition hold: older deliveries behind a busy partition are
    not shown (the trade-off in docs/architecture.md). An undecodable record is skipped."""
    settings = hook_settings(webhook_deliveries_scan_records=200)
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        endpoint = await create(http)
        ep = endpoint["id"]
        path = ONE.format(ep) + "/deliveries"
        partition = home_partition(ep.encode(), settings.other_partitions)
        await log(settings, [log_entry(ep, "msg_old", "failed", 1)])
        # 150 deliveries of the endpoint, one undecodable record among them
        await log(settings, [log_entry(ep, f"msg_{i:03d}", "delivered", 1) for i in range(150)])
        await produce(settings, settings.topics.webhook_deliveries, [(ep.encode(), b"{not json")])
        data = listed(await http.get(path, params={"limit": 100}, headers=headers()))
        assert [d["webhook_id"] for d in data] == [f"msg_{i:03d}" for i in range(149, 49, -1)]
        # Another endpoint's traffic in the same partition pushes msg_000.. out of the window.
        # (in batches of 10: the embedded broker's end estimate is its last batch's start)
        for batch in range(15):
            await log(
                settings,
                [
                    log_entry("ep_busy_neighbour", f"n_{batch}_{i}", "delivered", 1)
                    for i in range(10)
                ],
                partition=partition,
            )
        data = listed(await http.get(path, params={"limit": 100}, headers=headers()))
        shown = [d["webhook_id"] for d in data]
        assert shown == [f"msg_{i:03d}" for i in range(149, 149 - len(shown), -1)]
        assert 0 < len(shown) < 100  # fewer than it had: the window is 200 records
        assert "msg_old" not in shown


def status_event(
    account_id: str, workspace_id: str, occurred: datetime, *, version: int = 1
) -> AuthStatusChanged:
    return AuthStatusChanged(
        event_id=f"ev-{uuid.uuid4().hex}",
        account_id=account_id,
        workspace_id=workspace_id,
        previous_status="passkey_confirmation",
        status="authorized",
        auth_status="authorized",
        version=version,
        occurred_at=occurred.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    )


def error_event(account_id: str, workspace_id: str, occurred: datetime) -> AuthError:
    return AuthError(
        event_id=f"ev-{uuid.uuid4().hex}",
        account_id=account_id,
        workspace_id=workspace_id,
        command_id="c1",
        request_id="r1",
        http_status=502,
        error=ErrorBody(code="provider_unavailable", numeric_code=30002, message="down"),
        occurred_at=occurred.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    )


async def read_all(settings: Settings, topic: str) -> list[Any]:
    """Every record of ``topic`` up to its high-water marks."""
    consumer: AIOKafkaConsumer = build_consumer(settings.kafka_config(), fetch_max_wait_ms=50)
    await consumer.start()
    try:
        tps = await assign_all(consumer, topic)
        out: list[Any] = []
        deadline = time.monotonic() + 20
        pending = set(tps)
        while pending and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                out.extend(records)
            for tp in list(pending):
                high = consumer.highwater(tp)
                if (high is None and not batch) or (
                    high is not None and await consumer.position(tp) >= high
                ):
                    pending.discard(tp)
        return out
    finally:
        await consumer.stop()


async def test_replay_produces_the_endpoints_events_since(
    hook_settings: Callable[..., Settings],
) -> None:
    settings = hook_settings()
    now = datetime.now(UTC)
    since = now - timedelta(hours=1)
    old = now - timedelta(hours=2)
    status_new = [status_event(f"acc_{i}", "ws_a", now, version=i + 1) for i in range(4)]
    status_old = status_event("acc_0", "ws_a", old)
    status_other_ws = status_event("acc_b", "ws_b", now)
    error_new = error_event("acc_1", "ws_a", now)
    await produce(
        settings,
        settings.topics.status,
        [
            (e.account_id.encode(), e.model_dump_json().encode())
            for e in (*status_new, status_old, status_other_ws)
        ]
        + [(b"junk", b"not an event")],
    )
    await produce(
        settings,
        settings.topics.errors,
        [(error_new.account_id.encode(), error_new.model_dump_json().encode())],
    )
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        status_only = await create(http, event_types=[EVENT_STATUS_CHANGED])
        every_type = await create(http)
        replay_ids = {}
        for endpoint in (status_only, every_type):
            accepted = ok(
                await http.post(
                    ONE.format(endpoint["id"]) + "/replay",
                    json={"since": since.isoformat()},
                    headers=headers(),
                ),
                202,
            )
            replay_ids[endpoint["id"]] = accepted["replay_id"]
        ended = [await replay_ended(api, eid, rid) for eid, rid in replay_ids.items()]
        assert [(p.state, p.events_sent) for p in ended] == [("done", 4), ("done", 5)]

    sources = {
        "status": {
            msg.value: msg.partition for msg in await read_all(settings, settings.topics.status)
        },
        "errors": {
            msg.value: msg.partition for msg in await read_all(settings, settings.topics.errors)
        },
    }
    replays = await read_all(settings, settings.topics.webhook_replays)
    by_endpoint: dict[str, list[Replay]] = {}
    for msg in replays:
        replay = decode_replay(msg.value)
        by_endpoint.setdefault(replay.endpoint_id, []).append(replay)
        assert replay.replay_id == replay_ids[replay.endpoint_id]
        assert replay.workspace_id == "ws_a"
        # the event's own bytes, on the event's own partition, keyed by its account
        assert msg.partition == sources[replay.source][replay.event.encode()]
        event = (AuthStatusChanged if replay.source == "status" else AuthError).model_validate_json(
            replay.event
        )
        assert msg.key == event.account_id.encode()
    expected_status = {e.event_id for e in status_new}
    ids = {
        endpoint_id: {
            (
                r.source,
                (AuthStatusChanged if r.source == "status" else AuthError)
                .model_validate_json(r.event)
                .event_id,
            )
            for r in found
        }
        for endpoint_id, found in by_endpoint.items()
    }
    assert ids[status_only["id"]] == {("status", i) for i in expected_status}
    assert ids[every_type["id"]] == {("status", i) for i in expected_status} | {
        ("errors", error_new.event_id)
    }
    assert sum(len(v) for v in by_endpoint.values()) == 9


class _AcksLostOnce:
    """A started producer whose first ``lost`` acknowledgements fail with an outage error
    (the record never reached the broker), as during a broker blip."""

    def __init__(self, producer: Any, lost: int) -> None:
        self._producer = producer
        self.lost = lost

    async def send(self, topic: str, value: bytes | None, **kwargs: Any) -> asyncio.Future[Any]:
        if self.lost > 0:
            self.lost -= 1
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(RequestTimedOutError())
            return failed
        return cast("asyncio.Future[Any]", await self._producer.send(topic, value, **kwargs))


async def test_a_replay_sends_again_what_an_outage_failed(
    hook_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("worker.engine.broker_health.RESEND_BACKOFF_S", (0.01, 0.02))
    settings = hook_settings()
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    now = datetime.now(UTC)
    events = [status_event(f"acc_{i}", "ws_a", now, version=1) for i in range(3)]
    await produce(
        settings,
        settings.topics.status,
        [(e.account_id.encode(), e.model_dump_json().encode()) for e in events],
    )
    endpoint = EndpointRecord(
        id="we_replay",
        workspace_id="ws_a",
        url=URL,
        event_types=(EVENT_STATUS_CHANGED,),
        created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:00Z",
        revision=1,
    )
    real = build_producer(settings.kafka_config())
    await real.start()
    try:
        producer = _AcksLostOnce(real, lost=2)
        counts = [0, 0, 0]  # replayed, scanned, found
        scan = replay_scan(settings, producer)
        async with asyncio.timeout(60):
            assert await scan.run(new_replay_id(), endpoint, now - timedelta(hours=1), counts) == {}
    finally:
        await real.stop()
    assert counts[0] == 3
    assert producer.lost == 0
    replayed = [
        decode_replay(m.value) for m in await read_all(settings, settings.topics.webhook_replays)
    ]
    assert sorted(
        AuthStatusChanged.model_validate_json(r.event).event_id for r in replayed
    ) == sorted(e.event_id for e in events)


async def test_cors_preflight_allows_patch_and_delete(
    hook_settings: Callable[..., Settings],
) -> None:
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for method in ("PATCH", "DELETE", "POST", "GET"):
            resp = await http.options(
                ONE.format("ep_1"),
                headers={"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": method},
            )
            assert resp.status_code == 204, resp.text
            assert resp.headers["access-control-allow-methods"] == "GET, POST, PATCH, DELETE"
        resp = await http.options(
            ENDPOINTS, headers={"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "PUT"}
        )
        assert_error(resp, 403, "cors_forbidden", 11009)


async def test_readiness_covers_the_webhook_readers(hook_settings: Callable[..., Settings]) -> None:
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        ready = await http.get(f"{api.metrics_url}/readyz")  # the details: on the side door
        assert ready.status_code == 200
        assert ready.json() == {
            "ready": True,
            "replies": True,
            "webhooks": True,
            "kafka": True,
        }
        # replies, the replicas' presence and Idempotency-Keys, the endpoints registry
        assert len(api.tails) == 4
        await asyncio.sleep(0)


async def test_answers_that_carry_a_secret_are_never_stored(
    hook_settings: Callable[..., Settings],
) -> None:
    """The create's and the rotation's answers carry the signing secret in clear: each says
    ``Cache-Control: no-store``, as the document says; answers without one are unchanged."""
    async with (
        running_api(hook_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        created = await http.post(ENDPOINTS, json={"url": URL}, headers=headers())
        assert created.status_code == 201 and created.headers["cache-control"] == "no-store"
        endpoint_id = created.json()["data"]["id"]
        rotated = await http.post(ONE.format(endpoint_id) + "/rotate-secret", headers=headers())
        assert rotated.status_code == 200 and rotated.headers["cache-control"] == "no-store"
        read = await http.get(ONE.format(endpoint_id), headers=headers())
        assert read.status_code == 200 and "secret" not in read.json()["data"]
    document = openapi_document()
    rotate = "/v1/webhook-endpoints/{endpoint_id}/rotate-secret"
    for path, method in ((ENDPOINTS, "post"), (rotate, "post")):
        operation = document["paths"][path][method]
        ok_status = "201" if path == ENDPOINTS else "200"
        header = operation["responses"][ok_status]["headers"]["Cache-Control"]
        assert header["schema"]["const"] == "no-store"
