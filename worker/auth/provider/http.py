"""The HTTP provider adapter, on one client shared by every adapter (docs/architecture.md, "The
provider's wire contract"); it writes each attempt's CLIENT span itself, so a process that exports
nothing pays no span."""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote, urlsplit

from opentelemetry.trace import SpanKind, Status, StatusCode

from worker import __version__
from worker.auth.provider.answer import ProviderAnswer, load_json
from worker.auth.provider.base import CallObserver, ProviderAuthState, ProviderError, RetryObserver
from worker.auth.provider.breaker import CircuitBreaker
from worker.auth.provider.credentials import Credential
from worker.auth.provider.errors import invalid_call, map_unexpected, map_upstream_failure
from worker.auth.provider.failures import TransportFailure
from worker.auth.provider.retry import RetryPolicy, call_with_retries
from worker.auth.provider.transport import ProviderHttpClient
from worker.runtime import tracing
from worker.runtime.logs import get_logger

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = [
    "HttpProviderAdapter",
    "Requester",
    "build_http_client",
    "parse_auth_state",
]

log = get_logger(__name__)


_CONFIRM_PATH = "/v1/accounts/{ref}/passkey/confirm"
_STATE_PATH = "/v1/accounts/{ref}/auth-state"


class Requester(Protocol):
    """What an adapter needs of its HTTP client: ``ProviderHttpClient``, or the simulator's
    in-process stand-in. An answer is bounded before it is returned; a request that gets
    none raises ``TransportFailure``."""

    async def request(
        self, method: str, url: str, *, headers: dict[str, str] | None = None
    ) -> ProviderAnswer: ...


def build_http_client(
    settings: Settings,
    *,
    tls: ssl.SSLContext | None = None,
    timeout_s: float | None = None,
    connect_timeout_s: float | None = None,
) -> ProviderHttpClient:
    """The process-wide provider client (``PROVIDER_TIMEOUT_S`` per phase,
    ``PROVIDER_MAX_CONNECTIONS``, ``PROVIDER_BODY_CAP_BYTES``); a provider with TLS material or
    timeouts of its own (``PROVIDER_<NAME>_*``) gets one of its own with these replaced."""
    read_s = settings.provider_timeout_s if timeout_s is None else timeout_s
    return ProviderHttpClient(
        timeout_s=read_s,
        connect_timeout_s=read_s if connect_timeout_s is None else connect_timeout_s,
        max_connections=settings.provider_max_connections,
        headers={"User-Agent": f"passkey-auth-worker/{__version__}"},
        body_cap=settings.provider_body_cap_bytes,
        tls=tls,
    )


def parse_auth_state(answer: ProviderAnswer) -> ProviderAuthState:
    """The auth state in a 2xx answer; anything else raises the mapped ``ProviderError``."""
    if answer.ok:
        state = _auth_state(load_json(answer.body))
        if state is not None:
            return state
    raise map_upstream_failure(answer)


def _auth_state(body: object) -> ProviderAuthState | None:
    if isinstance(body, dict):
        status, auth_status = body.get("status"), body.get("auth_status")
        if isinstance(status, str) and status and isinstance(auth_status, str) and auth_status:
            return ProviderAuthState(status=status, auth_status=auth_status)
    return None


def _host_port(url: str) -> tuple[str, int | None]:
    """Host and port for the CLIENT span; a malformed URL fails at the call, not here."""
    try:
        parts = urlsplit(url)
        return parts.hostname or "", parts.port
    except ValueError:
        return "", None


