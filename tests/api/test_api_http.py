"""The front-end over real HTTP (uvicorn on a loopback port) against the real broker.

The worker is replaced by a tiny responder here, so every status of the seed's §4/§5 can be
scripted; tests/api/test_api_e2e.py runs the same routes through the real worker.
"""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.api.conftest import ApiSettings
from tests.api.support import (
    ALLOWED_ORIGIN,
    KEY_A,
    KEY_B,
    KEY_DISABLED,
    headers,
    ok_answer,
    put_state,
    responder,
    running_api,
    running_worker,
    state_record,
)
from worker.api.app import ACCOUNT_ID_RULE
from worker.api.routes import ACCOUNT_AUTH
from worker.contract.catalogue import ServiceError
from worker.contract.messages import PasskeyConfirm

pytestmark = pytest.mark.integration

CONFIRM = "/v1/accounts/{}/auth/passkey-confirm"
AUTH = "/v1/accounts/{}/auth"
GENERATED_RID = re.compile(r"^req_[0-9a-f]{32}$")


def assert_error(resp: httpx.Response, status: int, code: str, numeric: int) -> dict[str, Any]:
    """The seed's failure envelope, exactly, with the header equal to the body's id."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"request_id", "error"}
    assert set(body["error"]) == {"code", "numeric_code", "message"}
    assert body["error"]["code"] == code
    assert body["error"]["numeric_code"] == numeric
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    assert resp.headers["x-request-id"] == body["request_id"]
    return dict(body)


async def test_missing_and_invalid_api_key_401(api_settings: ApiSettings) -> None:
    settings = api_settings()
    await put_state(settings, state_record("acc_1"))
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        for method, path in (("GET", AUTH), ("POST", CONFIRM)):
            url = path.format("acc_1")
            assert_error(await http.request(method, url), 401, "missing_api_key", 11000)
            assert_error(
                await http.request(method, url, headers={"X-Api-Key": ""}),
                401,
                "missing_api_key",
                11000,
            )
            for bad in ("nope", KEY_A + "x", KEY_DISABLED, "x" * 2000):
                assert_error(
                    await http.request(method, url, headers=headers(bad)),
                    401,
                    "invalid_api_key",
                    11001,
                )


@pytest.mark.parametrize(
    "account_id",
    ["-starts-with-dash", "a" * 129, "has space", "caf%C3%A9", "semi;colon", "_x", "a%0A"],
)
async def test_malformed_account_id_400(api_settings: ApiSettings, account_id: str) -> None:
    async with (
        running_api(api_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for method, path in (("GET", AUTH), ("POST", CONFIRM)):
            resp = await http.request(method, path.format(account_id), headers=headers())
            body = assert_error(resp, 400, "invalid_request", 10000)
            assert ACCOUNT_ID_RULE in body["error"]["message"]


async def test_order_of_checks_route_then_key_then_account_id(
    api_settings: ApiSettings,
) -> None:
    async with (
        running_api(api_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        # route first: an unknown route is 404 even without a key
        assert_error(await http.get("/v1/accounts/-x/nothing"), 404, "not_found", 10001)
        # then the key: a malformed id without a key is 401
        assert_error(await http.get(AUTH.format("-x")), 401, "missing_api_key", 11000)
        assert_error(
            await http.post(CONFIRM.format("-x"), headers=headers("bad"), content=b"[[["),
            401,
            "invalid_api_key",
            11001,
        )
        # then the account id, before the body
        assert_error(
            await http.post(CONFIRM.format("-x"), headers=headers(), content=b"[[["),
            400,
            "invalid_request",
            10000,
        )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/v1/accounts"),
        ("GET", "/v2/accounts/acc_1/auth"),
        ("GET", "/v1/accounts/acc_1/auth/"),  # no slash redirects: the route does not exist
        ("TRACE", "/v1/accounts/acc_1/auth/"),
        ("OPTIONS", "/v1/nothing"),
        ("POST", "/v1/accounts/a%2Fb/auth/passkey-confirm"),
        ("POST", "/metrics"),
        ("GET", "/metrics"),  # on the side door
        ("GET", "/docs"),
    ],
)
async def test_unknown_route_404(api_settings: ApiSettings, method: str, path: str) -> None:
    async with (
        running_api(api_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        resp = await http.request(method, path, headers=headers())
        body = assert_error(resp, 404, "not_found", 10001)
        assert body["error"]["message"] == ServiceError.of("not_found").message
        assert "allow" not in resp.headers


ALLOW = {
    CONFIRM.format("acc_1"): "POST, OPTIONS",
    AUTH.format("acc_1"): "GET, HEAD, OPTIONS",
    "/v1/webhook-endpoints": "GET, HEAD, POST, OPTIONS",
    "/v1/webhook-endpoints/ep_1": "GET, HEAD, PATCH, DELETE, OPTIONS",
    "/v1/webhook-endpoints/ep_1/replay": "POST, OPTIONS",
    "/v1/webhook-endpoints/ep_1/deliveries": "GET, HEAD, OPTIONS",
    "/v1/webhook-endpoints/ep_1/deliveries/msg_1": "GET, HEAD, OPTIONS",
    "/v1/webhook-endpoints/ep_1/deliveries/msg_1/resend": "POST, OPTIONS",
    "/v1/webhook-endpoints/ep_1/test": "POST, OPTIONS",
    "/healthz": "GET, HEAD, OPTIONS",
    "/readyz": "GET, HEAD, OPTIONS",
    "/openapi.json": "GET, HEAD, OPTIONS",
}


async def test_a_method_the_route_does_not_take_is_405_with_allow(
    api_settings: ApiSettings,
) -> None:
    """RFC 9110: 405 with ``Allow`` on a path that exists, in the error envelope (the service
    extension ``method_not_allowed``), before the key is looked at and whatever the id; a
    fuzzer's TRACE and a typo's PUT alike. Counted under the route's template."""
    registry = CollectorRegistry()
    async with (
        running_api(api_settings(), registry=registry) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for path, allow in ALLOW.items():
            taken = set(allow.split(", "))
            for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "TRACE", "QUERY"):
                if method in taken:
                    continue
                for key in (headers(), headers("bad"), {}):
                    resp = await http.request(method, path, headers=key)
                    assert resp.headers["allow"] == allow, (method, path)
                    if method == "HEAD":  # no body, the rest as for any method
                        assert (resp.status_code, resp.content) == (405, b""), path
                        continue
                    body = assert_error(resp, 405, "method_not_allowed", 90003)
                    assert body["error"]["message"] == (
                        f"The route does not take {method}; it takes {allow}."
                    )
        # the id is not looked at: a malformed one is still the route's
        resp = await http.put(AUTH.format("-bad id-"), headers=headers())
        assert_error(resp, 405, "method_not_allowed", 90003)
        assert resp.headers["allow"] == "GET, HEAD, OPTIONS"
    trace = registry.get_sample_value(
        "passkey_api_requests_total", {"route": ACCOUNT_AUTH, "method": "other", "status": "405"}
    )
    assert trace is not None and trace >= 3  # TRACE and QUERY: a bounded label


