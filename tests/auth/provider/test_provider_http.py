"""The HTTP adapter against the real simulator on loopback (a scripted raw-socket provider, also
on loopback, for answers the simulator never gives), and the registry built from settings."""

from __future__ import annotations

import asyncio
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from devstack.simulator import ProviderSimulator, in_process_provider, running_simulator
from tests.auth.provider.hostile import HostileProvider, Script, http, in_turn, json_answer, written
from worker.auth.provider import (
    BreakerState,
    CircuitBreaker,
    HttpProviderAdapter,
    ProviderAdapter,
    ProviderError,
    ProviderHttpClient,
    ProviderRegistry,
    build_http_client,
    build_registry,
)
from worker.settings import Settings

UNAVAILABLE = ("provider_unavailable", 30002, 502)
OPERATION_FAILED = ("provider_unavailable", 30010, 502)


class FakeClock:
    """Drives the simulator's authorize delay and the breaker's reset time: no sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CeilingRandom(random.Random):
    """Full jitter at its worst: every backoff is the whole ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


CLOCK = FakeClock()


class Hooks:
    """Collects the adapter's metric callbacks."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.retries: list[tuple[str, str]] = []

    def on_call(self, provider: str, operation: str, outcome: str, seconds: float) -> None:
        assert seconds >= 0
        self.calls.append((provider, operation, outcome))

    def on_retry(self, provider: str, operation: str) -> None:
        self.retries.append((provider, operation))


def ref(prefix: str = "") -> str:
    return f"{prefix}acct-{uuid.uuid4().hex[:12]}"


def key() -> str:
    return f"cmd-{uuid.uuid4().hex}"


def state(breaker: CircuitBreaker) -> BreakerState:
    """Read through a function, so mypy does not narrow the property between asserts."""
    return breaker.state


def triple(exc: ProviderError) -> tuple[str, int, int]:
    return (exc.error.code, exc.error.numeric_code, exc.error.http_status)


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[tuple[ProviderSimulator, str]]:
    simulator = ProviderSimulator(authorize_delay_s=30.0, clock=CLOCK, rng=random.Random(7))
    async with running_simulator(simulator) as url:
        yield simulator, url


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[ProviderHttpClient]:
    """The shared client, built the way the worker builds it."""
    settings = Settings(provider_timeout_s=5.0)
    async with build_http_client(settings) as shared:
        yield shared


@pytest.fixture
def sim(served: tuple[ProviderSimulator, str]) -> ProviderSimulator:
    simulator = served[0]
    simulator.reset()
    simulator.configure(
        {"latency_ms": 0.0, "jitter_ms": 0.0, "error_rate": 0.0, "fail_next": 0, "slow_ms": 300.0}
    )
    return simulator


AdapterFactory = Callable[..., HttpProviderAdapter]


@pytest.fixture
def adapter(
    served: tuple[ProviderSimulator, str], client: ProviderHttpClient, sim: ProviderSimulator
) -> AdapterFactory:
    def make(**kwargs: Any) -> HttpProviderAdapter:
        kwargs.setdefault("backoff_base_s", 0.001)
        kwargs.setdefault("backoff_max_s", 0.002)
        return HttpProviderAdapter("simulator", served[1], client, **kwargs)

    return make


# -- against the simulator -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "expected", "transient"),
    [
        ("sim-unavailable-", UNAVAILABLE, True),
        ("sim-mismatch-", ("provider_account_mismatch", 20017, 409), False),
        ("sim-invalid-", ("provider_invalid_request", 30001, 400), False),
        ("sim-unsupported-", ("unsupported_by_provider", 30003, 501), False),
    ],
)
async def test_scripted_faults_map_to_catalogued_errors(
    adapter: AdapterFactory,
    sim: ProviderSimulator,
    prefix: str,
    expected: tuple[str, int, int],
    transient: bool,
) -> None:
    with pytest.raises(ProviderError) as caught:
        await adapter(max_attempts=3).confirm_passkey(ref(prefix), idempotency_key="k")
    assert triple(caught.value) == expected
    assert caught.value.transient is transient
    # Only transient failures are retried.
    assert sim.stats()["confirm_calls"] == {"k": 3 if transient else 1}


async def test_challenge_gone_is_an_operation_failure(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    provider, account = adapter(), ref()
    await provider.confirm_passkey(account, idempotency_key=key())
    CLOCK.now += sim.knobs.authorize_delay_s
    with pytest.raises(ProviderError) as caught:
        await provider.confirm_passkey(account, idempotency_key=key())
    assert triple(caught.value) == OPERATION_FAILED
    assert not caught.value.transient


async def test_same_key_twice_has_one_effect(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    provider, account, command_id = adapter(), ref(), key()
    first = await provider.confirm_passkey(account, idempotency_key=command_id)
    again = await provider.confirm_passkey(account, idempotency_key=command_id)
    assert first == again
    assert first.status == first.auth_status == "passkey_confirmation_sent"
    stats = sim.stats()
    assert stats["confirm_calls"] == {command_id: 2}
    assert stats["confirm_effects"] == {command_id: 1}


async def test_follow_up_reaches_authorized_or_failed(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    provider, ok, failing = adapter(), ref(), ref("sim-fail-")
    assert (await provider.get_auth_state(ok)).status == "passkey_confirmation"
    await provider.confirm_passkey(ok, idempotency_key=key())
    await provider.confirm_passkey(failing, idempotency_key=key())
    assert (await provider.get_auth_state(ok)).status == "passkey_confirmation_sent"
    CLOCK.now += sim.knobs.authorize_delay_s
    authorized = await provider.get_auth_state(ok)
    assert (authorized.status, authorized.auth_status) == ("authorized", "authorized")
    assert (await provider.get_auth_state(failing)).auth_status == "failed"


async def test_error_rate_is_retried_to_success(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    sim.configure({"error_rate": 0.5})
    hooks = Hooks()
    provider = adapter(max_attempts=40, on_call=hooks.on_call, on_retry=hooks.on_retry)
    keys = [key() for _ in range(20)]
    for command_id in keys:
        state = await provider.confirm_passkey(ref(), idempotency_key=command_id)
        assert state.status == "passkey_confirmation_sent"
    stats = sim.stats()
    assert stats["confirm_effects"] == dict.fromkeys(keys, 1)
    assert sum(stats["confirm_calls"].values()) == len(keys) + len(hooks.retries)
    assert hooks.retries  # 0.5 error rate over 20 calls: some were retried
    assert hooks.calls == [("simulator", "confirm_passkey", "ok")] * len(keys)


async def test_transient_failures_then_success(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    sim.configure({"fail_next": 2})
    hooks = Hooks()
    provider = adapter(max_attempts=3, on_call=hooks.on_call, on_retry=hooks.on_retry)
    command_id = key()
    await provider.confirm_passkey(ref(), idempotency_key=command_id)
    assert sim.stats()["confirm_calls"] == {command_id: 3}
    assert hooks.retries == [("simulator", "confirm_passkey")] * 2


async def test_unavailable_after_bounded_retries(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    hooks = Hooks()
    provider = adapter(max_attempts=4, on_call=hooks.on_call, on_retry=hooks.on_retry)
    with pytest.raises(ProviderError) as caught:
        await provider.get_auth_state(ref("sim-unavailable-"))
    assert triple(caught.value) == UNAVAILABLE
    assert caught.value.transient
    assert sim.stats()["state_calls"] == 4
    assert len(hooks.retries) == 3
    assert hooks.calls == [("simulator", "get_auth_state", "unavailable")]


async def test_no_call_once_the_deadline_has_passed(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    with pytest.raises(ProviderError) as caught:
        await adapter().confirm_passkey(ref(), idempotency_key="k", deadline=time.monotonic())
    assert triple(caught.value) == UNAVAILABLE
    assert sim.stats()["total_calls"] == 0


async def test_no_retry_whose_backoff_would_cross_the_deadline(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    provider = adapter(
        max_attempts=10, backoff_base_s=10.0, backoff_max_s=10.0, rng=CeilingRandom()
    )
    deadline = time.monotonic() + 5.0
    with pytest.raises(ProviderError) as caught:
        await provider.confirm_passkey(
            ref("sim-unavailable-"), idempotency_key="k", deadline=deadline
        )
    assert triple(caught.value) == UNAVAILABLE
    assert sim.stats()["confirm_calls"] == {"k": 1}
    assert time.monotonic() < deadline


async def test_slow_answer_is_cut_off_at_the_deadline(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    sim.configure({"slow_ms": 3000.0})
    deadline = time.monotonic() + 0.1
    with pytest.raises(ProviderError) as caught:
        await adapter(max_attempts=5).get_auth_state(ref("sim-slow-"), deadline=deadline)
    assert triple(caught.value) == UNAVAILABLE
    assert caught.value.transient
    # Well before the 3 s answer, with room for a loaded machine (0.5 s was within a stall).
    assert time.monotonic() < deadline + 2.0
    assert sim.stats()["state_calls"] == 1


async def test_circuit_opens_then_half_opens(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    hooks = Hooks()
    breaker = CircuitBreaker(threshold=3, reset_s=10.0, clock=CLOCK)
    provider = adapter(max_attempts=1, breaker=breaker, on_call=hooks.on_call)
    down, healthy = ref("sim-unavailable-"), ref()
    for _ in range(3):
        with pytest.raises(ProviderError):
            await provider.get_auth_state(down)
    assert state(breaker) == "open"

    # Open: refused without calling the provider.
    with pytest.raises(ProviderError) as caught:
        await provider.get_auth_state(healthy)
    assert triple(caught.value) == UNAVAILABLE
    assert caught.value.transient
    assert sim.stats()["state_calls"] == 3
    assert hooks.calls[-1] == ("simulator", "get_auth_state", "circuit_open")

    # Half-open: a failed probe opens it again.
    CLOCK.now += 10.0
    assert state(breaker) == "half_open"
    with pytest.raises(ProviderError):
        await provider.get_auth_state(down)
    assert state(breaker) == "open"
    assert sim.stats()["state_calls"] == 4

    # Half-open: a successful probe closes it.
    CLOCK.now += 10.0
    assert (await provider.get_auth_state(healthy)).status == "passkey_confirmation"
    assert state(breaker) == "closed"
    assert (await provider.get_auth_state(healthy)).status == "passkey_confirmation"
    assert sim.stats()["state_calls"] == 6


async def test_business_errors_do_not_open_the_circuit(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    breaker = CircuitBreaker(threshold=1, reset_s=10.0, clock=CLOCK)
    provider = adapter(breaker=breaker)
    for _ in range(3):
        with pytest.raises(ProviderError):
            await provider.get_auth_state(ref("sim-mismatch-"))
    assert state(breaker) == "closed"


async def test_cancelled_probe_frees_the_half_open_slot(
    adapter: AdapterFactory, sim: ProviderSimulator
) -> None:
    sim.configure({"slow_ms": 1_000.0})
    breaker = CircuitBreaker(threshold=1, reset_s=10.0, clock=CLOCK)
    provider = adapter(max_attempts=1, breaker=breaker)
    with pytest.raises(ProviderError):
        await provider.get_auth_state(ref("sim-unavailable-"))
    CLOCK.now += 10.0
    probe = asyncio.create_task(provider.get_auth_state(ref("sim-slow-")))
    await asyncio.sleep(0)  # the probe takes the slot before its first await
    assert not breaker.allow()  # ... and holds it while in flight
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert (await provider.get_auth_state(ref())).status == "passkey_confirmation"
    assert state(breaker) == "closed"


async def test_connection_refused_is_unavailable_after_retries(client: ProviderHttpClient) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    hooks = Hooks()
    provider = HttpProviderAdapter(
        "down",
        f"http://127.0.0.1:{port}",
        client,
        max_attempts=3,
        backoff_base_s=0.001,
        backoff_max_s=0.002,
        on_retry=hooks.on_retry,
    )
    with pytest.raises(ProviderError) as caught:
        await provider.confirm_passkey(ref(), idempotency_key="k")
    assert triple(caught.value) == UNAVAILABLE
    assert caught.value.transient
    assert len(hooks.retries) == 2


# -- answers the simulator never gives: a scripted provider on a loopback socket --------------


@pytest.fixture
async def scripted() -> AsyncIterator[HostileProvider]:
    async with HostileProvider() as provider:
        yield provider


@pytest.fixture
async def mock_adapter(
    scripted: HostileProvider,
) -> AsyncIterator[Callable[..., HttpProviderAdapter]]:
    """An adapter on its own client, against ``scripted`` answering with the scripts given."""
    async with ProviderHttpClient(timeout_s=2.0, max_connections=4) as client:

        def make(*answers: bytes | Script, **kwargs: Any) -> HttpProviderAdapter:
            scripted.script = in_turn(*(written(a) if isinstance(a, bytes) else a for a in answers))
            kwargs.setdefault("backoff_base_s", 0.001)
            kwargs.setdefault("backoff_max_s", 0.002)
            return HttpProviderAdapter("mock", f"{scripted.url}/base/", client, **kwargs)

        yield make


MockAdapter = Callable[..., HttpProviderAdapter]
STATE_S = json_answer(b"200 OK", {"status": "s", "auth_status": "s"})


async def test_confirm_request_on_the_wire(
    mock_adapter: MockAdapter, scripted: HostileProvider
) -> None:
    provider = mock_adapter(json_answer(b"200 OK", {"status": "s", "auth_status": "a", "x": 1}))
    state = await provider.confirm_passkey("a b/c", idempotency_key="cmd-1")
    await provider.get_auth_state("a b/c")
    assert (state.status, state.auth_status) == ("s", "a")
    confirm, read = (head.decode().lower().split("\r\n") for head in scripted.heads)
    assert confirm[0] == "post /base/v1/accounts/a%20b%2fc/passkey/confirm http/1.1"
    assert "idempotency-key: cmd-1" in confirm
    assert not any(f.startswith("content-length:") and f != "content-length: 0" for f in confirm)
    assert read[0] == "get /base/v1/accounts/a%20b%2fc/auth-state http/1.1"
    assert not any(f.startswith("idempotency-key:") for f in read)


@pytest.mark.parametrize(
    "answer",
    [
        http(b"200 OK", b"<html>gateway</html>"),
        json_answer(b"200 OK", {"status": "authorized"}),
        json_answer(b"200 OK", {"status": "", "auth_status": "x"}),
        json_answer(b"200 OK", ["authorized"]),
        json_answer(b"201 Created", {"status": 1, "auth_status": 2}),
        http(b"404 Not Found", b"not here"),
        json_answer(b"422 Unprocessable", {"error": {"type": "operation_failed"}}),
        http(b"302 Found", b"", b"Location: http://127.0.0.1:9/elsewhere"),
    ],
)
async def test_unusable_answers_are_operation_failures_without_retry(
    mock_adapter: MockAdapter, scripted: HostileProvider, answer: bytes
) -> None:
    provider = mock_adapter(answer, max_attempts=4)
    with pytest.raises(ProviderError) as caught:
        await provider.get_auth_state("acct")
    assert triple(caught.value) == OPERATION_FAILED
    assert not caught.value.transient
    assert len(scripted.requests) == 1  # a redirect is not followed either


async def test_retry_after_is_honoured_instead_of_backoff(
    mock_adapter: MockAdapter, scripted: HostileProvider
) -> None:
    # Backoff would wait 10 s, past the deadline; Retry-After: 0 lets the retries run now.
    provider = mock_adapter(
        http(b"429 Slow", b"", b"Retry-After: 0"),
        http(b"503 Busy", b"", b"retry-after: 0"),
        STATE_S,
        backoff_base_s=10.0,
        backoff_max_s=10.0,
        rng=CeilingRandom(),
    )
    state = await provider.get_auth_state("acct", deadline=time.monotonic() + 5.0)
    assert state.status == "s"
    assert len(scripted.requests) == 3


async def test_retry_after_beyond_the_bound_stops_retrying(
    mock_adapter: MockAdapter, scripted: HostileProvider
) -> None:
    provider = mock_adapter(http(b"503 Busy", b"", b"Retry-After: 3600"), max_attempts=4)
    with pytest.raises(ProviderError) as caught:
        await provider.get_auth_state("acct")
    assert triple(caught.value) == UNAVAILABLE
    assert caught.value.retry_after == 3600
    assert len(scripted.requests) == 1


async def stall(writer: asyncio.StreamWriter) -> None:
    """No answer within the client's read timeout (2 s); bounded, the server cancels it."""
    await asyncio.sleep(5)


