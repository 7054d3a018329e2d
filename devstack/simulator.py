"""The provider simulator: a stand-in provider for the dev stack, the tests and the benchmark.

It serves exactly the HTTP adapter's wire contract (see ``worker.auth.provider.http``), so the
adapter is tested against real HTTP, and faults are scripted per account by the
``provider_account_ref`` prefix, so a test or a demo picks a failure by naming an account:

    sim-unavailable-   every call 503 (transient)       sim-mismatch-  409 identity_mismatch
    sim-invalid-       400 invalid_request              sim-unsupported-  confirm 501
    sim-fail-          confirm accepted, flow ends failed
    sim-slow-          extra latency (``slow_ms``)      anything else  succeeds, then authorized

Flow per account ref: never seen → ``passkey_confirmation`` (a challenge is pending); a
successful confirm → ``passkey_confirmation_sent``, which becomes ``authorized`` (``failed``
for sim-fail-) ``authorize_delay_s`` later.

Idempotency follows the Idempotency-Key draft: a completed answer (2xx or 4xx/501) is stored
per key and returned again, same status and body, with no second effect; transient 503s are
not stored, so a retry with the same key can still succeed. Every call is counted, so tests
can check "two calls, one effect" through ``GET /_sim/stats``; the stats also keep the last
W3C ``traceparent`` received per idempotency key (``confirm_traceparents``), so a test can
check that the worker's trace reaches the provider.

Knobs (latency median and jitter, error rate, authorize delay, slow latency, ``fail_next``:
answer the next N calls 503) start from settings and change at run time via
``POST /_sim/config``; ``POST /_sim/reset`` forgets accounts, keys and counters.

Credentials: given a token (``SIMULATOR_TOKEN``), every provider call must carry it, as
``Authorization: Bearer <token>`` or, with ``SIMULATOR_AUTH_HEADER`` set to another header, as
that header's bare value (what ``PROVIDER_<NAME>_TOKEN`` / ``_AUTH_HEADER`` send); a call
without it answers 401 ``{"error": {"type": "unauthorized"}}`` and is counted in
``unauthorized_calls``, with no effect. The dev stack configures both sides, so every call of
``make run`` and of the tests that give a token proves the worker sends its credential.

``ProviderSimulator`` holds the behaviour without any transport; the Starlette app and the
``InProcessTransport`` (the benchmark's provider, the HTTP adapter with no sockets below it)
are two thin fronts on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypedDict
from urllib.parse import unquote, urlsplit

import structlog
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.auth.provider.answer import ProviderAnswer
from worker.auth.provider.http import HttpProviderAdapter
from worker.runtime.serving import serving

if TYPE_CHECKING:
    from devstack.settings import DevSettings
    from worker.settings import Settings

__all__ = [
    "IN_PROCESS_BASE_URL",
    "InProcessTransport",
    "ProviderSimulator",
    "SimReply",
    "SimStats",
    "SimulatorKnobs",
    "build_simulator_app",
    "in_process_provider",
    "running_simulator",
    "serve_simulator",
]

log = structlog.get_logger(__name__)

PENDING: Final = "passkey_confirmation"
SENT: Final = "passkey_confirmation_sent"
AUTHORIZED: Final = "authorized"
FAILED: Final = "failed"


@dataclass(frozen=True, slots=True)
class SimReply:
    """One answer of the simulated provider: HTTP status and JSON body."""

    status_code: int
    body: Mapping[str, object]


def _state(status: str) -> SimReply:
    return SimReply(200, {"status": status, "auth_status": status})


def _error(status_code: int, kind: str, message: str) -> SimReply:
    return SimReply(status_code, {"error": {"type": kind, "message": message}})


# Replies are immutable and shared: the benchmark makes millions of them.
_REPLY_STATE: Final = {s: _state(s) for s in (PENDING, SENT, AUTHORIZED, FAILED)}
_UNAVAILABLE: Final = _error(503, "unavailable", "The provider is temporarily unavailable.")
_MISMATCH: Final = _error(409, "identity_mismatch", "The account identity does not match.")
_INVALID: Final = _error(400, "invalid_request", "The provider rejected the request data.")
_UNSUPPORTED: Final = _error(501, "unsupported_operation", "Passkey confirmation unsupported.")
_NO_KEY: Final = _error(400, "invalid_request", "The Idempotency-Key header is required.")
_KEY_REUSED: Final = _error(
    422, "invalid_request", "The Idempotency-Key was used for another account."
)
_NOT_PENDING: Final = _error(422, "operation_failed", "No passkey challenge is pending.")
_UNAUTHORIZED: Final = _error(401, "unauthorized", "Missing or wrong credentials.")


class SimulatorKnobs(BaseModel):
    """The run-time knobs; ``POST /_sim/config`` validates a partial update against this."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_ms: float = Field(default=20.0, ge=0, description="median latency of every call")
    jitter_ms: float = Field(default=5.0, ge=0, description="std deviation around the median")
    error_rate: float = Field(default=0.0, ge=0, le=1, description="fraction answered 503")
    authorize_delay_s: float = Field(default=2.0, ge=0, description="sent → authorized/failed")
    slow_ms: float = Field(default=300.0, ge=0, description="extra latency for sim-slow- refs")
    fail_next: int = Field(default=0, ge=0, description="answer the next N calls 503")