async def test_head_answers_like_get_without_a_body(api_settings: ApiSettings) -> None:
    """HEAD wherever GET is: the same status and headers, no body (RFC 9110), the API key
    checked the same way."""
    settings = api_settings()
    async with (
        responder(settings),  # a worker without accounts: every query answers 404
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for path, key, status in (
            ("/healthz", {}, 200),
            ("/openapi.json", {}, 200),
            (AUTH.format("acc_nobody"), headers(), 404),
            (AUTH.format("acc_nobody"), {}, 401),
            (AUTH.format("-bad"), headers(), 400),
            ("/v1/webhook-endpoints", headers(), 500),  # not configured here: its 500
        ):
            got = await http.get(path, headers=key)
            head = await http.head(path, headers=key)
            assert (head.status_code, got.status_code) == (status, status), path
            assert head.content == b""
            assert head.headers["content-type"] == got.headers["content-type"]
            assert head.headers["content-length"] == got.headers["content-length"]
            assert GENERATED_RID.match(head.headers["x-request-id"])


async def test_options_without_preflight_headers_answers_allow(api_settings: ApiSettings) -> None:
    """A plain OPTIONS (no ``Origin`` or no ``Access-Control-Request-Method``) asks what the
    route takes: 204 with ``Allow`` and no CORS grant, on every known path, without a key.
    A preflight to a path that is not an API route gets the same: nothing for browsers."""
    async with (
        running_api(api_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for path, allow in ALLOW.items():
            for extra in (
                {},
                {"Origin": "https://evil.example"},
                {"Access-Control-Request-Method": "POST"},
            ):
                resp = await http.options(path, headers=extra)
                assert resp.status_code == 204, (path, extra, resp.text)
                assert resp.content == b""
                assert resp.headers["allow"] == allow
                assert "access-control-allow-origin" not in resp.headers
                assert "access-control-allow-methods" not in resp.headers
                assert GENERATED_RID.match(resp.headers["x-request-id"])
        for path in ("/healthz", "/openapi.json"):
            resp = await http.options(
                path, headers={"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "GET"}
            )
            assert resp.status_code == 204
            assert resp.headers["allow"] == ALLOW[path]
            assert "access-control-allow-origin" not in resp.headers


@pytest.mark.parametrize(
    "content",
    [
        b"[1]",
        b"not json",
        b"null",
        b'"text"',
        b"42",
        b"\xff\xfe\x00",
        b"{" * 5000,
        b"{}" * 40000,
        b" ",  # whitespace alone is not JSON, and not "no body" either
        b"  \n",
        b"\x0b",  # a fuzzer's: bytes.strip() took it for whitespace
    ],
)
async def test_undecodable_or_non_object_body_400(
    api_settings: ApiSettings, content: bytes
) -> None:
    settings = api_settings()
    async with (
        responder(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        resp = await http.post(
            CONFIRM.format("acc_1"),
            headers=headers(**{"Content-Type": "application/json"}),
            content=content,
        )
        assert_error(resp, 400, "invalid_request", 10000)
        assert worker.commands == []  # nothing was sent


@pytest.mark.parametrize("content", [b"", b"{}", b' {"ignored": [1, 2]}\n'])
async def test_no_body_or_any_object_is_accepted(api_settings: ApiSettings, content: bytes) -> None:
    settings = api_settings()
    async with (
        responder(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        resp = await http.post(CONFIRM.format("acc_1"), headers=headers(), content=content)
        assert resp.status_code == 200, resp.text


async def test_confirm_produces_the_command_and_returns_the_reply_unchanged(
    api_settings: ApiSettings,
) -> None:
    """Each scripted reply (200, 400, 404, 409, 500, 501, 502) comes back as produced."""
    scripted: dict[str, tuple[int, dict[str, Any]]] = {}

    def answer(cmd: PasskeyConfirm) -> tuple[int, dict[str, Any]]:
        if cmd.account_id == "acc_ok":
            return ok_answer(cmd)
        status, error = scripted[cmd.account_id]
        return status, {"request_id": cmd.request_id, "error": error}

    rows = {
        "acc_invalid": ServiceError.of("provider_invalid_request"),
        "acc_gone": ServiceError.of("not_found"),
        "acc_done": ServiceError.of("account_already_authorized"),
        "acc_early": ServiceError.of("provider_not_ready"),
        "acc_fault": ServiceError.of("run_auth_action_failed"),
        "acc_unsupported": ServiceError.of("unsupported_by_provider"),
        "acc_down": ServiceError.of("provider_unavailable"),
        "acc_broken": ServiceError.of("provider_unavailable").refine(30010),
    }
    for account, err in rows.items():
        scripted[account] = (err.http_status, err.body())
    settings = api_settings()
    async with (
        responder(settings, answer) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        before = time.time()
        resp = await http.post(
            CONFIRM.format("acc_ok"),
            headers=headers(**{"X-Request-Id": "caller-req-1"}),
            json={"workspace_id": "ws_b"},  # ignored: the workspace comes from the key only
        )
        assert resp.status_code == 200
        assert resp.json() == {
            "request_id": "caller-req-1",
            "data": {
                "account_id": "acc_ok",
                "status": "passkey_confirmation_sent",
                "auth_status": "passkey_confirmation_sent",
            },
        }
        assert resp.headers["x-request-id"] == "caller-req-1"
        (cmd,) = worker.commands
        assert worker.keys == [b"acc_ok"]
        assert cmd.workspace_id == "ws_a"
        assert cmd.request_id == "caller-req-1"
        assert cmd.account_id == "acc_ok"
        assert before - 1 <= cmd.issued_at.timestamp() <= time.time() + 1
        assert cmd.deadline == cmd.issued_at + timedelta(seconds=settings.api_reply_timeout_s)

        for account, err in rows.items():
            resp = await http.post(CONFIRM.format(account), headers=headers())
            body = assert_error(resp, err.http_status, err.code, err.numeric_code)
            assert body["error"] == err.body()
        command_ids = [c.command_id for c in worker.commands]
        assert len(set(command_ids)) == len(command_ids) == 1 + len(rows)
        assert api.replies.pending == 0


async def test_no_reply_in_time_is_500_with_check_state_hint(api_settings: ApiSettings) -> None:
    """No worker on the commands topic and a 1 s reply timeout."""
    settings = api_settings(api_reply_timeout_s=1.0)
    async with (
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        started = time.monotonic()
        resp = await http.post(CONFIRM.format("acc_1"), headers=headers())
        elapsed = time.monotonic() - started
        body = assert_error(resp, 500, "run_auth_action_failed", 20010)
        assert "GET /v1/accounts/acc_1/auth" in body["error"]["message"]
        assert 0.9 <= elapsed < 3.0
        assert api.replies.pending == 0
        assert api.registry.get_sample_value("passkey_api_reply_timeouts_total") == 1.0
        assert api.registry.get_sample_value("passkey_api_pending_replies") == 0.0


async def test_get_auth_is_answered_by_the_owner_of_the_account(
    api_settings: ApiSettings,
) -> None:
    """GET is a query to the worker that holds the account: the body is the contract's, the
    last record wins, and unknown, deregistered and another workspace's accounts answer the
    same 404."""
    settings = api_settings()
    await put_state(
        settings,
        state_record("acc_mine"),
        state_record("acc_theirs", workspace_id="ws_b"),
        state_record("acc_gone", deregistered=False),
        state_record("acc_gone", version=2, deregistered=True),
        state_record("acc_moved", status="passkey_confirmation"),
        state_record("acc_moved", status="authorized", version=2),
    )
    async with (
        running_worker(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        resp = await http.get(AUTH.format("acc_mine"), headers=headers())
        assert resp.status_code == 200
        rid = resp.headers["x-request-id"]
        assert GENERATED_RID.match(rid)
        assert resp.json() == {
            "request_id": rid,
            "data": {
                "account_id": "acc_mine",
                "status": "passkey_confirmation",
                "auth_status": "passkey_confirmation",
                "version": 1,
            },
        }
        moved = await http.get(AUTH.format("acc_moved"), headers=headers())
        assert moved.json()["data"]["status"] == "authorized"  # the last record wins

        # unknown, deregistered and another workspace's accounts look the same
        bodies = []
        for account, key in (
            ("acc_unknown", KEY_A),
            ("acc_gone", KEY_A),
            ("acc_theirs", KEY_A),
            ("acc_mine", KEY_B),
        ):
            body = assert_error(
                await http.get(AUTH.format(account), headers=headers(key)), 404, "not_found", 10001
            )
            bodies.append(body["error"])
        assert all(b == bodies[0] for b in bodies)
        assert "acc_" not in bodies[0]["message"]
        theirs = await http.get(AUTH.format("acc_theirs"), headers=headers(KEY_B))
        assert theirs.status_code == 200

        # the queries are counted as queries, never as confirms, and wrote nothing
        def count(kind: str, outcome: str) -> float:
            value = worker.registry.get_sample_value(
                "passkey_auth_commands_total", {"type": kind, "outcome": outcome}
            )
            return value or 0.0

        assert count("get_auth_state", "ok") == 3
        assert count("get_auth_state", "error") == 4
        assert count("passkey_confirm", "ok") + count("passkey_confirm", "error") == 0


async def test_workspace_comes_from_the_key_only(api_settings: ApiSettings) -> None:
    """ws_b's key can not act on ws_a's account: the command carries ws_b, so the worker's
    ownership check answers 404 (tested end to end in test_api_e2e.py)."""
    settings = api_settings()

    def answer(cmd: PasskeyConfirm) -> tuple[int, dict[str, Any]]:
        owner = {"acc_a": "ws_a"}.get(cmd.account_id)
        if owner != cmd.workspace_id:
            return 404, {"request_id": cmd.request_id, "error": ServiceError.of("not_found").body()}
        return ok_answer(cmd)

    async with (
        responder(settings, answer) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        resp = await http.post(
            CONFIRM.format("acc_a"),
            headers=headers(KEY_B, **{"X-Workspace-Id": "ws_a"}),
            json={"workspace_id": "ws_a"},
        )
        assert_error(resp, 404, "not_found", 10001)
        assert [c.workspace_id for c in worker.commands] == ["ws_b"]
        assert (await http.post(CONFIRM.format("acc_a"), headers=headers())).status_code == 200


async def test_cors_preflight(api_settings: ApiSettings) -> None:
    settings = api_settings()
    async with (
        responder(settings),  # a worker without accounts: every query answers 404
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        allowed = {
            "Origin": ALLOWED_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "x-api-key, Content-Type,X-Request-Id",
        }
        for path in (CONFIRM.format("acc_1"), AUTH.format("acc_1")):
            resp = await http.options(path, headers=allowed)
            assert resp.status_code == 204
            assert resp.content == b""
            assert resp.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
            assert resp.headers["access-control-allow-methods"] == "GET, POST, PATCH, DELETE"
            assert (
                resp.headers["access-control-allow-headers"]
                == "X-Api-Key, Content-Type, X-Request-Id, Idempotency-Key"
            )
            assert int(resp.headers["access-control-max-age"]) > 0
            assert resp.headers["allow"] == ALLOW[path]
            assert "Origin" in resp.headers["vary"]
            assert GENERATED_RID.match(resp.headers["x-request-id"])

        refused = [
            {"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
            {"Origin": ALLOWED_ORIGIN + ".evil", "Access-Control-Request-Method": "GET"},
            # one method list for every route (worker.api.cors): PATCH/DELETE pass everywhere
            {"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "TRACE"},
            {"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "PUT"},
            {
                "Origin": ALLOWED_ORIGIN,
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "x-api-key, authorization",
            },
        ]
        for h in refused:
            resp = await http.options(AUTH.format("acc_1"), headers=h)
            assert_error(resp, 403, "cors_forbidden", 11009)
            assert "access-control-allow-origin" not in resp.headers

        # a preflight for a route that does not exist: the route check comes first
        resp = await http.options("/v1/nothing", headers=allowed)
        assert_error(resp, 404, "not_found", 10001)

        # actual cross-origin requests: allowed origins can read the response and its id
        resp = await http.get(AUTH.format("acc_1"), headers=headers(Origin=ALLOWED_ORIGIN))
        assert resp.status_code == 404
        assert resp.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert (
            resp.headers["access-control-expose-headers"]
            == "X-Request-Id, Retry-After, Idempotent-Replayed"
        )
        resp = await http.get(AUTH.format("acc_1"), headers=headers(Origin="https://evil.example"))
        assert "access-control-allow-origin" not in resp.headers


async def test_no_origin_is_allowed_by_default(make_settings: Any, keys_path: Any) -> None:
    settings = make_settings(api_keys_file=keys_path)
    async with (
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        resp = await http.options(
            AUTH.format("acc_1"),
            headers={"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "GET"},
        )
        assert_error(resp, 403, "cors_forbidden", 11009)


async def test_every_response_has_x_request_id(api_settings: ApiSettings) -> None:
    settings = api_settings()
    async with (
        responder(settings),  # a worker without accounts: every query answers 404
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for path in ("/metrics", "/healthz", "/readyz", "/openapi.json", "/nope"):
            resp = await http.get(path)
            assert GENERATED_RID.match(resp.headers["x-request-id"]), path
        # a valid caller id is kept, anything else replaced
        resp = await http.get(AUTH.format("acc_1"), headers=headers(**{"X-Request-Id": "abc:1"}))
        assert resp.headers["x-request-id"] == "abc:1" == resp.json()["request_id"]
        for bad in ("-bad", "a" * 129, "has space", "x/y"):
            resp = await http.get(AUTH.format("acc_1"), headers=headers(**{"X-Request-Id": bad}))
            assert GENERATED_RID.match(resp.headers["x-request-id"])
            assert resp.json()["request_id"] == resp.headers["x-request-id"]
        ids = set()
        for _ in range(20):
            ids.add((await http.get("/nope")).headers["x-request-id"])
        assert len(ids) == 20


async def test_probes_and_metrics(api_settings: ApiSettings) -> None:
    settings = api_settings()
    async with (
        responder(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        assert (await http.get("/readyz")).json() == {"ready": True}  # no details in public
        ready = await http.get(f"{api.metrics_url}/readyz")
        assert ready.status_code == 200
        # no WEBHOOK_SECRETS_KEY in these settings: webhooks are off (null), not "not ready"
        assert ready.json() == {
            "ready": True,
            "replies": True,
            "webhooks": None,
            "kafka": True,
        }
        await http.get(AUTH.format("acc_secret_1"), headers=headers())
        await http.get(AUTH.format("acc_secret_2"))
        await http.get("/v1/some/raw/path")
        await http.request("BREW", "/metrics")
        assert (await http.get("/metrics")).status_code == 404  # not on the public port
        text = (await http.get(f"{api.metrics_url}/metrics")).text
        assert text.startswith("# HELP")
        names = {
            m.group(1)
            for m in re.finditer(r"^# TYPE (\S+) ", text, flags=re.MULTILINE)
            if m.group(1).startswith("passkey_api_") and not m.group(1).endswith("_created")
        }
        assert names == {
            "passkey_api_requests_total",
            "passkey_api_request_duration_seconds",
            "passkey_api_reply_timeouts_total",
            "passkey_api_query_timeouts_total",
            "passkey_api_query_failures_total",
            "passkey_api_pending_replies",
            "passkey_api_ready",
            "passkey_api_kafka_outage_seconds",
            "passkey_api_kafka_broker_reachable",
            "passkey_api_tail_records_skipped_total",
            "passkey_api_refusals_total",
            "passkey_api_quota_refusals_total",
            "passkey_api_webhook_secrets_dropped_total",
            "passkey_api_webhook_replays_in_flight",
            "passkey_api_idempotency_replays_total",
            "passkey_api_idempotency_refusals_total",
            "passkey_api_idempotency_keys_stored_total",
            "passkey_api_key_last_used_timestamp_seconds",
            "passkey_api_reply_lag_records",
            "passkey_api_reply_reader_keeping_up",
            "passkey_api_reply_offset_gaps_total",
        }
        samples = set(re.findall(r"^(passkey_api_[a-z_]+)[{ ]", text, flags=re.MULTILINE))
        assert {
            "passkey_api_requests_total",
            "passkey_api_request_duration_seconds_bucket",
            "passkey_api_reply_timeouts_total",
            "passkey_api_pending_replies",
            "passkey_api_ready",
        } <= samples
        assert "acc_secret" not in text and "/v1/some" not in text
        routes = set(re.findall(r'route="([^"]*)"', text))
        assert routes <= {
            "/v1/accounts/{account_id}/auth",
            "/v1/accounts/{account_id}/auth/passkey-confirm",
            "/healthz",
            "/readyz",
            "/openapi.json",
            "unmatched",
        }
        assert set(re.findall(r'method="([^"]*)"', text)) <= {"GET", "POST", "other"}
        get_404 = api.registry.get_sample_value(
            "passkey_api_requests_total",
            {"route": "/v1/accounts/{account_id}/auth", "method": "GET", "status": "404"},
        )
        assert get_404 == 1.0
        assert api.registry.get_sample_value("passkey_api_ready") == 1.0


async def test_api_keys_never_logged(
    api_settings: ApiSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = api_settings(api_reply_timeout_s=1.0)
    async with (
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        await http.post(CONFIRM.format("acc_1"), headers=headers())  # logs a timeout
        await http.get(AUTH.format("acc_1"), headers=headers("pk_wrong-key-value"))
        await http.post(CONFIRM.format("acc_1"), headers=headers(KEY_B), content=b"[")
    out = capsys.readouterr()
    logged = out.out + out.err
    assert "api_reply_timeout" in logged
    for secret in (KEY_A, KEY_B, "pk_wrong-key-value"):
        assert secret not in logged


async def test_confirm_waits_for_readiness_then_sends(api_settings: ApiSettings) -> None:
    """A request that arrives before the reply consumer is positioned is held, not sent."""
    settings = api_settings()
    async with (
        responder(settings),
        running_api(settings, ready=False) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        resp = await http.post(CONFIRM.format("acc_1"), headers=headers())
        assert resp.status_code == 200
        assert api.replies.ready


async def test_openapi_served(api_settings: ApiSettings) -> None:
    from worker.documents.openapi.document import openapi_document

    async with (
        running_api(api_settings()) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        resp = await http.get("/openapi.json")
        assert resp.status_code == 200
        assert json.loads(resp.content) == openapi_document()


async def test_many_pollers_and_stop_is_clean(api_settings: ApiSettings) -> None:
    """Shutdown with requests in flight: they finish, the task ends, nothing leaks."""
    settings = api_settings()
    await put_state(settings, *(state_record(f"acc_{i}") for i in range(50)))
    async with (
        running_worker(settings),
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for i in range(50):
            r = await http.get(AUTH.format(f"acc_{i}"), headers=headers())
            assert r.status_code == 200


async def test_readiness_does_not_wait_for_account_state(api_settings: ApiSettings) -> None:
    """A replica's time to ready does not depend on the accounts: it reads no auth.state at
    all. With thousands of state records on the topic it is ready with no reader of it, and
    without the topic at all it starts and is ready just the same."""
    settings = api_settings()
    await put_state(settings, *(state_record(f"acc_many_{i}") for i in range(3000)))
    async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url) as http:
        ready = await http.get(f"{api.metrics_url}/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        read = {tp.topic for tail in api.tails for tp in tail.partitions}
        assert read == {
            settings.topics.replies,
            settings.topics.api_presence,
            settings.topics.api_idempotency,
        }
        assert settings.topics.state not in {t.topic for t in api.tails}

    bare = api_settings()  # a fresh prefix: its auth.state topic was never created
    async with running_api(bare) as api, httpx.AsyncClient(base_url=api.url) as http:
        assert (await http.get(f"{api.metrics_url}/readyz")).json()["ready"] is True
        producer = api.producer
        assert bare.topics.state not in (await producer.client.fetch_all_metadata()).topics()
