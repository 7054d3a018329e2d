"""The contract's two routes and their checks, in the contract's order (docs/api.md, "Order of
checks"); why Starlette, not FastAPI: docs/architecture.md, "Design decisions"."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from aiokafka.errors import KafkaError
from opentelemetry.trace import SpanKind
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.api import long_poll
from worker.api.bodies import (
    ApiHealth,
    ApiReadiness,
    AuthStateResponse,
    error_response,
    json_response,
    valid_id,
)
from worker.api.credentials import bearer_credential, header
from worker.api.idempotency import IdempotencyKeys, answer_once, fingerprint, key_of
from worker.api.ids import new_command_id
from worker.api.keys import KeyStore
from worker.api.metrics import ApiMetrics
from worker.api.portal.revocations import PortalRevocations, session_claims
from worker.api.portal.tokens import PortalTokens, in_portal_scope
from worker.api.reading import ACCOUNT_ID_RULE, check_body, invalid_path, request_id_of
from worker.api.replies import CorrelatedReply, ReplyError, ReplyRouter
from worker.api.request_rate import RateLimited, RateLimiter
from worker.contract.catalogue import ServiceError
from worker.contract.messages import MAX_WAIT_MS, SLACK_SHARE, GetAuthState, PasskeyConfirm
from worker.engine.broker_health import BrokerHealth
from worker.engine.home_partition import REPLY_PARTITION
from worker.engine.tail import TopicTail
from worker.engine.writes import send_retrying
from worker.runtime import tracing
from worker.runtime.logs import get_logger

log = get_logger(__name__)

PASSKEY_CONFIRM: Final = "/v1/accounts/{account_id}/auth/passkey-confirm"
ACCOUNT_AUTH: Final = "/v1/accounts/{account_id}/auth"
API_ROUTES: Final = (PASSKEY_CONFIRM, ACCOUNT_AUTH)


async def on_service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return error_response(request_id_of(request), exc, headers=_error_headers(exc))


def _error_headers(err: ServiceError) -> dict[str, str] | None:
    """``Retry-After`` on a 429; ``Connection: close`` on a 408, whose body was not read."""
    if isinstance(err, RateLimited):
        return {"Retry-After": str(err.retry_after_s)}
    if err.code == "request_timeout":
        return {"Connection": "close"}
    return None


async def on_http_error(request: Request, exc: Exception) -> Response:
    """The router's 404 as the contract's not_found; its 405 (``FrontDoor`` answers those first)
    the same, with Starlette's ``Allow``."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        return error_response(
            request_id_of(request), ServiceError.of("method_not_allowed"), headers=exc.headers
        )
    code = "invalid_request" if exc.status_code == 400 else "not_found"
    return error_response(request_id_of(request), ServiceError.of(code))


EXCEPTION_HANDLERS: Final[dict[Any, Callable[[Request, Exception], Awaitable[Response]]]] = {
    ServiceError: on_service_error,
    StarletteHTTPException: on_http_error,
}


def check_account_id(account_id: str) -> None:
    if not valid_id(account_id):
        raise invalid_path(ACCOUNT_ID_RULE)


class _RoundTripFailed(Exception):
    """The command could not be queued in time (``queued`` false) or its reply could not be
    used; each route answers with its own catalogued error."""

    def __init__(self, *, queued: bool) -> None:
        super().__init__("queued" if queued else "not queued")
        self.queued = queued


