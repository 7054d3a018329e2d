"""``Idempotency-Key`` on the confirm route against the real broker: a repeat answers the first
answer (its ``request_id``) and the stand-in worker sees one command; another request with the
key answers 409 ``idempotency_key_reused``; a key in progress 409
``idempotency_key_in_progress``; keys are the workspace's own, shared by every front-end
replica, bounded per workspace and per process by the one admission rule; a hostile header
is refused before anything is sent
(docs/api.md, "Idempotent confirms"; docs/architecture.md, "Idempotent confirms")."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.api.conftest import ApiSettings
from tests.api.support import (
    KEY_B,
    headers,
    ok_answer,
    responder,
    running_api,
    wait_until,
)
from worker.api.idempotency import REPLAYED_HEADER
from worker.api.metrics import IDEMPOTENCY_REFUSALS
from worker.contract.catalogue import ServiceError
from worker.contract.messages import PasskeyConfirm

pytestmark = pytest.mark.integration

CONFIRM = "/v1/accounts/{}/auth/passkey-confirm"
EXHAUSTED = "idempotency_keys_exhausted"


def keyed(key: str, api_key: str | None = None) -> dict[str, str]:
    extra = {"Idempotency-Key": key}
    return headers(api_key, **extra) if api_key else headers(**extra)


def assert_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["error"]["code"] == code
    assert body["request_id"] == resp.headers["x-request-id"]
    assert ServiceError.of(code).numeric_code == body["error"]["numeric_code"]


async def test_a_repeat_answers_the_first_answer_and_sends_no_second_command(
    api_settings: ApiSettings,
) -> None:
    settings = api_settings()
    async with (
        responder(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        first = await http.post(CONFIRM.format("acc_1"), headers=keyed("order-1"), content=b"{}")
        assert first.status_code == 200, first.text
        assert REPLAYED_HEADER.lower() not in first.headers
        for _ in range(3):
            again = await http.post(
                CONFIRM.format("acc_1"), headers=keyed("order-1"), content=b"{}"
            )
            assert again.status_code == 200
            assert again.json() == first.json()  # same request_id, same data
            assert again.content == first.content
            assert again.headers[REPLAYED_HEADER] == "true"
            assert again.headers["x-request-id"] != first.json()["request_id"]
        await asyncio.sleep(0.3)  # a second command would have reached the responder by now
        assert len(worker.commands) == 1
        # Without a key, or with another, each request is a command of its own.
        await http.post(CONFIRM.format("acc_1"), headers=headers())
        await http.post(CONFIRM.format("acc_1"), headers=keyed("order-2"), content=b"{}")
        await wait_until(lambda: len(worker.commands) == 3, what="two more commands")


async def test_a_worker_error_is_kept_and_answered_again(api_settings: ApiSettings) -> None:
    def not_ready(cmd: PasskeyConfirm) -> tuple[int, dict[str, Any]]:
        return 409, {
            "request_id": cmd.request_id,
            "error": ServiceError.of("provider_not_ready").body(),
        }

    settings = api_settings()
    async with (
        responder(settings, not_ready) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        first = await http.post(CONFIRM.format("acc_1"), headers=keyed("k"))
        again = await http.post(CONFIRM.format("acc_1"), headers=keyed("k"))
        assert first.status_code == again.status_code == 409
        assert again.json() == first.json()
        assert len(worker.commands) == 1


async def test_the_same_key_with_another_request_answers_409_reused(
    api_settings: ApiSettings,
) -> None:
    settings = api_settings()
    async with (
        responder(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        assert (
            await http.post(CONFIRM.format("acc_1"), headers=keyed("k-1"), content=b"{}")
        ).status_code == 200
        other_body = await http.post(
            CONFIRM.format("acc_1"), headers=keyed("k-1"), content=b'{"a": 1}'
        )
        assert_error(other_body, 409, "idempotency_key_reused")
        assert ServiceError.of("idempotency_key_reused").body()["numeric_code"] == 90031
        other_account = await http.post(
            CONFIRM.format("acc_2"), headers=keyed("k-1"), content=b"{}"
        )
        assert_error(other_account, 409, "idempotency_key_reused")
        assert len(worker.commands) == 1


async def test_another_workspaces_same_key_is_independent(api_settings: ApiSettings) -> None:
    settings = api_settings()
    async with (
        responder(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        mine = await http.post(CONFIRM.format("acc_1"), headers=keyed("shared"))
        theirs = await http.post(CONFIRM.format("acc_1"), headers=keyed("shared", KEY_B))
        assert mine.status_code == theirs.status_code == 200
        assert mine.json()["request_id"] != theirs.json()["request_id"]
        # And with another body: their key is theirs, not a reuse of ours.
        other = await http.post(
            CONFIRM.format("acc_9"), headers=keyed("shared-2", KEY_B), content=b'{"x":1}'
        )
        assert other.status_code == 200
        await wait_until(lambda: len(worker.commands) == 3, what="three commands")
        assert [c.workspace_id for c in worker.commands] == ["ws_a", "ws_b", "ws_b"]


async def test_two_concurrent_requests_with_one_key_one_runs_the_other_waits_or_is_told(
    api_settings: ApiSettings,
) -> None:
    seen: list[PasskeyConfirm] = []

    def slow(cmd: PasskeyConfirm) -> None:
        seen.append(cmd)

    settings = api_settings()
    async with (
        responder(settings, slow) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=20) as http,
    ):
        first = asyncio.create_task(http.post(CONFIRM.format("acc_1"), headers=keyed("race")))
        await wait_until(lambda: len(seen) == 1, what="the first command")
        second = await http.post(CONFIRM.format("acc_1"), headers=keyed("race"))
        assert_error(second, 409, "idempotency_key_in_progress")
        assert second.headers["retry-after"] == "1"
        first_resp = await first  # no reply: the front-end's 500 after its reply timeout
        assert first_resp.status_code == 500
        assert len(worker.commands) == 1


async def test_racing_requests_on_one_replica_send_one_command(api_settings: ApiSettings) -> None:
    settings = api_settings()
    async with (
        responder(settings, max_delay_s=0.2) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=20) as http,
    ):
        answers = await asyncio.gather(
            *(http.post(CONFIRM.format("acc_1"), headers=keyed("burst")) for _ in range(8))
        )
        ok = [a for a in answers if a.status_code == 200]
        busy = [a for a in answers if a.status_code == 409]
        assert len(ok) + len(busy) == 8 and ok
        assert all(a.json()["error"]["code"] == "idempotency_key_in_progress" for a in busy)
        assert len({a.json()["request_id"] for a in ok}) == 1
        await asyncio.sleep(0.3)
        assert len(worker.commands) == 1


async def test_a_front_end_failure_gives_the_key_up(api_settings: ApiSettings) -> None:
    """No answer from the worker (a time-out): nothing is kept, so a retry with the key runs
    (the 500 says to check the state first)."""
    calls = 0

    def second_only(cmd: PasskeyConfirm) -> tuple[int, dict[str, Any]] | None:
        nonlocal calls
        calls += 1
        return None if calls == 1 else ok_answer(cmd)

    settings = api_settings(api_reply_timeout_s=1.0)
    async with (
        responder(settings, second_only) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=20) as http,
    ):
        failed = await http.post(CONFIRM.format("acc_1"), headers=keyed("retry-me"))
        assert_error(failed, 500, "run_auth_action_failed")
        retried = await http.post(CONFIRM.format("acc_1"), headers=keyed("retry-me"))
        assert retried.status_code == 200, retried.text
        assert len(worker.commands) == 2
        again = await http.post(CONFIRM.format("acc_1"), headers=keyed("retry-me"))
        assert again.json() == retried.json()
        assert len(worker.commands) == 2


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b" ",
        b"x" * 256,
        b"x" * 8000,
        "clé".encode(),
        b"\xff\xfe",
        b"a b",
        b"tab\there",
        b"nul\x00",
    ],
)
async def test_a_hostile_key_is_refused_before_anything_is_sent(
    api_settings: ApiSettings, value: bytes
) -> None:
    settings = api_settings()
    async with (
        responder(settings) as worker,
        running_api(settings) as api,
    ):
        host, port = api.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(
                b"POST /v1/accounts/acc_1/auth/passkey-confirm HTTP/1.1\r\nHost: x\r\n"
                b"X-Api-Key: " + headers()["X-Api-Key"].encode() + b"\r\n"
                b"Idempotency-Key: " + value + b"\r\nContent-Length: 0\r\n\r\n"
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        status = int(head.split(b" ")[1])
        # uvicorn's parser refuses some bytes itself (400 too); ours answers the catalogue's.
        assert status == 400, head
        await asyncio.sleep(0.2)
        assert worker.commands == []


async def test_a_key_sent_twice_or_at_the_limit(api_settings: ApiSettings) -> None:
    settings = api_settings()
    async with (
        responder(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        twice = await http.post(
            CONFIRM.format("acc_1"),
            headers=[
                ("X-Api-Key", headers()["X-Api-Key"]),
                ("Idempotency-Key", "a"),
                ("Idempotency-Key", "b"),
            ],
        )
        assert_error(twice, 400, "invalid_request")
        assert "Idempotency-Key" in twice.json()["error"]["message"]
        longest = await http.post(CONFIRM.format("acc_1"), headers=keyed("~" * 255))
        assert longest.status_code == 200
        assert len(worker.commands) == 1
        # A key is checked after the API key: an unknown key learns nothing of it.
        anonymous = await http.post(
            CONFIRM.format("acc_1"), headers={"X-Api-Key": "nope", "Idempotency-Key": ""}
        )
        assert_error(anonymous, 401, "invalid_api_key")


async def test_a_workspace_holds_at_most_its_quota_of_keys(api_settings: ApiSettings) -> None:
    settings = api_settings(api_idempotency_keys_per_workspace=3)
    async with (
        responder(settings) as worker,
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url) as http,
    ):
        for i in range(3):
            resp = await http.post(CONFIRM.format("acc_1"), headers=keyed(f"q-{i}"))
            assert resp.status_code == 200
        over = await http.post(CONFIRM.format("acc_1"), headers=keyed("q-3"))
        assert_error(over, 429, "idempotency_keys_exhausted")
        assert int(over.headers["retry-after"]) >= 1
        # Held keys still answer; another workspace has its own quota; no key: no quota.
        assert (await http.post(CONFIRM.format("acc_1"), headers=keyed("q-0"))).status_code == 200
        theirs = await http.post(CONFIRM.format("acc_1"), headers=keyed("q-3", KEY_B))
        assert theirs.status_code == 200
        assert (await http.post(CONFIRM.format("acc_1"), headers=headers())).status_code == 200
        assert len(worker.commands) == 5
        assert api.idempotency is not None
        assert api.idempotency.held("ws_a") == 3  # type: ignore[attr-defined]


async def test_the_process_cap_refuses_with_429_and_a_workspace_holding_none_is_served(
    api_settings: ApiSettings,
) -> None:
    """``API_IDEMPOTENCY_KEYS_MAX`` through the one admission rule: past the reserve a
    workspace below its own quota is refused (429, ``Retry-After``), one holding no key is
    still served, then past the cap none; a replica started afterwards reads the same counts
    back and refuses the same keys, and every key held still replays."""
    settings = api_settings(api_idempotency_keys_per_workspace=4, api_idempotency_keys_max=4)
    async with responder(settings) as worker, httpx.AsyncClient(timeout=20) as http:
        async with running_api(settings) as api:
            url = api.url + CONFIRM.format("acc_1")
            first = [(await http.post(url, headers=keyed(f"cap-{i}"))) for i in range(3)]
            assert [r.status_code for r in first] == [200, 200, 200]
            over = await http.post(url, headers=keyed("cap-3"))  # its quota is 4
            assert_error(over, 429, "idempotency_keys_exhausted")
            assert int(over.headers["retry-after"]) >= 1
            theirs = await http.post(url, headers=keyed("cap-b0", KEY_B))
            assert theirs.status_code == 200, theirs.text
            full = await http.post(url, headers=keyed("cap-b1", KEY_B))
            assert_error(full, 429, "idempotency_keys_exhausted")
            assert (await http.post(url, headers=headers())).status_code == 200  # no key
            assert api.idempotency is not None
            assert api.idempotency.in_use == 4  # type: ignore[attr-defined]
        assert len(worker.commands) == 5
        async with running_api(settings) as restarted:
            url = restarted.url + CONFIRM.format("acc_1")
            assert restarted.idempotency is not None
            assert restarted.idempotency.in_use == 4  # type: ignore[attr-defined]
            assert restarted.idempotency.held("ws_a") == 3  # type: ignore[attr-defined]
            for refused in (keyed("cap-3"), keyed("cap-b1", KEY_B)):
                assert_error(await http.post(url, headers=refused), 429, EXHAUSTED)
            again = await http.post(url, headers=keyed("cap-0"))
            assert again.json() == first[0].json()
            assert again.headers[REPLAYED_HEADER] == "true"
        assert len(worker.commands) == 5


async def test_two_replicas_share_the_keys(api_settings: ApiSettings) -> None:
    settings = api_settings()
    async with (
        responder(settings) as worker,
        running_api(settings) as one,
        running_api(settings) as two,
        httpx.AsyncClient(timeout=20) as http,
    ):
        first = await http.post(one.url + CONFIRM.format("acc_1"), headers=keyed("across"))
        assert first.status_code == 200
        deadline = time.monotonic() + 10
        while True:  # the other replica reads the answer within a fetch or two
            again = await http.post(two.url + CONFIRM.format("acc_1"), headers=keyed("across"))
            if again.status_code == 200 or time.monotonic() > deadline:
                break
            assert again.json()["error"]["code"] == "idempotency_key_in_progress"
            await asyncio.sleep(0.05)
        assert again.json() == first.json()
        assert again.headers[REPLAYED_HEADER] == "true"
        reused = await http.post(
            two.url + CONFIRM.format("acc_2"), headers=keyed("across"), content=b"{}"
        )
        assert_error(reused, 409, "idempotency_key_reused")
        # Racing on both replicas at once: one command.
        racing = await asyncio.gather(
            *(
                http.post(api.url + CONFIRM.format("acc_3"), headers=keyed("both"))
                for api in (one, two, one, two)
            )
        )
        assert {r.status_code for r in racing} <= {200, 409}
        assert any(r.status_code == 200 for r in racing)
        await asyncio.sleep(0.3)
        assert len(worker.commands) == 2


async def test_a_restarted_replica_still_knows_the_keys(api_settings: ApiSettings) -> None:
    settings = api_settings()
    async with responder(settings) as worker, httpx.AsyncClient(timeout=20) as http:
        async with running_api(settings) as api:
            first = await http.post(api.url + CONFIRM.format("acc_1"), headers=keyed("durable"))
        async with running_api(settings) as api:
            again = await http.post(api.url + CONFIRM.format("acc_1"), headers=keyed("durable"))
        assert again.json() == first.json()
        assert len(worker.commands) == 1


def _idempotency_counts(registry: CollectorRegistry) -> dict[str, float]:
    """The front-end's idempotency counters: ``stored``, ``replayed`` and one per refusal
    reason; fails if any of their series carries a label beyond ``reason``."""
    counts: dict[str, float] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if not sample.name.startswith("passkey_api_idempotency_"):
                continue
            assert set(sample.labels) <= {"reason"}, sample  # never a key or a workspace
            if not sample.name.endswith("_total"):
                continue
            if sample.name == "passkey_api_idempotency_refusals_total":
                counts[sample.labels["reason"]] = sample.value
            elif sample.name == "passkey_api_idempotency_replays_total":
                counts["replayed"] = sample.value
            elif sample.name == "passkey_api_idempotency_keys_stored_total":
                counts["stored"] = sample.value
    return counts


async def test_each_outcome_of_a_key_moves_its_counter(api_settings: ApiSettings) -> None:
    """Stored, replayed, and each refusal (in progress, reused, exhausted) counted once per
    request on the front-end's own ``/metrics`` registry; a request that gets no answer
    stores nothing."""

    def silent_for_slow(cmd: PasskeyConfirm) -> tuple[int, dict[str, Any]] | None:
        return None if cmd.account_id == "acc_slow" else ok_answer(cmd)

    settings = api_settings(api_idempotency_keys_per_workspace=2, api_reply_timeout_s=1.0)
    registry = CollectorRegistry()
    zero = {"stored": 0.0, "replayed": 0.0, **dict.fromkeys(IDEMPOTENCY_REFUSALS, 0.0)}
    async with (
        responder(settings, silent_for_slow) as worker,
        running_api(settings, registry=registry) as api,
        httpx.AsyncClient(base_url=api.url, timeout=20) as http,
    ):
        assert _idempotency_counts(registry) == zero  # every series exported from the start
        first = await http.post(CONFIRM.format("acc_1"), headers=keyed("m-1"), content=b"{}")
        assert first.status_code == 200
        assert _idempotency_counts(registry) == {**zero, "stored": 1}
        again = await http.post(CONFIRM.format("acc_1"), headers=keyed("m-1"), content=b"{}")
        assert again.headers[REPLAYED_HEADER] == "true"
        assert _idempotency_counts(registry) == {**zero, "stored": 1, "replayed": 1}
        reused = await http.post(CONFIRM.format("acc_1"), headers=keyed("m-1"), content=b"{ }")
        assert_error(reused, 409, "idempotency_key_reused")
        assert _idempotency_counts(registry)["reused"] == 1

        slow = asyncio.create_task(http.post(CONFIRM.format("acc_slow"), headers=keyed("m-2")))
        await wait_until(lambda: len(worker.commands) == 2, what="the slow command")
        busy = await http.post(CONFIRM.format("acc_slow"), headers=keyed("m-2"))
        assert_error(busy, 409, "idempotency_key_in_progress")
        assert _idempotency_counts(registry)["in_progress"] == 1
        assert (await slow).status_code == 500  # no answer: the key is given up, not stored
        assert _idempotency_counts(registry)["stored"] == 1

        assert (await http.post(CONFIRM.format("acc_1"), headers=keyed("m-3"))).status_code == 200
        over = await http.post(CONFIRM.format("acc_1"), headers=keyed("m-4"))
        assert_error(over, 429, "idempotency_keys_exhausted")
        assert _idempotency_counts(registry) == {
            "stored": 2,
            "replayed": 1,
            "in_progress": 1,
            "reused": 1,
            "exhausted": 1,
        }
        # And on the scrape an operator reads: the families by their exported names.
        scraped = (await http.get(f"{api.metrics_url}/metrics")).text
        assert 'passkey_api_idempotency_refusals_total{reason="exhausted"} 1.0' in scraped
        assert "passkey_api_idempotency_replays_total 1.0" in scraped
        assert "passkey_api_idempotency_keys_stored_total 2.0" in scraped