class HttpProviderAdapter:
    """A provider reached over HTTP: bounded retries, deadline, circuit breaker, error mapping.
    Each retry keyword given overrides that field of ``policy``, so a test can change one knob;
    ``on_call``/``on_retry`` are metric hooks, so this module needs no registry."""

    def __init__(
        self,
        name: str,
        base_url: str,
        client: Requester,
        *,
        policy: RetryPolicy | None = None,
        max_attempts: int | None = None,
        backoff_base_s: float | None = None,
        backoff_max_s: float | None = None,
        retry_after_max_s: float | None = None,
        breaker: CircuitBreaker | None = None,
        on_call: CallObserver | None = None,
        on_retry: RetryObserver | None = None,
        rng: random.Random | None = None,
        max_concurrency: int | None = None,
        credential: Credential | None = None,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        base = policy or RetryPolicy()
        self.policy = RetryPolicy(
            max_attempts=base.max_attempts if max_attempts is None else max_attempts,
            backoff_base_s=base.backoff_base_s if backoff_base_s is None else backoff_base_s,
            backoff_max_s=base.backoff_max_s if backoff_max_s is None else backoff_max_s,
            retry_after_max_s=(
                base.retry_after_max_s if retry_after_max_s is None else retry_after_max_s
            ),
        )
        self.breaker = breaker
        self._client = client
        self._credential = credential
        self._host, self._port = _host_port(self.base_url)
        self._on_call = on_call
        self._on_retry = on_retry
        self._rng = rng
        # At most as many requests in flight as the pool has connections: requests beyond
        # that wait here, on a semaphore, rather than queue inside the client's pool.
        self._gate: contextlib.AbstractAsyncContextManager[object] = (
            asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
        )

    @classmethod
    def from_settings(
        cls,
        name: str,
        base_url: str,
        client: Requester,
        settings: Settings,
        *,
        on_call: CallObserver | None = None,
        on_retry: RetryObserver | None = None,
        credential: Credential | None = None,
    ) -> HttpProviderAdapter:
        """An adapter with the retry and breaker knobs of ``settings``."""
        return cls(
            name,
            base_url,
            client,
            policy=RetryPolicy.from_settings(settings),
            breaker=CircuitBreaker(
                settings.provider_breaker_threshold, settings.provider_breaker_reset_s
            ),
            on_call=on_call,
            on_retry=on_retry,
            max_concurrency=settings.provider_max_connections,
            credential=credential,
        )

    async def confirm_passkey(
        self, account_ref: str, *, idempotency_key: str, deadline: float | None = None
    ) -> ProviderAuthState:
        if not idempotency_key:
            raise invalid_call("An idempotency key is required to confirm a passkey.")
        url = f"{self._account_url(account_ref)}/passkey/confirm"
        headers = {"Idempotency-Key": idempotency_key, "Accept": "application/json"}
        return await self._call("confirm_passkey", "POST", url, headers, deadline, _CONFIRM_PATH)

    async def get_auth_state(
        self, account_ref: str, *, deadline: float | None = None
    ) -> ProviderAuthState:
        url = f"{self._account_url(account_ref)}/auth-state"
        return await self._call(
            "get_auth_state", "GET", url, {"Accept": "application/json"}, deadline, _STATE_PATH
        )

    async def aclose(self) -> None:
        """Nothing to release: the shared client belongs to whoever built it."""

    def _account_url(self, account_ref: str) -> str:
        if not account_ref:
            raise invalid_call("The account has no provider account reference.")
        return f"{self.base_url}/v1/accounts/{quote(account_ref, safe='')}"

    async def _call(
        self,
        operation: str,
        method: str,
        url: str,
        headers: dict[str, str],
        deadline: float | None,
        template: str,
    ) -> ProviderAuthState:
        attempts = 0

        async def attempt() -> ProviderAuthState:
            nonlocal attempts
            attempts += 1
            with tracing.span(
                f"{method} {template}",
                kind=SpanKind.CLIENT,
                attributes=self._span_attributes(operation, method, template, attempts),
            ) as client_span:
                try:  # one request and its answer read
                    sent = {**headers, **tracing.http_headers()}
                    if self._credential is not None:
                        sent.update(self._credential.headers())
                    async with self._gate:
                        answer = await self._client.request(method, url, headers=sent)
                    if client_span.is_recording():
                        client_span.set_attribute("http.response.status_code", answer.status)
                        if answer.status >= 400:
                            client_span.set_attribute("error.type", str(answer.status))
                            client_span.set_status(Status(StatusCode.ERROR))
                    return parse_auth_state(answer)
                except ProviderError:
                    raise
                except Exception as exc:
                    # Nothing but a catalogued error leaves an attempt, whatever the answer
                    # broke: the confirm and the follow-up poll catch ProviderError only.
                    if client_span.is_recording():
                        client_span.set_attribute("error.type", type(exc).__name__)
                        client_span.set_status(Status(StatusCode.ERROR))
                    if not isinstance(exc, TransportFailure | TimeoutError):
                        log.warning(
                            "provider_answer_unusable",
                            provider=self.name,
                            operation=operation,
                            error=type(exc).__name__,
                        )
                    raise map_unexpected(exc) from exc

        try:
            return await call_with_retries(
                attempt,
                provider=self.name,
                operation=operation,
                policy=self.policy,
                deadline=deadline,
                breaker=self.breaker,
                rng=self._rng,
                on_call=self._on_call,
                on_retry=self._on_retry,
            )
        except ProviderError:
            raise
        except Exception as exc:  # a metric hook or the breaker: still the call's failure
            raise map_unexpected(exc) from exc

    def _span_attributes(
        self, operation: str, method: str, template: str, attempt: int
    ) -> dict[str, str | int] | None:
        """The CLIENT span's attributes; none are built when nothing is recorded. The URL is
        the template: the account's provider reference stays out of the span."""
        if not tracing.recording():
            return None
        attributes: dict[str, str | int] = {
            "http.request.method": method,
            "url.template": template,
            "server.address": self._host,
            "passkey.provider": self.name,
            "passkey.provider.operation": operation,
        }
        if self._port is not None:
            attributes["server.port"] = self._port
        if attempt > 1:
            attributes["http.request.resend_count"] = attempt - 1
        return attributes

    def __repr__(self) -> str:
        return f"HttpProviderAdapter({self.name!r}, {self.base_url!r})"
