"""The HTTP provider adapter, on one shared client (``AiohttpClient``, or ``ShardedClient`` of
httpx clients).

Wire contract (what a real provider's gateway must speak, and what the development
simulator, ``devstack.simulator``, serves):

    POST {base}/v1/accounts/{ref}/passkey/confirm   header Idempotency-Key: <command_id>
    GET  {base}/v1/accounts/{ref}/auth-state
      200 {"status": str, "auth_status": str}
      4xx/5xx {"error": {"type": str, "message": str}}, Retry-After honoured on 429/503

The client is built once at start-up (``build_http_client``) and shared by every adapter, so
connections are pooled across providers and commands; adapters never close it. Both clients
bound every answer (``worker.provider.answer``: ``PROVIDER_BODY_CAP_BYTES`` read and
decompressed, JSON depth), and an attempt raises nothing but a catalogued ``ProviderError``:
whatever a provider sends, the confirm and the follow-up poll get an auth state or an error.

Each attempt is a CLIENT span (``worker.tracing``) and sends the W3C ``traceparent`` (and
``tracestate``): written here, at the adapter, rather than by instrumenting aiohttp, so the
httpx and in-process clients carry it too and a process that exports nothing pays no span.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, Self
from urllib.parse import quote, urlsplit

import httpx
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from worker import __version__, tracing
from worker.logs import get_logger
from worker.provider.answer import (
    ACCEPT_ENCODING,
    BODY_HEADERS,
    DEFAULT_BODY_CAP,
    decoded_body,
    load_json,
    read_capped,
)
from worker.provider.base import CallObserver, ProviderAuthState, ProviderError, RetryObserver
from worker.provider.breaker import CircuitBreaker
from worker.provider.credentials import Credential
from worker.provider.errors import invalid_call, map_answer, map_unexpected, map_upstream_failure
from worker.provider.retry import RetryPolicy, call_with_retries
from worker.provider.transport import AiohttpClient, RawAnswer

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = [
    "HttpProviderAdapter",
    "ProviderHttpClient",
    "Requester",
    "ShardedClient",
    "build_http_client",
    "parse_auth_state",
]

log = get_logger(__name__)


CONNECTIONS_PER_SHARD = 4
_BODY_HEADERS = frozenset(name.encode() for name in BODY_HEADERS)
_CONFIRM_PATH = "/v1/accounts/{ref}/passkey/confirm"
_STATE_PATH = "/v1/accounts/{ref}/auth-state"


class Requester(Protocol):
    """What an adapter needs of its HTTP client: ``httpx.AsyncClient``, ``ShardedClient`` or
    ``AiohttpClient``."""

    async def request(
        self, method: str, url: str, *, headers: dict[str, str] | None = None
    ) -> httpx.Response: ...


class ProviderHttpClient(Requester, Protocol):
    """The process-wide provider client that ``build_http_client`` returns."""

    @property
    def timeout(self) -> httpx.Timeout: ...

    @property
    def headers(self) -> httpx.Headers: ...

    @property
    def follow_redirects(self) -> bool: ...

    @property
    def is_closed(self) -> bool: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *_: Any) -> None: ...


class ShardedClient:
    """Several ``httpx.AsyncClient``s with small pools, used round-robin.

    httpcore looks at every connection of a pool on each request event (idle and expiry
    checks, one readability poll per idle socket): with one large pool that was most of the
    worker's CPU (bench/README.md, hot spot #1). Sixteen pools of four keep the capacity and
    cut that work sixteenfold.

    Each answer is streamed and bounded (``worker.provider.answer``): at most ``body_cap``
    bytes are read, gzip/deflate inflated up to the same cap by us, not by httpx; the
    ``httpx.Response`` returned holds the decoded body (empty when unusable).
    """

    def __init__(
        self, clients: Sequence[httpx.AsyncClient], *, body_cap: int = DEFAULT_BODY_CAP
    ) -> None:
        if not clients:
            raise ValueError("at least one client")
        if body_cap < 1:
            raise ValueError("body_cap must be positive")
        self.clients = tuple(clients)
        self.body_cap = body_cap
        self._next = itertools.cycle(self.clients)

    async def request(
        self, method: str, url: str, *, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        client = next(self._next)
        async with client.stream(method, url, headers=headers) as answer:
            raw, truncated = await read_capped(answer.aiter_raw(), self.body_cap)
            coding = answer.headers.get("content-encoding")
            fields = [(k, v) for k, v in answer.headers.raw if k.lower() not in _BODY_HEADERS]
            body = decoded_body(raw, truncated=truncated, coding=coding, cap=self.body_cap)
            return httpx.Response(answer.status_code, headers=fields, content=body)

    @property
    def timeout(self) -> httpx.Timeout:
        return self.clients[0].timeout

    @property
    def headers(self) -> httpx.Headers:
        return self.clients[0].headers

    @property
    def follow_redirects(self) -> bool:
        return self.clients[0].follow_redirects

    @property
    def is_closed(self) -> bool:
        return all(client.is_closed for client in self.clients)

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()

    async def __aenter__(self) -> ShardedClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


def build_http_client(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    tls: ssl.SSLContext | None = None,
    timeout_s: float | None = None,
    connect_timeout_s: float | None = None,
) -> ProviderHttpClient:
    """The process-wide provider client, ``PROVIDER_HTTP_CLIENT`` (aiohttp by default): per
    phase timeouts of ``PROVIDER_TIMEOUT_S`` and ``PROVIDER_MAX_CONNECTIONS`` connections.

    With ``httpx`` (or a test ``transport``) the connections come in shards of
    ``CONNECTIONS_PER_SHARD`` (see ``ShardedClient``). The adapters gate concurrent calls at
    the same bound, so requests wait on a semaphore rather than inside a pool. Either way an
    answer is read up to ``PROVIDER_BODY_CAP_BYTES`` (decompressed too).

    A provider with TLS material or timeouts of its own (``PROVIDER_<NAME>_*``) gets a client
    of its own: ``tls`` (CA bundle, client certificate) and the timeouts replace the defaults.
    """
    user_agent = {"User-Agent": f"passkey-auth-worker/{__version__}"}
    cap = settings.provider_body_cap_bytes
    read_s = settings.provider_timeout_s if timeout_s is None else timeout_s
    connect_s = read_s if connect_timeout_s is None else connect_timeout_s
    if settings.provider_http_client == "aiohttp" and transport is None:
        return AiohttpClient(
            timeout_s=read_s,
            connect_timeout_s=connect_s,
            max_connections=settings.provider_max_connections,
            headers=user_agent,
            body_cap=cap,
            tls=tls,
        )
    total = settings.provider_max_connections
    per_shard = min(CONNECTIONS_PER_SHARD, total)
    shards = max(1, total // per_shard)
    limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
    return ShardedClient(
        [
            httpx.AsyncClient(
                timeout=httpx.Timeout(read_s, connect=connect_s),
                limits=limits,
                headers={**user_agent, "Accept-Encoding": ACCEPT_ENCODING},
                follow_redirects=False,
                transport=transport,
                verify=True if tls is None else tls,
            )
            for _ in range(shards)
        ],
        body_cap=cap,
    )


def parse_auth_state(response: httpx.Response) -> ProviderAuthState:
    """The auth state in a 2xx answer; anything else raises the mapped ``ProviderError``."""
    if response.is_success:
        try:
            content = response.content
        except httpx.ResponseNotRead:
            content = b""
        state = _auth_state(load_json(content))
        if state is not None:
            return state
    raise map_upstream_failure(response)


def _auth_state(body: object) -> ProviderAuthState | None:
    if isinstance(body, dict):
        status, auth_status = body.get("status"), body.get("auth_status")
        if isinstance(status, str) and status and isinstance(auth_status, str) and auth_status:
            return ProviderAuthState(status=status, auth_status=auth_status)
    return None


def parse_raw_auth_state(answer: RawAnswer) -> ProviderAuthState:
    """``parse_auth_state`` of an aiohttp answer, straight from its parts (no
    ``httpx.Response`` is built, not even for the error mapping)."""
    status, content, headers = answer
    if 200 <= status < 300:
        state = _auth_state(load_json(content))
        if state is not None:
            return state
    raise map_answer(status, content, headers.get("Retry-After"))


def _host_port(url: str) -> tuple[str, int | None]:
    """Host and port for the CLIENT span; a malformed URL fails at the call, not here."""
    try:
        parts = urlsplit(url)
        return parts.hostname or "", parts.port
    except ValueError:
        return "", None


class HttpProviderAdapter:
    """A provider reached over HTTP: bounded retries, deadline, circuit breaker, error mapping.

    ``policy`` is the retry policy (``RetryPolicy.from_settings`` in production, its defaults
    otherwise); each retry keyword that is given overrides that field of it, so a test can
    change one knob. ``breaker=None`` disables the breaker (tests); ``build_registry`` always
    gives one per provider. ``on_call``/``on_retry`` are metric hooks, so this module needs no
    registry. ``credential`` (``PROVIDER_<NAME>_TOKEN[_FILE]``) adds its header to every
    request.
    """

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
        # The aiohttp client answers raw (status, body, headers): no httpx.Response per call.
        self._raw = client.request_raw if isinstance(client, AiohttpClient) else None
        self._host, self._port = _host_port(self.base_url)
        self._on_call = on_call
        self._on_retry = on_retry
        self._rng = rng
        # At most as many requests in flight as the pool has connections: requests beyond
        # that wait here, on an O(1) semaphore, instead of in httpcore's pool, whose
        # bookkeeping costs O(connections x queued requests) per request event.
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
                try:
                    return await self._attempt(method, url, headers, client_span)
                except ProviderError:
                    raise
                except Exception as exc:
                    # Nothing but a catalogued error leaves an attempt, whatever the answer
                    # broke: the confirm and the follow-up poll catch ProviderError only.
                    if client_span.is_recording():
                        client_span.set_attribute("error.type", type(exc).__name__)
                        client_span.set_status(Status(StatusCode.ERROR))
                    if not isinstance(exc, httpx.HTTPError | TimeoutError):
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

    async def _attempt(
        self, method: str, url: str, headers: dict[str, str], client_span: Span
    ) -> ProviderAuthState:
        """One request and its answer read; raises ``ProviderError`` or whatever broke."""
        sent = {**headers, **tracing.http_headers()}
        if self._credential is not None:
            sent.update(self._credential.headers())
        raw: RawAnswer | None = None
        async with self._gate:
            if self._raw is not None:
                raw = await self._raw(method, url, headers=sent)
                status = raw[0]
            else:
                response = await self._client.request(method, url, headers=sent)
                status = response.status_code
        if client_span.is_recording():
            client_span.set_attribute("http.response.status_code", status)
            if status >= 400:
                client_span.set_attribute("error.type", str(status))
                client_span.set_status(Status(StatusCode.ERROR))
        if raw is not None:
            return parse_raw_auth_state(raw)
        return parse_auth_state(response)

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