class SimStats(TypedDict):
    """``GET /_sim/stats``: calls and effects per idempotency key (effects are 0 or 1)."""

    confirm_calls: dict[str, int]
    confirm_effects: dict[str, int]
    confirm_traceparents: dict[str, str]
    state_calls: int
    total_calls: int
    unauthorized_calls: int


@dataclass(slots=True)
class _Account:
    settles_at: float
    final: str


@dataclass(slots=True)
class _Counters:
    confirm_calls: dict[str, int] = field(default_factory=dict)
    confirm_effects: dict[str, int] = field(default_factory=dict)
    confirm_traceparents: dict[str, str] = field(default_factory=dict)
    state_calls: int = 0
    total_calls: int = 0
    unauthorized_calls: int = 0


class ProviderSimulator:
    """The simulated provider's behaviour and state, transport-free.

    Each call sleeps its latency first and then decides without awaiting, so concurrent calls
    with one idempotency key cannot both take effect. ``clock`` drives only the authorize
    delay (tests advance it instead of sleeping); ``rng`` drives latency and error rate.
    ``token`` makes every call present it in ``auth_header`` (``admits``).
    """

    def __init__(
        self,
        *,
        latency_ms: float = 20.0,
        jitter_ms: float = 5.0,
        error_rate: float = 0.0,
        authorize_delay_s: float = 2.0,
        slow_ms: float = 300.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        token: SecretStr | None = None,
        auth_header: str = "Authorization",
    ) -> None:
        self.auth_header = auth_header
        self._expected: bytes | None = None
        if token is not None:
            value = token.get_secret_value()
            bearer = auth_header.lower() == "authorization"
            self._expected = (f"Bearer {value}" if bearer else value).encode()
        self.knobs = SimulatorKnobs(
            latency_ms=latency_ms,
            jitter_ms=jitter_ms,
            error_rate=error_rate,
            authorize_delay_s=authorize_delay_s,
            slow_ms=slow_ms,
        )
        self._rng = rng or random.Random()
        self._clock = clock
        self._accounts: dict[str, _Account] = {}
        self._replies: dict[str, tuple[str, SimReply]] = {}
        self._counters = _Counters()

    @classmethod
    def from_settings(
        cls,
        settings: DevSettings,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> ProviderSimulator:
        return cls(
            latency_ms=settings.simulator_latency_ms,
            jitter_ms=settings.simulator_jitter_ms,
            error_rate=settings.simulator_error_rate,
            authorize_delay_s=settings.simulator_authorize_delay_s,
            slow_ms=settings.simulator_slow_ms,
            rng=rng,
            clock=clock,
            token=settings.simulator_token,
            auth_header=settings.simulator_auth_header,
        )

    # -- control -------------------------------------------------------------------------------

    def configure(self, changes: Mapping[str, Any]) -> SimulatorKnobs:
        """Apply a partial update of the knobs (raises pydantic ``ValidationError``)."""
        self.knobs = SimulatorKnobs.model_validate({**self.knobs.model_dump(), **changes})
        return self.knobs

    def reset(self) -> None:
        """Forget accounts, stored answers and counters; the knobs stay as they are."""
        self._accounts.clear()
        self._replies.clear()
        self._counters = _Counters()

    def stats(self) -> SimStats:
        c = self._counters
        return {
            "confirm_calls": dict(c.confirm_calls),
            "confirm_effects": dict(c.confirm_effects),
            "confirm_traceparents": dict(c.confirm_traceparents),
            "state_calls": c.state_calls,
            "total_calls": c.total_calls,
            "unauthorized_calls": c.unauthorized_calls,
        }

    def admits(self, presented: str | None) -> SimReply | None:
        """None when the call may proceed; the 401 to answer when a token is required and
        ``presented`` (the value of ``auth_header``) is not it."""
        if self._expected is None:
            return None
        if presented is not None and hmac.compare_digest(presented.encode(), self._expected):
            return None
        self._counters.unauthorized_calls += 1
        return _UNAUTHORIZED

    # -- the two provider operations -----------------------------------------------------------

    async def confirm(
        self, ref: str, idempotency_key: str | None, traceparent: str | None = None
    ) -> SimReply:
        """``POST /v1/accounts/{ref}/passkey/confirm``."""
        counters = self._counters
        counters.total_calls += 1
        if idempotency_key:
            calls = counters.confirm_calls
            calls[idempotency_key] = calls.get(idempotency_key, 0) + 1
            counters.confirm_effects.setdefault(idempotency_key, 0)
            if traceparent:
                counters.confirm_traceparents[idempotency_key] = traceparent
        await self._latency(ref)
        if not idempotency_key:
            return _NO_KEY
        fault = self._transient_fault(ref)
        if fault is not None:
            return fault
        stored = self._replies.get(idempotency_key)
        if stored is not None:
            stored_ref, reply = stored
            return reply if stored_ref == ref else _KEY_REUSED
        reply = self._confirm_once(ref, idempotency_key)
        self._replies[idempotency_key] = (ref, reply)
        return reply

    async def auth_state(self, ref: str) -> SimReply:
        """``GET /v1/accounts/{ref}/auth-state``."""
        self._counters.total_calls += 1
        self._counters.state_calls += 1
        await self._latency(ref)
        fault = self._transient_fault(ref) or self._identity_fault(ref)
        if fault is not None:
            return fault
        return _REPLY_STATE[self._status(ref)]

    # -- internals -----------------------------------------------------------------------------

    def _confirm_once(self, ref: str, idempotency_key: str) -> SimReply:
        fault = self._identity_fault(ref)
        if fault is not None:
            return fault
        if ref.startswith("sim-unsupported-"):
            return _UNSUPPORTED
        status = self._status(ref)
        if status == PENDING:
            final = FAILED if ref.startswith("sim-fail-") else AUTHORIZED
            self._accounts[ref] = _Account(self._clock() + self.knobs.authorize_delay_s, final)
            self._counters.confirm_effects[idempotency_key] = 1
            return _REPLY_STATE[SENT]
        if status == SENT:
            return _REPLY_STATE[SENT]  # already confirmed under another key: no new effect
        return _NOT_PENDING

    def _status(self, ref: str) -> str:
        account = self._accounts.get(ref)
        if account is None:
            return PENDING
        return account.final if self._clock() >= account.settles_at else SENT

    def _identity_fault(self, ref: str) -> SimReply | None:
        if ref.startswith("sim-mismatch-"):
            return _MISMATCH
        if ref.startswith("sim-invalid-"):
            return _INVALID
        return None

    def _transient_fault(self, ref: str) -> SimReply | None:
        knobs = self.knobs
        if ref.startswith("sim-unavailable-"):
            return _UNAVAILABLE
        if knobs.fail_next > 0:
            self.knobs = knobs.model_copy(update={"fail_next": knobs.fail_next - 1})
            return _UNAVAILABLE
        if knobs.error_rate > 0 and self._rng.random() < knobs.error_rate:
            return _UNAVAILABLE
        return None

    def sample_latency_s(self, ref: str) -> float:
        """One call's latency: normal around the median, clipped at zero (so the median stays
        the median), plus ``slow_ms`` for sim-slow- refs."""
        knobs = self.knobs
        ms = knobs.latency_ms
        if knobs.jitter_ms > 0:
            ms = max(0.0, self._rng.gauss(ms, knobs.jitter_ms))
        if ref.startswith("sim-slow-"):
            ms += knobs.slow_ms
        return ms / 1000.0

    async def _latency(self, ref: str) -> None:
        delay = self.sample_latency_s(ref)
        if delay > 0:
            await asyncio.sleep(delay)


# -- HTTP front ----------------------------------------------------------------------------------


def build_simulator_app(
    settings: DevSettings | None = None, *, simulator: ProviderSimulator | None = None
) -> Starlette:
    """The simulator as an ASGI app; ``app.state.simulator`` is the behaviour behind it."""
    if simulator is not None:
        sim = simulator
    elif settings is not None:
        sim = ProviderSimulator.from_settings(settings)
    else:
        sim = ProviderSimulator()

    def reply(r: SimReply) -> Response:
        return JSONResponse(r.body, status_code=r.status_code)

    async def confirm(request: Request) -> Response:
        refused = sim.admits(request.headers.get(sim.auth_header))
        if refused is not None:
            return reply(refused)
        ref = request.path_params["ref"]
        return reply(
            await sim.confirm(
                ref, request.headers.get("idempotency-key"), request.headers.get("traceparent")
            )
        )

    async def auth_state(request: Request) -> Response:
        refused = sim.admits(request.headers.get(sim.auth_header))
        if refused is not None:
            return reply(refused)
        return reply(await sim.auth_state(request.path_params["ref"]))

    async def config(request: Request) -> Response:
        if request.method == "POST":
            try:
                changes = json.loads(await request.body() or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("the body must be a JSON object")
                sim.configure(changes)
            except (ValueError, ValidationError) as exc:
                return reply(_error(400, "invalid_request", str(exc)))
        return JSONResponse(sim.knobs.model_dump())

    async def stats(_: Request) -> Response:
        return JSONResponse(sim.stats())

    async def reset(_: Request) -> Response:
        sim.reset()
        return Response(status_code=204)

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def http_error(_: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        kind = {404: "not_found", 405: "method_not_allowed"}.get(code, "internal_error")
        return reply(_error(code, kind, kind.replace("_", " ")))

    app = Starlette(
        routes=[
            Route("/v1/accounts/{ref}/passkey/confirm", confirm, methods=["POST"]),
            Route("/v1/accounts/{ref}/auth-state", auth_state, methods=["GET"]),
            Route("/_sim/config", config, methods=["GET", "POST"]),
            Route("/_sim/stats", stats, methods=["GET"]),
            Route("/_sim/reset", reset, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )
    app.state.simulator = sim
    return app


@contextlib.asynccontextmanager
async def running_simulator(
    simulator: ProviderSimulator, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve ``simulator`` over HTTP while the block runs; yields its base URL.

    ``port=0`` picks a free port (tests); a busy port fails loudly in the caller.
    """
    app = build_simulator_app(simulator=simulator)
    async with serving(app, host=host, port=port, name="provider-simulator") as url:
        yield url


async def serve_simulator(
    settings: DevSettings, *, simulator: ProviderSimulator | None = None
) -> None:
    """Run the simulator on ``SIMULATOR_HOST:SIMULATOR_PORT`` until cancelled."""
    sim = simulator or ProviderSimulator.from_settings(settings)
    async with running_simulator(
        sim, host=settings.simulator_host, port=settings.simulator_port
    ) as url:
        log.info("simulator_started", url=url, **sim.knobs.model_dump())
        await asyncio.Event().wait()


# -- in-process transport -----------------------------------------------------------------------

IN_PROCESS_BASE_URL: Final = "http://simulator.in-process"
"""Base URL of an adapter on ``InProcessTransport``; never resolved, only routed."""

_ACCOUNT_PREFIX: Final = "/v1/accounts/"
_NOT_FOUND: Final = _error(404, "not_found", "not found")
_JSON_HEADERS: Final = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json"}))


class InProcessTransport:
    """The adapter's ``Requester`` seam answered by a ``ProviderSimulator`` in this process.

    The one HTTP adapter (retries, breaker, error mapping) runs unchanged on top; only sockets
    and HTTP parsing are left out, so the benchmark can measure the worker without the loopback
    stack. Routes are the simulator's wire contract (see ``worker.auth.provider.http``).
    """

    def __init__(self, simulator: ProviderSimulator) -> None:
        self.simulator = simulator

    async def request(
        self, method: str, url: str, *, headers: dict[str, str] | None = None
    ) -> ProviderAnswer:
        reply = await self._route(method, urlsplit(url).path, headers or {})
        body = json.dumps(reply.body, separators=(",", ":")).encode()  # as JSONResponse sends
        return ProviderAnswer(reply.status_code, body, _JSON_HEADERS)

    async def _route(self, method: str, path: str, headers: dict[str, str]) -> SimReply:
        if not path.startswith(_ACCOUNT_PREFIX):
            return _NOT_FOUND
        wanted = self.simulator.auth_header.lower()
        refused = self.simulator.admits(
            next((v for k, v in headers.items() if k.lower() == wanted), None)
        )
        if refused is not None:
            return refused
        ref, _, operation = path[len(_ACCOUNT_PREFIX) :].partition("/")
        ref = unquote(ref)
        if method == "POST" and operation == "passkey/confirm":
            key = next((v for k, v in headers.items() if k.lower() == "idempotency-key"), None)
            return await self.simulator.confirm(ref, key, headers.get("traceparent"))
        if method == "GET" and operation == "auth-state":
            return await self.simulator.auth_state(ref)
        return _NOT_FOUND


def in_process_provider(
    simulator: ProviderSimulator | None = None,
    *,
    name: str = "simulator",
    settings: Settings | None = None,
    **adapter_options: Any,
) -> HttpProviderAdapter:
    """The HTTP adapter on an ``InProcessTransport``: with ``settings``, its retry, breaker and
    concurrency knobs come from them (as ``build_registry`` does); otherwise from
    ``adapter_options`` (``HttpProviderAdapter``'s keywords)."""
    transport = InProcessTransport(simulator or ProviderSimulator())
    if settings is not None:
        return HttpProviderAdapter.from_settings(
            name, IN_PROCESS_BASE_URL, transport, settings, **adapter_options
        )
    return HttpProviderAdapter(name, IN_PROCESS_BASE_URL, transport, **adapter_options)