async def hang_up(writer: asyncio.StreamWriter) -> None:
    """The connection closes with no answer at all."""


@pytest.mark.timeout(30)
async def test_transport_failures_are_retried(
    mock_adapter: MockAdapter, scripted: HostileProvider
) -> None:
    provider = mock_adapter(stall, hang_up, STATE_S, max_attempts=3)
    assert (await provider.get_auth_state("acct")).status == "s"
    assert len(scripted.requests) == 3


async def test_missing_ref_or_key_is_rejected_before_sending(
    mock_adapter: MockAdapter, scripted: HostileProvider
) -> None:
    provider = mock_adapter(STATE_S)
    for call in (
        provider.get_auth_state(""),
        provider.confirm_passkey("", idempotency_key="k"),
        provider.confirm_passkey("acct", idempotency_key=""),
    ):
        with pytest.raises(ProviderError) as caught:
            await call
        assert triple(caught.value) == ("provider_invalid_request", 30001, 400)
    assert scripted.requests == []


# -- client and registry ---------------------------------------------------------------------------


async def test_build_http_client_uses_settings() -> None:
    settings = Settings(
        provider_timeout_s=1.5, provider_max_connections=7, provider_body_cap_bytes=4096
    )
    async with build_http_client(settings) as built:
        assert (built.timeout_s, built.connect_timeout_s) == (1.5, 1.5)
        assert (built.max_connections, built.body_cap) == (7, 4096)
        assert built.headers["User-Agent"].startswith("passkey-auth-worker/")
    assert built.is_closed


