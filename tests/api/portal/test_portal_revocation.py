"""Portal sessions end with their key and can be revoked, on every replica; their URL never
comes from the request (docs/api.md, "The portal")."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.api.portal.test_portal_sessions import (
    ENDPOINTS,
    PORTAL_SECRET,
    SESSIONS,
    bearer,
    session,
)
from tests.api.support import KEY_A, KEY_B, headers, running_api
from tests.api.test_api_http import assert_error
from worker.api.keyfile import create_key, delete_key, set_active
from worker.api.keys import KeyStore, load_keys
from worker.api.portal.revocations import PortalRevocation, PortalRevocations
from worker.api.portal.tokens import PortalClaims
from worker.api.request_rate import RateLimited
from worker.settings import Settings
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration

RELOAD_S = 0.05


@pytest.fixture
def portal_settings(api_settings: Callable[..., Settings]) -> Callable[..., Settings]:
    def factory(**overrides: object) -> Settings:
        secrets = {"webhook_secrets_key": generate_key(), "api_portal_secret": PORTAL_SECRET}
        return api_settings(**secrets | overrides)

    return factory


async def _status(http: httpx.AsyncClient, token: str) -> int:
    return (await http.get(ENDPOINTS, headers=bearer(token))).status_code


async def _until_status(http: httpx.AsyncClient, key: str, status: int) -> None:
    """Until the front-end has reloaded the keys file so ``key`` answers ``status``."""
    for _ in range(200):
        if (await http.get(ENDPOINTS, headers=headers(key))).status_code == status:
            return
        await asyncio.sleep(RELOAD_S)
    raise AssertionError(f"the key never answered {status}")


async def test_a_link_dies_when_its_key_is_disabled_then_enabled_again(
    portal_settings: Callable[..., Settings], keys_path: Path
) -> None:
    async with (
        running_api(portal_settings(api_keys_reload_s=RELOAD_S)) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        token, _ = await session(http)
        assert await _status(http, token) == 200
        set_active(keys_path, "key_a", False)
        await _until_status(http, KEY_A, 401)
        set_active(keys_path, "key_a", True)
        await _until_status(http, KEY_A, 200)
        # The key works again; the link opened before the disable does not.
        assert_error(
            await http.get(ENDPOINTS, headers=bearer(token)), 401, "portal_session_invalid", 90020
        )
        fresh, _ = await session(http)
        assert await _status(http, fresh) == 200


async def test_a_link_dies_when_its_key_is_deleted_and_created_again_under_its_id(
    portal_settings: Callable[..., Settings], keys_path: Path
) -> None:
    async with (
        running_api(portal_settings(api_keys_reload_s=RELOAD_S)) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        token, _ = await session(http)
        assert await _status(http, token) == 200
        delete_key(keys_path, "key_a", force=True)
        _, new_key = create_key(keys_path, "ws_a", key_id="key_a")
        await _until_status(http, new_key, 200)
        assert_error(
            await http.get(ENDPOINTS, headers=bearer(token)), 401, "portal_session_invalid", 90020
        )
        fresh, _ = await session(http, key=new_key)
        assert await _status(http, fresh) == 200


async def test_a_revoked_session_is_refused_while_another_still_works(
    portal_settings: Callable[..., Settings],
) -> None:
    async with (
        running_api(portal_settings()) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        one, first = await session(http)
        two, _ = await session(http)
        resp = await http.delete(f"{SESSIONS}/{first['session_id']}", headers=headers())
        assert resp.status_code == 204 and resp.content == b""
        assert resp.headers["cache-control"] == "no-store"
        assert_error(
            await http.get(ENDPOINTS, headers=bearer(one)), 401, "portal_session_invalid", 90020
        )
        assert await _status(http, two) == 200
        # Revoking again is the same answer; a malformed id is a 400; a token cannot revoke.
        again = await http.delete(f"{SESSIONS}/{first['session_id']}", headers=headers())
        assert again.status_code == 204
        assert_error(
            await http.delete(f"{SESSIONS}/ps_nothex", headers=headers()),
            400,
            "invalid_request",
            10000,
        )
        assert_error(
            await http.delete(f"{SESSIONS}/{first['session_id']}", headers=bearer(two)),
            403,
            "portal_scope_forbidden",
            90021,
        )
        assert_error(
            await http.delete(SESSIONS, headers=bearer(two)), 403, "portal_scope_forbidden", 90021
        )
        assert await _status(http, two) == 200


async def test_revoking_every_session_of_a_workspace(
    portal_settings: Callable[..., Settings],
) -> None:
    async with (
        running_api(portal_settings()) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        one, _ = await session(http)
        two, _ = await session(http)
        theirs, _ = await session(http, key=KEY_B)
        resp = await http.delete(SESSIONS, headers=headers())
        assert resp.status_code == 204 and resp.headers["cache-control"] == "no-store"
        for token in (one, two):
            assert_error(
                await http.get(ENDPOINTS, headers=bearer(token)),
                401,
                "portal_session_invalid",
                90020,
            )
        assert await _status(http, theirs) == 200  # another workspace's sessions live on
        later, _ = await session(http)  # opened after the revocation: works
        assert await _status(http, later) == 200


async def test_another_workspace_cannot_revoke_yours(
    portal_settings: Callable[..., Settings],
) -> None:
    async with (
        running_api(portal_settings()) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        mine, data = await session(http)
        theirs = await http.delete(f"{SESSIONS}/{data['session_id']}", headers=headers(KEY_B))
        unknown = await http.delete(f"{SESSIONS}/ps_{'0' * 32}", headers=headers(KEY_B))
        # Another workspace's id answers exactly as an id that does not exist.
        assert theirs.status_code == unknown.status_code == 204
        assert theirs.content == unknown.content == b""
        varying = {"date": "", "x-request-id": ""}
        assert dict(theirs.headers) | varying == dict(unknown.headers) | varying
        assert await _status(http, mine) == 200


async def test_a_revocation_holds_on_every_replica(
    portal_settings: Callable[..., Settings],
) -> None:
    settings = portal_settings()
    async with contextlib.AsyncExitStack() as stack:
        apis = [await stack.enter_async_context(running_api(settings)) for _ in range(2)]
        one_http, other_http = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=str(api.base_url), timeout=10)
            )
            for api in apis
        ]
        one, data = await session(one_http)
        kept, _ = await session(one_http)
        everyone, _ = await session(one_http, key=KEY_B)
        assert await _status(other_http, one) == 200
        resp = await one_http.delete(f"{SESSIONS}/{data['session_id']}", headers=headers())
        assert resp.status_code == 204
        refused: list[int] = []
        for _ in range(200):  # the other replica reads the record within a fetch or two
            refused = [await _status(other_http, one)]
            if refused == [401]:
                break
            await asyncio.sleep(0.05)
        assert refused == [401]
        assert await _status(other_http, kept) == 200
        assert (await other_http.delete(SESSIONS, headers=headers(KEY_B))).status_code == 204
        for _ in range(200):
            if await _status(one_http, everyone) == 401:
                break
            await asyncio.sleep(0.05)
        assert await _status(one_http, everyone) == 401
        # A replica started after the revocations reads them before it accepts a session.
        late = await stack.enter_async_context(running_api(settings))
        late_http = await stack.enter_async_context(
            httpx.AsyncClient(base_url=str(late.base_url), timeout=10)
        )
        assert await _status(late_http, one) == 401
        assert await _status(late_http, everyone) == 401
        assert await _status(late_http, kept) == 200


async def test_the_url_never_comes_from_the_request_and_is_not_cached(
    portal_settings: Callable[..., Settings],
) -> None:
    hostile = {"Host": "attacker.example", "X-Forwarded-Host": "evil.example"}
    async with (
        running_api(portal_settings()) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        resp = await http.post(SESSIONS, headers=headers(**hostile))
        assert resp.status_code == 201, resp.text
        assert resp.headers["cache-control"] == "no-store"
        url = resp.json()["data"]["url"]
        assert url.startswith("/portal#token=")  # relative: no public base configured
        assert "attacker" not in url and "evil" not in url
    configured = portal_settings(api_public_base_url="https://api.example.com/")
    async with (
        running_api(configured) as api,
        httpx.AsyncClient(base_url=str(api.base_url), timeout=10) as http,
    ):
        resp = await http.post(SESSIONS, headers=headers(**hostile))
        assert resp.status_code == 201 and resp.headers["cache-control"] == "no-store"
        url = resp.json()["data"]["url"]
        assert url.startswith("https://api.example.com/portal#token=")
        assert "attacker" not in url and "evil" not in url


def test_keys_files_without_a_change_time_load_and_a_change_is_stamped(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    key_id, _ = create_key(path, "ws_a")
    document = json.loads(path.read_text())
    assert "changed_at" not in document["keys"][0]  # an old file's shape
    (loaded,) = load_keys(path)
    assert loaded.changed_at is None and loaded.created_at is not None
    set_active(path, key_id, False)
    set_active(path, key_id, True)
    (enabled,) = load_keys(path)
    assert enabled.changed_at is not None and enabled.changed_at >= loaded.created_at - 1
    assert KeyStore(load_keys(path)).entry_in_force(key_id, "ws_a") == enabled


@dataclass
class _Record:
    key: bytes | None
    value: bytes | None


def _claims(workspace_id: str, session_id: str, issued_at_ms: int) -> PortalClaims:
    return PortalClaims(workspace_id, "key_a", "p" * 16, session_id, issued_at_ms, 0)


def revoked_of(view: PortalRevocations, ids: list[str]) -> int:
    """How many of ``ws_a``'s ``ids`` a session issued after every cut-off is refused for."""
    return sum(view.revoked(_claims("ws_a", session_id, 2_000_000_000_000)) for session_id in ids)