@dataclass(eq=False, kw_only=True)
class ApiRoutes:
    """The handlers of both routes and the probe checks, over started clients: each route is a
    round trip to the worker owning the account's partition; this process holds no account
    state (docs/architecture.md, "The front-end")."""

    producer: Any
    replies: ReplyRouter
    keys: KeyStore
    metrics: ApiMetrics
    commands_topic: str
    reply_timeout_s: float
    #: The longest a long-poll waits here (``API_LONG_POLL_MAX_S``).
    long_poll_max_s: float = MAX_WAIT_MS / 1000
    long_poll_slots: InitVar[int] = 500
    webhook_tails: Sequence[TopicTail] | None = None
    broker: BrokerHealth = field(default_factory=BrokerHealth)
    rate_limiter: RateLimiter | None = None
    #: The replicas' presence (``worker.api.presence``): the rate limit's share needs it.
    presence: TopicTail | None = None
    #: Verifies portal session tokens (``None``: no portal secret, every token refused).
    portal: PortalTokens | None = None
    idempotency: IdempotencyKeys | None = None
    portal_revocations: PortalRevocations | None = None

    def __post_init__(self, long_poll_slots: int) -> None:
        self.long_polls = long_poll.LongPolls(long_poll_slots)
        self._send_span = f"send {self.commands_topic}"
        self._receive_span = f"receive {self.replies.topic}"

    @functools.cached_property
    def _reply_headers(self) -> Iterator[tuple[str, bytes]]:
        """The ``reply-partition`` header of each next command: this replica's reply
        partitions in turn, so each holds 1/``API_REPLY_PARTITIONS`` of its replies (known
        once the router started)."""
        partitions = [tp.partition for tp in self.replies.partitions] or [self.replies.partition]
        return itertools.cycle([(REPLY_PARTITION, b"%d" % p) for p in partitions])

    def routes(self) -> list[Route]:
        return [
            Route(PASSKEY_CONFIRM, self.passkey_confirm, methods=["POST"]),
            Route(ACCOUNT_AUTH, self.account_auth, methods=["GET"]),
        ]

    # -- probes ------------------------------------------------------------------------------

    @property
    def _shared(self) -> list[TopicTail]:
        """The replicas' shared views this replica reads: presence and idempotency keys."""
        return [t for t in (self.presence, self.idempotency) if t is not None]

    def health(self) -> tuple[bool, ApiHealth]:
        tails = [self.replies, *(self.webhook_tails or ()), *self._shared]
        ok = all(tail.running for tail in tails)
        return ok, ApiHealth(status="ok" if ok else "failed")

    def readiness(self) -> tuple[bool, ApiReadiness]:
        """Ready once the reply consumer is positioned (and the webhook registry caught up):
        nothing here reads auth.state, so the time to ready does not grow with accounts."""
        # The replicas are known before a share is taken, and every key held before one is
        # answered.
        replies = self.replies.ready and self.replies.keeping_up
        replies = replies and all(t.caught_up and t.running for t in self._shared)
        webhooks = (
            None
            if self.webhook_tails is None
            else all(t.caught_up and t.running for t in self.webhook_tails)
        )
        kafka = self.broker.reachable
        ok = replies and webhooks is not False and kafka
        return ok, ApiReadiness(ready=ok, replies=replies, webhooks=webhooks, kafka=kafka)

    # -- checks ------------------------------------------------------------------------------

    def authenticate(self, request: Request) -> str:
        """The workspace of the request's API key, or of its portal session token (used only
        without ``X-Api-Key``): the workspace never comes from anywhere else; 401 otherwise."""
        raw = header(request, b"x-api-key")
        if raw is None or not raw.strip():
            bearer = bearer_credential(request)
            if bearer is not None:
                return self.portal_workspace(request, bearer)
            raise ServiceError.of("missing_api_key", "The X-Api-Key request header is missing.")
        entry = self.keys.resolve_entry(raw.strip())
        if entry is None:
            raise ServiceError.of(
                "invalid_api_key", "The API key is not recognised or has been disabled."
            )
        request.scope["state"]["key_id"] = entry.key_id
        return entry.workspace_id

    def portal_workspace(self, request: Request, token: str) -> str:
        """The workspace of a portal session token in force (else 401), for a route in the
        portal's scope (else 403)."""
        claims = session_claims(token, self.portal, self.keys, self.portal_revocations)
        if claims is None:
            raise ServiceError.of("portal_session_invalid")
        if not in_portal_scope(request.method, request.scope["state"].get("route")):
            raise ServiceError.of("portal_scope_forbidden")
        return claims.workspace_id

    def admit(self, workspace_id: str) -> None:
        """Spend one of the workspace's requests from its rate (429 when none is left); only
        authenticated requests count, so an unknown key cannot spend a workspace's rate."""
        if self.rate_limiter is not None:
            wait_s = self.rate_limiter.take(workspace_id)
            if wait_s > 0:
                self.metrics.refusals.labels("rate_limited").inc()
                raise RateLimited.after(wait_s)

    def admitted_workspace(self, request: Request) -> str:
        """What every route checks first: the key's workspace (``authenticate``), once its
        rate lets the request through (``admit``)."""
        workspace_id = self.authenticate(request)
        self.admit(workspace_id)
        return workspace_id

    # -- POST /v1/accounts/{account_id}/auth/passkey-confirm ---------------------------------

    async def passkey_confirm(self, request: Request) -> Response:
        account_id: str = request.path_params["account_id"]
        deadline = time.monotonic() + self.reply_timeout_s
        request_id = request_id_of(request)
        workspace_id = self.admitted_workspace(request)
        check_account_id(account_id)
        idempotency_key = key_of(request)
        raw = await check_body(request)
        if idempotency_key is not None and self.idempotency is not None:
            return await answer_once(
                self.idempotency,
                workspace_id=workspace_id,
                key=idempotency_key,
                print_=fingerprint(account_id, raw),
                request_id=request_id,
                run=lambda: self._confirm(request_id, workspace_id, account_id, deadline),
                metrics=self.metrics,
            )
        return await self._confirm(request_id, workspace_id, account_id, deadline)

    async def _confirm(
        self, request_id: str, workspace_id: str, account_id: str, deadline: float
    ) -> Response:
        """The confirm's round trip, once every check passed."""
        replies = self.replies
        if not replies.ready and not await replies.wait_caught_up(deadline - time.monotonic()):
            raise ServiceError.of(
                "run_auth_action_failed",
                "The service is starting or degraded (reply consumer not ready); nothing was"
                " changed.",
            )
        now = datetime.now(UTC)
        # Every field is checked already (the request id and account id by the identifier
        # rule, the workspace id when the keys file was read, the rest built here), so the
        # model is filled, not validated a second time.
        command = PasskeyConfirm.model_construct(
            command_id=new_command_id(),
            request_id=request_id,
            workspace_id=workspace_id,
            account_id=account_id,
            issued_at=now,
            deadline=now + timedelta(seconds=self.reply_timeout_s),
        )
        check_hint = (
            f"Check GET /v1/accounts/{account_id}/auth before retrying: the confirmation may"
            " still be applied."
        )
        try:
            reply = await self._round_trip(command, deadline)
        except _RoundTripFailed as exc:
            detail = (
                "The confirmation outcome is unknown."
                if exc.queued
                else "The confirmation could not be queued in time."
            )
            raise ServiceError.of("run_auth_action_failed", f"{detail} {check_hint}") from None
        if reply is None:
            self.metrics.reply_timeouts.inc()
            self._no_reply("api_reply_timeout", command, self.reply_timeout_s)
            raise ServiceError.of(
                "run_auth_action_failed",
                f"No outcome within {self.reply_timeout_s:g} s. {check_hint}",
            )
        if not 200 <= reply.http_status <= 599:
            log.error("api_reply_bad_status", request_id=request_id, status=reply.http_status)
            raise ServiceError.of("run_auth_action_failed", check_hint)
        # The worker's reply, unchanged: it already is the contract's envelope.
        return Response(
            reply.body,
            status_code=reply.http_status,
            media_type=JSONResponse.media_type,
        )

    def _no_reply(self, event: str, command: PasskeyConfirm | GetAuthState, after_s: float) -> None:
        """Log a command's reply that did not come in time, with where the reply reader is."""
        log.warning(
            event,
            request_id=command.request_id,
            command_id=command.command_id,
            account_id=command.account_id,
            timeout_s=after_s,
            **self.replies.state(),
        )

    async def _round_trip(
        self, command: PasskeyConfirm | GetAuthState, deadline: float
    ) -> CorrelatedReply | None:
        """Produce ``command`` and wait for its reply until ``deadline`` (``None`` past it). The
        waiter is registered before the produce, so the reply cannot be missed; a produce
        retried until the deadline tells the caller to poll before retrying, since the command
        may still reach the broker once it is back."""
        recording = tracing.recording()
        try:
            with self.replies.expect(command.command_id, command.request_id) as pending:
                # One deadline on this task for both steps: no task, shield or timer of
                # ``wait_for``'s per step.
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)) as limit:
                    try:
                        with tracing.span(
                            self._send_span,
                            kind=SpanKind.PRODUCER,
                            attributes=tracing.messaging("send", self.commands_topic)
                            | {
                                "passkey.command_id": command.command_id,
                                "passkey.account_id": command.account_id,
                            }
                            if recording
                            else None,
                        ):
                            try:
                                await send_retrying(
                                    self.producer,
                                    self.broker,
                                    self.commands_topic,
                                    command.model_dump_json().encode(),
                                    key=command.account_id.encode(),
                                    headers=[next(self._reply_headers), *tracing.kafka_headers()],
                                )
                            except asyncio.CancelledError:
                                if limit.expired():  # the deadline, not a caller's cancel
                                    raise TimeoutError from None
                                raise
                    except (KafkaError, TimeoutError) as exc:
                        log.error(
                            "api_command_send_failed",
                            request_id=command.request_id,
                            command_id=command.command_id,
                            error=repr(exc),
                        )
                        raise _RoundTripFailed(queued=False) from None
                    with tracing.span(
                        self._receive_span,
                        kind=SpanKind.CONSUMER,
                        attributes=tracing.messaging("receive", self.replies.topic)
                        if recording
                        else None,
                    ) as waiting:
                        reply = await pending.until(limit)
                        if waiting.is_recording():
                            waiting.set_attribute("passkey.reply.received", reply is not None)
                            if reply is not None:
                                waiting.set_attribute(
                                    "passkey.reply.http_status", reply.http_status
                                )
                        return reply
        except ReplyError as exc:
            log.error("api_reply_failed", request_id=command.request_id, error=str(exc))
            raise _RoundTripFailed(queued=True) from None

    # -- GET /v1/accounts/{account_id}/auth --------------------------------------------------

    async def account_auth(self, request: Request) -> Response:
        """The account's state from its owner; with ``wait_s``, a long-poll the owner parks. One
        request of the rate limit, parked or not."""
        account_id: str = request.path_params["account_id"]
        request_id = request_id_of(request)
        workspace_id = self.admitted_workspace(request)
        check_account_id(account_id)
        wait = long_poll.Wait.of(request).at_most(self.long_poll_max_s)
        wait, slot = self.long_polls.admit(workspace_id, wait)
        failed = self.metrics.query_failures.labels  # each 500 counted by its cause
        with slot or contextlib.nullcontext():
            within_s = wait.wait_s * (1 + SLACK_SHARE) + self.reply_timeout_s
            deadline = time.monotonic() + within_s
            replies = self.replies
            if not replies.ready and not await replies.wait_caught_up(deadline - time.monotonic()):
                failed("not_ready").inc()
                raise ServiceError.of(
                    "get_auth_state_failed",
                    "The authentication state is not available yet (reply consumer not ready);"
                    " retry shortly.",
                )
            query = wait.query(new_command_id(), request_id, workspace_id, account_id)
            unavailable = "The authentication state is not available; retry shortly."
            try:
                reply = await wait.unless_gone(request, self._round_trip(query, deadline))
            except _RoundTripFailed as exc:
                failed("bad_reply" if exc.queued else "not_queued").inc()
                raise ServiceError.of("get_auth_state_failed", unavailable) from None
            except long_poll.CallerGone:
                return Response(status_code=long_poll.CALLER_GONE)
            if reply is None:
                self.metrics.query_timeouts.inc()
                failed("deadline").inc()
                self._no_reply("api_query_timeout", query, within_s)
                raise ServiceError.of(
                    "get_auth_state_failed", f"No answer within {within_s:g} s. {unavailable}"
                )
        data = long_poll.auth_state(reply, account_id, request_id)
        if data is None:
            failed("bad_reply").inc()
            raise ServiceError.of("get_auth_state_failed", unavailable)
        return json_response(AuthStateResponse(request_id=request_id, data=data))
