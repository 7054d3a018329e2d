"""Portal sessions over real HTTP against the real broker: minting, the scope a token is
confined to, expiry, key disabling, tampering, other workspaces and the page's headers
(docs/api.md, "The portal")."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from tests.api.support import KEY_A, KEY_B, KEY_DISABLED, headers, running_api
from tests.api.test_api_http import assert_error
from worker.api.keys import KeyEntry, hash_key
from worker.api.portal.page import CSP, PAGE_FILES
from worker.api.portal.tokens import MAX_TOKEN_CHARS, PORTAL_SCOPE, PortalTokens
from worker.settings import Settings
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration

SESSIONS = "/v1/portal-sessions"
ENDPOINTS = "/v1/webhook-endpoints"
URL = "https://hooks.example.com/in"
PORTAL_SECRET = "portal-secret-for-the-tests"


@pytest.fixture
def portal_settings(api_settings: Callable[..., Settings]) -> Callable[..., Settings]:
    def factory(**overrides: object) -> Settings:
        return api_settings(
            **{"webhook_secrets_key": generate_key(), "api_portal_secret": PORTAL_SECRET}
            | overrides
        )

    return factory


def entry(key_id: str, raw_key: str, workspace_id: str = "ws_a") -> KeyEntry:
    """A key as the test keys file holds it (no creation time)."""
    return KeyEntry(workspace_id, key_id, bytes.fromhex(hash_key(raw_key)))


KEY_ENTRY_A: Final = entry("key_a", KEY_A)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def session(
    http: httpx.AsyncClient, key: str = KEY_A, **body: Any
) -> tuple[str, dict[str, Any]]:
    resp = await http.post(SESSIONS, headers=headers(key), json=body or None)
    assert resp.status_code == 201, resp.text
    data = resp.json()["data"]
    assert set(data) == {"url", "session_id", "workspace_id", "expires_at"}
    page, _, fragment = data["url"].partition("#")
    assert page.endswith("/portal") and "token" not in page  # the token never reaches a log
    assert fragment.startswith("token=")
    return fragment.removeprefix("token="), data


async def test_a_session_reads_and_acts_on_its_own_workspace_only(
    portal_settings: Callable[..., Settings], capfd: pytest.CaptureFixture[str]
) -> None:
    async with (
        running_api(portal_settings()) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        mine = (await http.post(ENDPOINTS, json={"url": URL}, headers=headers())).json()["data"]
        theirs = (await http.post(ENDPOINTS, json={"url": URL}, headers=headers(KEY_B))).json()[
            "data"
        ]
        token, data = await session(http)
        assert data["workspace_id"] == "ws_a"
        auth = bearer(token)
        listed = (await http.get(ENDPOINTS, headers=auth)).json()["data"]
        assert [e["id"] for e in listed] == [mine["id"]]
        assert (await http.get(f"{ENDPOINTS}/{mine['id']}", headers=auth)).status_code == 200
        deliveries = await http.get(f"{ENDPOINTS}/{mine['id']}/deliveries", headers=auth)
        assert deliveries.status_code == 200, deliveries.text
        # In scope: deactivate, activate, rotate, on its own endpoint.
        for action, status in (("deactivate", "inactive"), ("activate", "active")):
            resp = await http.post(f"{ENDPOINTS}/{mine['id']}/{action}", headers=auth)
            assert resp.status_code == 200, resp.text
            assert resp.json()["data"]["status"] == status
        rotated = await http.post(f"{ENDPOINTS}/{mine['id']}/rotate-secret", headers=auth)
        assert rotated.status_code == 200 and rotated.json()["data"]["secret"].startswith("whsec_")
        # Another workspace's endpoint: exactly the 404 of an unknown one, on every route.
        for path in ("", "/deliveries"):
            other = await http.get(f"{ENDPOINTS}/{theirs['id']}{path}", headers=auth)
            unknown = await http.get(f"{ENDPOINTS}/ep_unknown{path}", headers=auth)
            assert_error(other, 404, "not_found", 10001)
            assert other.json()["error"] == unknown.json()["error"]
        for action in ("deactivate", "activate", "rotate-secret"):
            other = await http.post(f"{ENDPOINTS}/{theirs['id']}/{action}", headers=auth)
            assert_error(other, 404, "not_found", 10001)
        after = (await http.get(f"{ENDPOINTS}/{theirs['id']}", headers=headers(KEY_B))).json()
        assert after["data"]["status"] == "active"
    out = capfd.readouterr()
    assert token not in out.out + out.err
    assert token.split(".")[-1] not in out.out + out.err


async def test_routes_outside_the_scope_answer_403(
    portal_settings: Callable[..., Settings],
) -> None:
    async with (
        running_api(portal_settings()) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        mine = (await http.post(ENDPOINTS, json={"url": URL}, headers=headers())).json()["data"]
        token, _ = await session(http)
        auth = bearer(token)
        one = f"{ENDPOINTS}/{mine['id']}"
        outside = [
            ("POST", SESSIONS, {}),  # no session minting another
            ("POST", ENDPOINTS, {"url": URL}),
            ("PATCH", one, {"description": "x"}),
            ("DELETE", one, None),
            ("POST", f"{one}/expire-previous-secret", None),
            ("POST", f"{one}/replay", {"since": "2024-01-01T00:00:00Z"}),
            ("POST", "/v1/accounts/acc_1/auth/passkey-confirm", None),
            ("GET", "/v1/accounts/acc_1/auth", None),
        ]
        for method, path, body in outside:
            resp = await http.request(method, path, headers=auth, json=body)
            assert_error(resp, 403, "portal_scope_forbidden", 90021)
        # Nothing changed: the endpoint is there, unchanged.
        still = (await http.get(one, headers=headers())).json()["data"]
        assert still["description"] is None and still["status"] == "active"
        # The scope table names only webhook reads and the portal's actions.
        assert {m for m, _ in PORTAL_SCOPE} == {"GET", "POST"}
        assert all(
            p.startswith(("/v1/webhook-endpoints", "/v1/event-types")) for _, p in PORTAL_SCOPE
        )


async def test_expired_tampered_foreign_and_oversized_tokens_are_refused(
    portal_settings: Callable[..., Settings],
) -> None:
    past = PortalTokens(PORTAL_SECRET, clock=lambda: time.time() - 7200)
    expired = past.mint("ws_a", KEY_ENTRY_A, 3600).token
    other_secret = PortalTokens("another secret").mint("ws_a", KEY_ENTRY_A, 3600).token
    signer = PortalTokens(PORTAL_SECRET)
    # Well signed, but naming another workspace for ws_a's key: the key check refuses it.
    wrong_workspace = signer.mint("ws_b", KEY_ENTRY_A, 3600).token
    unknown_key = signer.mint("ws_a", entry("key_nobody", KEY_A), 3600).token
    disabled_key = signer.mint("ws_a", entry("key_off", KEY_DISABLED), 3600).token
    # The right key id, another key's hash (a key deleted and created again under its id).
    other_print = signer.mint("ws_a", entry("key_a", "pk_another"), 3600).token
    # Longer-lived than the service's sessions: a revocation could not cover it.
    too_long = signer.mint("ws_a", KEY_ENTRY_A, 7200).token
    good = signer.mint("ws_a", KEY_ENTRY_A, 3600).token
    prefix, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged_payload = (
        base64.urlsafe_b64encode(json.dumps(claims | {"w": "ws_b"}).encode()).rstrip(b"=").decode()
    )
    tampered = f"{prefix}.{forged_payload}.{signature}"
    refused = [
        expired,
        other_secret,
        wrong_workspace,
        unknown_key,
        disabled_key,
        other_print,
        too_long,
        tampered,
        good[:-2],
        "pts1.",
        "pts1..",
        "x" * (MAX_TOKEN_CHARS + 1),
        "pts1." + "A" * 5000 + "." + "B" * 43,
        "pts1.\u00e9\u00e9.\u00e9",
        KEY_A,  # an API key is no bearer token
    ]
    async with (
        running_api(portal_settings()) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        assert (await http.get(ENDPOINTS, headers=bearer(good))).status_code == 200
        for token in refused:
            raw = f"Bearer {token}".encode()
            resp = await http.get(ENDPOINTS, headers={b"authorization": raw})
            assert_error(resp, 401, "portal_session_invalid", 90020)
        # Other schemes and an empty bearer: no credential at all.
        for value in ("Basic dXNlcjpwYXNz", "Bearer", "Token abc", good):
            resp = await http.get(ENDPOINTS, headers={"Authorization": value})
            assert_error(resp, 401, "missing_api_key", 11000)


async def test_a_session_ends_when_its_key_is_disabled(
    portal_settings: Callable[..., Settings], keys_path: Path
) -> None:
    async with (
        running_api(portal_settings(api_keys_reload_s=0.05)) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        token, _ = await session(http)
        assert (await http.get(ENDPOINTS, headers=bearer(token))).status_code == 200
        entries = json.loads(keys_path.read_text())  # noqa: ASYNC240 - a small test file
        for entry in entries["keys"]:
            if entry["key_id"] == "key_a":
                entry["active"] = False
        tmp = keys_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries))
        tmp.replace(keys_path)
        await asyncio.sleep(0.1)
        assert_error(
            await http.get(ENDPOINTS, headers=bearer(token)), 401, "portal_session_invalid", 90020
        )
        # Deleted keys too: the key back, then gone from the file.
        entries["keys"] = [
            {"workspace_id": "ws_a", "key_id": "key_a2", "sha256": hash_key(KEY_A)},
        ]
        tmp.write_text(json.dumps(entries))
        tmp.replace(keys_path)
        await asyncio.sleep(0.1)
        assert_error(
            await http.get(ENDPOINTS, headers=bearer(token)), 401, "portal_session_invalid", 90020
        )
        token2, _ = await session(http)  # the same raw key, now key_a2: a new session works
        assert (await http.get(ENDPOINTS, headers=bearer(token2))).status_code == 200


async def test_session_length_and_body_checks(portal_settings: Callable[..., Settings]) -> None:
    async with (
        running_api(portal_settings(api_portal_session_ttl_s=600)) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        before = time.time()
        _, data = await session(http)
        expires = time.mktime(time.strptime(data["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
        expires -= time.timezone
        assert before + 590 <= expires <= time.time() + 600
        _, data = await session(http, ttl_s=120)
        expires = time.mktime(time.strptime(data["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
        assert expires - time.timezone <= time.time() + 121
        _, data = await session(http, ttl_s=86_400)  # capped at the setting
        expires = time.mktime(time.strptime(data["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
        assert expires - time.timezone <= time.time() + 601
        for body in (b"[]", b"{", b'{"ttl_s": 10}', b'{"ttl_s": "x"}', b'{"other": 1}'):
            resp = await http.post(SESSIONS, headers=headers(), content=body)
            assert_error(resp, 400, "invalid_request", 10000)
        assert_error(await http.post(SESSIONS), 401, "missing_api_key", 11000)
        assert_error(
            await http.post(SESSIONS, headers=headers("pk_nope")), 401, "invalid_api_key", 11001
        )


async def test_without_any_secret_the_route_answers_500(
    api_settings: Callable[..., Settings],
) -> None:
    async with (
        running_api(api_settings()) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        resp = await http.post(SESSIONS, headers=headers())
        assert_error(resp, 500, "create_portal_session_failed", 90022)
        token = PortalTokens("whatever").mint("ws_a", KEY_ENTRY_A, 600).token
        resp = await http.get(ENDPOINTS, headers=bearer(token))
        assert_error(resp, 401, "portal_session_invalid", 90020)


async def test_the_page_is_served_with_a_strict_policy(
    portal_settings: Callable[..., Settings],
) -> None:
    async with (
        running_api(portal_settings()) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        for path in PAGE_FILES:
            resp = await http.get(path)
            assert resp.status_code == 200, path
            assert resp.headers["content-security-policy"] == CSP
            assert resp.headers["x-content-type-options"] == "nosniff"
            assert resp.headers["referrer-policy"] == "no-referrer"
        assert "default-src 'self'" in CSP and "unsafe" not in CSP
        page = (await http.get("/portal")).text
        assert '<script src="/portal/portal.js"' in page and "<style" not in page
        assert " style=" not in page and "onclick" not in page
        script = (await http.get("/portal/portal.js")).text
        assert ".innerHTML" not in script and "insertAdjacentHTML" not in script
        assert "eval(" not in script and "document.write" not in script
        assert "http://" not in script.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in script + page
        # The page's future controls are feature-detected through OPTIONS: answered without
        # a key, 204 with Allow where a route exists.
        resp = await http.options(f"{ENDPOINTS}/x/rotate-secret")
        assert resp.status_code == 204 and "POST" in resp.headers["allow"]
