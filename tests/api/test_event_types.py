"""``GET /v1/event-types`` on a running front-end: the catalogue as published
(``schemas/event-types.json``), behind the key check and the workspace's request rate like
every route; ``HEAD`` and ``OPTIONS`` as the front door answers them."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_A, KEY_B, KEY_DISABLED, headers, running_api
from tests.webhooks import published_schemas
from worker.api.event_types import EVENT_TYPES_PATH
from worker.webhooks.event_types import EVENT_CATALOGUE
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration


async def test_the_catalogue_is_served_as_published_to_every_workspace(
    api_settings: ApiSettings,
) -> None:
    published = json.loads(published_schemas.PUBLISHED.read_text(encoding="utf-8"))
    settings = api_settings(webhook_secrets_key=generate_key())
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        for key in (KEY_A, KEY_B):
            resp = await http.get(EVENT_TYPES_PATH, headers=headers(key))
            assert resp.status_code == 200, resp.text
            body = resp.json()
            assert body["request_id"] == resp.headers["x-request-id"]
            assert body["data"] == published
        names = [t["name"] for t in body["data"]["event_types"]]
        assert names == [t.name for t in EVENT_CATALOGUE]
        assert set(body["data"]["envelope"]["headers"]) >= {
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
        }
        mine = await http.get(EVENT_TYPES_PATH, headers=headers(KEY_A, **{"X-Request-Id": "r-1"}))
        assert mine.json()["request_id"] == "r-1"
        head = await http.head(EVENT_TYPES_PATH, headers=headers())
        assert head.status_code == 200 and head.content == b""
        allow = await http.options(EVENT_TYPES_PATH)
        assert allow.status_code == 204 and allow.headers["allow"] == "GET, HEAD, OPTIONS"
        assert (await http.post(EVENT_TYPES_PATH, headers=headers())).status_code == 405


async def test_without_a_valid_key_nothing_is_listed(api_settings: ApiSettings) -> None:
    async with running_api(api_settings()) as api, httpx.AsyncClient(base_url=api.url) as http:
        for sent, code in (
            ({}, "missing_api_key"),
            (headers(KEY_DISABLED), "invalid_api_key"),
            (headers("pk_" + "x" * 4000), "invalid_api_key"),
        ):
            resp = await http.get(EVENT_TYPES_PATH, headers=sent)
            assert resp.status_code == 401
            assert resp.json()["error"]["code"] == code
            assert "data" not in resp.json()


async def test_reads_of_the_catalogue_spend_the_workspaces_rate(api_settings: ApiSettings) -> None:
    settings = api_settings(api_rate_limit_per_s=1.0, api_rate_limit_burst=3)
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        statuses = [
            (await http.get(EVENT_TYPES_PATH, headers=headers())).status_code for _ in range(6)
        ]
        assert statuses.count(200) <= 4 and 429 in statuses
        refused = await http.get(EVENT_TYPES_PATH, headers=headers())
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limited"
        assert int(refused.headers["retry-after"]) >= 1
        # Another workspace's rate is its own.
        assert (await http.get(EVENT_TYPES_PATH, headers=headers(KEY_B))).status_code == 200
