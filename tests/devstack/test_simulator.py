"""The provider simulator's wire contract, over real loopback HTTP, and its in-process twin."""

from __future__ import annotations

import asyncio
import random
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from devstack.settings import DevSettings
from devstack.simulator import (
    ProviderSimulator,
    in_process_provider,
    running_simulator,
    serve_simulator,
)
from worker.auth.provider import HttpProviderAdapter, ProviderAdapter, ProviderError

QUIET = {"latency_ms": 0.0, "jitter_ms": 0.0, "error_rate": 0.0, "fail_next": 0}


class FakeClock:
    """Drives the simulator's authorize delay, so flow tests never sleep."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


CLOCK = FakeClock()


def ref(prefix: str = "") -> str:
    return f"{prefix}acct-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[tuple[ProviderSimulator, str]]:
    simulator = ProviderSimulator(authorize_delay_s=30.0, clock=CLOCK, rng=random.Random(3))
    async with running_simulator(simulator) as url:
        yield simulator, url


@pytest.fixture
async def sim(served: tuple[ProviderSimulator, str]) -> ProviderSimulator:
    simulator, _ = served
    simulator.reset()
    simulator.configure(QUIET)
    return simulator


@pytest.fixture
async def http(
    served: tuple[ProviderSimulator, str], sim: ProviderSimulator
) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served[1], trust_env=False) as client:
        yield client


async def confirm(http: httpx.AsyncClient, account: str, key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return await http.post(f"/v1/accounts/{account}/passkey/confirm", headers=headers)


async def stats(http: httpx.AsyncClient) -> dict[str, Any]:
    body: dict[str, Any] = (await http.get("/_sim/stats")).json()
    return body


SENT = {"status": "passkey_confirmation_sent", "auth_status": "passkey_confirmation_sent"}
PENDING = {"status": "passkey_confirmation", "auth_status": "passkey_confirmation"}


# -- wire contract ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "status", "body"),
    [
        ("", 200, SENT),
        ("sim-fail-", 200, SENT),
        ("sim-slow-", 200, SENT),
        ("sim-unavailable-", 503, "unavailable"),
        ("sim-mismatch-", 409, "identity_mismatch"),
        ("sim-invalid-", 400, "invalid_request"),
        ("sim-unsupported-", 501, "unsupported_operation"),
    ],
)
async def test_confirm_by_prefix(
    http: httpx.AsyncClient, sim: ProviderSimulator, prefix: str, status: int, body: Any
) -> None:
    sim.configure({"slow_ms": 1.0})
    response = await confirm(http, ref(prefix), "key-1")
    assert response.status_code == status
    if isinstance(body, dict):
        assert response.json() == body
    else:
        assert response.json()["error"]["type"] == body


@pytest.mark.parametrize(
    ("prefix", "status", "kind"),
    [
        ("", 200, None),
        ("sim-unsupported-", 200, None),  # no passkey operation, but the state is readable
        ("sim-unavailable-", 503, "unavailable"),
        ("sim-mismatch-", 409, "identity_mismatch"),
        ("sim-invalid-", 400, "invalid_request"),
    ],
)
async def test_auth_state_by_prefix(
    http: httpx.AsyncClient, prefix: str, status: int, kind: str | None
) -> None:
    response = await http.get(f"/v1/accounts/{ref(prefix)}/auth-state")
    assert response.status_code == status
    if kind is None:
        assert response.json() == PENDING
    else:
        assert response.json()["error"]["type"] == kind


async def test_missing_idempotency_key_is_invalid_request(http: httpx.AsyncClient) -> None:
    account = ref()
    for key in (None, ""):
        response = await confirm(http, account, key)
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request"
    assert (await http.get(f"/v1/accounts/{account}/auth-state")).json() == PENDING
    assert (await stats(http))["total_calls"] == 3


async def test_flow_reaches_authorized_after_the_delay(
    http: httpx.AsyncClient, sim: ProviderSimulator
) -> None:
    account, failing = ref(), ref("sim-fail-")
    assert (await confirm(http, account, "k-ok")).status_code == 200
    assert (await confirm(http, failing, "k-fail")).status_code == 200
    assert (await http.get(f"/v1/accounts/{account}/auth-state")).json() == SENT
    CLOCK.now += sim.knobs.authorize_delay_s
    state = (await http.get(f"/v1/accounts/{account}/auth-state")).json()
    assert state == {"status": "authorized", "auth_status": "authorized"}
    state = (await http.get(f"/v1/accounts/{failing}/auth-state")).json()
    assert state == {"status": "failed", "auth_status": "failed"}


async def test_repeated_key_returns_the_first_answer_without_a_second_effect(
    http: httpx.AsyncClient,
) -> None:
    account = ref()
    first, second = await confirm(http, account, "k"), await confirm(http, account, "k")
    assert (second.status_code, second.json()) == (first.status_code, first.json())
    mismatch = ref("sim-mismatch-")
    first, second = await confirm(http, mismatch, "m"), await confirm(http, mismatch, "m")
    assert (second.status_code, second.json()) == (first.status_code, first.json()) != (200, SENT)
    body = await stats(http)
    assert body["confirm_calls"] == {"k": 2, "m": 2}
    assert body["confirm_effects"] == {"k": 1, "m": 0}
    assert body["total_calls"] == 4


async def test_concurrent_repeats_take_effect_once(
    http: httpx.AsyncClient, sim: ProviderSimulator
) -> None:
    sim.configure({"latency_ms": 20.0, "jitter_ms": 10.0})
    account = ref()
    responses = await asyncio.gather(*(confirm(http, account, "same") for _ in range(8)))
    assert {r.status_code for r in responses} == {200}
    body = await stats(http)
    assert body["confirm_calls"] == {"same": 8}
    assert body["confirm_effects"] == {"same": 1}


async def test_transient_answers_are_not_stored(
    http: httpx.AsyncClient, sim: ProviderSimulator
) -> None:
    sim.configure({"fail_next": 1})
    account = ref()
    assert (await confirm(http, account, "k")).status_code == 503
    assert (await confirm(http, account, "k")).status_code == 200
    body = await stats(http)
    assert (body["confirm_calls"], body["confirm_effects"]) == ({"k": 2}, {"k": 1})


async def test_key_reused_for_another_account_is_rejected(http: httpx.AsyncClient) -> None:
    assert (await confirm(http, ref(), "k")).status_code == 200
    response = await confirm(http, ref(), "k")
    assert response.status_code == 422
    assert response.json()["error"]["type"] == "invalid_request"


async def test_confirm_after_the_challenge_is_gone(
    http: httpx.AsyncClient, sim: ProviderSimulator
) -> None:
    account = ref()
    assert (await confirm(http, account, "k1")).status_code == 200
    # Already sent under another key: current state, no new effect.
    again = await confirm(http, account, "k2")
    assert (again.status_code, again.json()) == (200, SENT)
    CLOCK.now += sim.knobs.authorize_delay_s
    late = await confirm(http, account, "k3")
    assert late.status_code == 422
    assert late.json()["error"]["type"] == "operation_failed"
    assert (await stats(http))["confirm_effects"] == {"k1": 1, "k2": 0, "k3": 0}


async def test_error_rate_one_fails_every_call(
    http: httpx.AsyncClient, sim: ProviderSimulator
) -> None:
    sim.configure({"error_rate": 1.0})
    assert (await confirm(http, ref(), "k")).status_code == 503
    assert (await http.get(f"/v1/accounts/{ref()}/auth-state")).status_code == 503


# -- control routes --------------------------------------------------------------------------------


async def test_config_updates_knobs_and_rejects_bad_values(http: httpx.AsyncClient) -> None:
    knobs = (await http.post("/_sim/config", json={"latency_ms": 7, "error_rate": 0.25})).json()
    assert (knobs["latency_ms"], knobs["error_rate"], knobs["jitter_ms"]) == (7, 0.25, 0)
    for bad in ({"error_rate": 2}, {"latency_ms": -1}, {"nope": 1}, [1]):
        response = await http.post("/_sim/config", json=bad)
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request"
    broken = await http.post("/_sim/config", content=b"{not json")
    assert broken.status_code == 400
    assert (await http.get("/_sim/config")).json() == knobs


async def test_reset_forgets_accounts_keys_and_counters(http: httpx.AsyncClient) -> None:
    account = ref()
    await confirm(http, account, "k")
    assert (await http.post("/_sim/reset")).status_code == 204
    assert await stats(http) == {
        "confirm_calls": {},
        "confirm_effects": {},
        "confirm_traceparents": {},
        "state_calls": 0,
        "total_calls": 0,
        "unauthorized_calls": 0,
    }
    assert (await http.get(f"/v1/accounts/{account}/auth-state")).json() == PENDING


async def test_unknown_routes_answer_json(http: httpx.AsyncClient) -> None:
    missing = await http.get("/v2/nothing")
    assert (missing.status_code, missing.json()["error"]["type"]) == (404, "not_found")
    wrong = await http.get(f"/v1/accounts/{ref()}/passkey/confirm")
    assert (wrong.status_code, wrong.json()["error"]["type"]) == (405, "method_not_allowed")
    assert (await http.get("/healthz")).json() == {"status": "ok"}


def test_latency_is_never_negative_and_slow_refs_add_slow_ms() -> None:
    sim = ProviderSimulator(latency_ms=1.0, jitter_ms=50.0, slow_ms=300.0, rng=random.Random(5))
    samples = [sim.sample_latency_s("acct") for _ in range(2000)]
    assert min(samples) == 0.0  # clipped, never below
    assert 0.0 < sorted(samples)[1000] < 0.01
    steady = ProviderSimulator(latency_ms=10.0, jitter_ms=0.0, slow_ms=300.0)
    assert steady.sample_latency_s("acct") == pytest.approx(0.010)
    assert steady.sample_latency_s("sim-slow-acct") == pytest.approx(0.310)


def test_knobs_default_from_settings() -> None:
    settings = DevSettings(
        simulator_latency_ms=3.0,
        simulator_jitter_ms=1.0,
        simulator_error_rate=0.1,
        simulator_authorize_delay_s=4.0,
        simulator_slow_ms=50.0,
    )
    knobs = ProviderSimulator.from_settings(settings).knobs
    assert (knobs.latency_ms, knobs.jitter_ms, knobs.error_rate) == (3.0, 1.0, 0.1)
    assert (knobs.authorize_delay_s, knobs.slow_ms) == (4.0, 50.0)


async def test_serve_simulator_runs_until_cancelled() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = DevSettings(simulator_host="127.0.0.1", simulator_port=port)
    task = asyncio.create_task(serve_simulator(settings))
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
        for _ in range(400):
            try:
                if (await client.get("/healthz")).status_code == 200:
                    break
            except httpx.ConnectError:
                await asyncio.sleep(0.01)
        else:
            pytest.fail("the simulator did not start")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("/healthz")


# -- the in-process provider -----------------------------------------------------------------------


def in_process(sim: ProviderSimulator, **kwargs: Any) -> HttpProviderAdapter:
    kwargs.setdefault("backoff_base_s", 0.001)
    kwargs.setdefault("backoff_max_s", 0.002)
    return in_process_provider(sim, **kwargs)


@pytest.mark.parametrize(
    ("prefix", "expected", "transient"),
    [
        ("sim-unavailable-", ("provider_unavailable", 30002, 502), True),
        ("sim-mismatch-", ("provider_account_mismatch", 20017, 409), False),
        ("sim-invalid-", ("provider_invalid_request", 30001, 400), False),
        ("sim-unsupported-", ("unsupported_by_provider", 30003, 501), False),
    ],
)
async def test_in_process_faults_map_like_http(
    sim: ProviderSimulator, prefix: str, expected: tuple[str, int, int], transient: bool
) -> None:
    provider: ProviderAdapter = in_process(sim, max_attempts=2)
    with pytest.raises(ProviderError) as caught:
        await provider.confirm_passkey(ref(prefix), idempotency_key="k")
    error = caught.value.error
    assert (error.code, error.numeric_code, error.http_status) == expected
    assert caught.value.transient is transient
    assert sim.stats()["confirm_calls"] == {"k": 2 if transient else 1}


async def test_in_process_flow_with_retries(sim: ProviderSimulator) -> None:
    calls: list[tuple[str, str, str]] = []
    retries: list[tuple[str, str]] = []
    provider = in_process(
        sim,
        name="bench",
        on_call=lambda p, op, outcome, _s: calls.append((p, op, outcome)),
        on_retry=lambda p, op: retries.append((p, op)),
    )
    account = ref()
    sim.configure({"fail_next": 2})
    state = await provider.confirm_passkey(account, idempotency_key="k")
    assert (state.status, state.auth_status) == (SENT["status"], SENT["auth_status"])
    assert retries == [("bench", "confirm_passkey")] * 2
    CLOCK.now += sim.knobs.authorize_delay_s
    assert (await provider.get_auth_state(account)).status == "authorized"
    assert calls == [("bench", "confirm_passkey", "ok"), ("bench", "get_auth_state", "ok")]
    assert sim.stats()["confirm_effects"] == {"k": 1}


async def test_in_process_rejects_empty_ref(sim: ProviderSimulator) -> None:
    with pytest.raises(ProviderError) as caught:
        await in_process(sim).get_auth_state("")
    assert caught.value.error.numeric_code == 30001
    assert sim.stats()["total_calls"] == 0
    await in_process(sim).aclose()