async def test_registry_from_provider_urls(client: ProviderHttpClient) -> None:
    settings = Settings(
        provider_urls={"simulator": "http://127.0.0.1:8090", "other": "https://p.example/api/"},
        provider_max_attempts=2,
        provider_breaker_threshold=9,
    )
    registry = build_registry(settings, client)
    assert sorted(registry) == ["other", "simulator"]
    assert "simulator" in registry
    assert registry.get("missing") is None
    other = registry["other"]
    assert isinstance(other, HttpProviderAdapter)
    assert (other.name, other.base_url, other.policy.max_attempts) == (
        "other",
        "https://p.example/api",
        2,
    )
    simulator = registry["simulator"]
    assert isinstance(simulator, HttpProviderAdapter)
    assert other.breaker is not None
    assert simulator.breaker is not None
    assert other.breaker is not simulator.breaker  # one provider down never trips another
    assert other.breaker.threshold == 9
    await registry.aclose()
    assert not client.is_closed  # the shared client is the caller's


async def test_registry_holds_any_adapter_and_rejects_duplicates() -> None:
    bench: ProviderAdapter = in_process_provider(name="bench")
    registry = ProviderRegistry([bench])
    assert registry.get("bench") is bench
    assert len(registry) == 1
    with pytest.raises(ValueError, match="bench"):
        ProviderRegistry([bench, in_process_provider(name="bench")])
    await registry.aclose()