async def test_what_is_kept_of_revocations_is_bounded() -> None:
    now = [1_000_000.0]
    view = PortalRevocations(
        None, ttl_s=600, clock=lambda: now[0], per_workspace=3, max_workspaces=2
    )
    ids = [f"ps_{i:032x}" for i in range(6)]
    for session_id in ids[:3]:
        await view.revoke_session("ws_a", session_id)
    await view.revoke_session("ws_a", ids[0])  # the same one again: no new entry
    with pytest.raises(RateLimited) as refused:
        await view.revoke_session("ws_a", ids[3])
    assert refused.value.http_status == 429 and 0 < refused.value.retry_after_s <= 603
    assert revoked_of(view, ids) == 3
    assert view.revoked(_claims("ws_a", ids[0], 0))
    assert not view.revoked(_claims("ws_a", ids[3], 0))
    assert not view.revoked(_claims("ws_b", ids[0], 0))  # another workspace's id
    # Records read past the view's bound become the workspace's cut-off: more revoked, not less.
    for session_id in ids[3:6]:
        record = PortalRevocation(
            workspace_id="ws_a", session_id=session_id, before_ms=999_000_000, until=now[0] + 600
        )
        view.take(_Record(record.record_key.encode(), record.model_dump_json().encode()))
    assert revoked_of(view, ids) == 6
    assert view.overflowed == 0
    extra = PortalRevocation(
        workspace_id="ws_a", session_id=f"ps_{9:032x}", before_ms=999_000_000, until=now[0] + 600
    )
    view.take(_Record(extra.record_key.encode(), extra.model_dump_json().encode()))
    assert view.overflowed == 1 and revoked_of(view, ids) == 6
    assert view.revoked(_claims("ws_a", f"ps_{8:032x}", 999_000_000))
    assert not view.revoked(_claims("ws_a", f"ps_{8:032x}", 999_000_001))
    # Cut-offs past max_workspaces: every session refused until they would have expired.
    await view.revoke_all("ws_b")
    await view.revoke_all("ws_c")
    assert view.revoked(_claims("ws_d", f"ps_{8:032x}", 2_000_000_000_000))
    # Past a session's life everything goes, and the keys to tombstone are named.
    now[0] += 700
    assert not view.revoked(_claims("ws_d", f"ps_{8:032x}", 2_000_000_000_000))
    gone = view.expired()
    assert len(view) == 0 and revoked_of(view, ids) == 0
    assert "ps_ws/ws_a" in gone and f"ps_s/ws_a/{ids[0]}" in gone and len(gone) == 8


async def test_a_full_table_is_paid_for_by_the_workspace_holding_most_not_the_revoker() -> None:
    """Single revocations full in all (one workspace revoked a pile of made-up session ids):
    the next workspace's revocation of one session revokes that one only, and the workspace
    holding most gets a cut-off instead, so none of what it revoked comes back (before: the
    next revoker's every session was cut off)."""
    now = [1_000_000.0]
    view = PortalRevocations(None, ttl_s=600, clock=lambda: now[0], per_workspace=10, max_tracked=4)
    hog = [f"ps_{i:032x}" for i in range(4)]
    for session_id in hog:
        await view.revoke_session("ws_hog", session_id)
    victim, other = f"ps_{100:032x}", f"ps_{101:032x}"
    now[0] += 1
    await view.revoke_session("ws_v", victim)
    assert view.revoked(_claims("ws_v", victim, 999_000_000))
    assert not view.revoked(_claims("ws_v", other, 999_000_000))
    assert all(view.revoked(_claims("ws_hog", s, 999_000_000)) for s in hog)
    assert view.overflowed == 1 and len(view) <= 4 + 1
