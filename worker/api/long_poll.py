"""The front-end's side of the ``GET .../auth`` long-poll: its query parameters, its query sent on
the send grid, and the wait given up as soon as the caller disconnects (docs/architecture.md,
"Long-polls")."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, replace
from typing import Final

from starlette.requests import Request

from worker.api.bodies import AuthState
from worker.api.replies import CorrelatedReply
from worker.contract.catalogue import ServiceError
from worker.contract.messages import MAX_WAIT_MS, GetAuthState
from worker.runtime.admission import Admission, NoRoom, Share, Slot
from worker.runtime.logs import get_logger

# The lines are the routes': they keep their logger name, which dashboards and searches use.
log = get_logger("worker.api.routes")

#: The status a long-poll whose caller went away is counted with (nginx's "client closed
#: request"): nothing can be sent, the connection is gone.
CALLER_GONE: Final = 499
#: The largest ``after_version`` taken (a record's version is a count of its changes).
MAX_VERSION: Final = 2**53
_AFTER_RULE: Final = "after_version must be one integer from 0 to 2^53."
#: A JSON number (no ``nan``, ``inf``, ``1_0`` or spaces, which ``float`` would take).
_NUMBER: Final = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_WAIT_RULE: Final = f"wait_s must be one number of seconds from 0 to {MAX_WAIT_MS // 1000}."
#: A long-poll's query leaves at the next multiple of this (monotonic clock): the asks of a burst
#: (one time-out slot's callers asking again) leave in one produce request (the front-end's
#: producer does not linger) and reach the owner in one fetch, not one each.
SEND_GRID_S: Final = 0.05


class CallerGone(Exception):
    """The caller of a long-poll disconnected before its answer came."""


@dataclass(frozen=True, slots=True)
class Wait:
    """A GET's long-poll parameters: ``after_version`` (``None``: the version the owner holds
    now) and ``wait_s`` (0: answer at once, a plain GET)."""

    after_version: int | None = None
    wait_s: float = 0.0

    @classmethod
    def of(cls, request: Request) -> Wait:
        """``after_version`` (an integer 0 to 2^53) and ``wait_s`` (seconds, 0 to 30), each
        at most once; 400 ``invalid_request`` otherwise."""
        params = request.query_params
        after_version: int | None = None
        wait_s = 0.0
        raw_after = params.getlist("after_version")
        if raw_after:
            text = raw_after[0]
            if len(raw_after) > 1 or not (text.isascii() and text.isdigit()) or len(text) > 16:
                raise ServiceError.of("invalid_request", _AFTER_RULE)
            after_version = int(text)
            if after_version > MAX_VERSION:
                raise ServiceError.of("invalid_request", _AFTER_RULE)
        raw_wait = params.getlist("wait_s")
        if raw_wait:
            text = raw_wait[0]
            if len(raw_wait) > 1 or len(text) > 64 or not _NUMBER.fullmatch(text):
                raise ServiceError.of("invalid_request", _WAIT_RULE)
            wait_s = float(text)
            if not 0 <= wait_s <= MAX_WAIT_MS / 1000:
                raise ServiceError.of("invalid_request", _WAIT_RULE)
        return cls(after_version, wait_s)

    def at_most(self, max_s: float) -> Wait:
        """This wait, no longer than ``max_s`` (``API_LONG_POLL_MAX_S``)."""
        return replace(self, wait_s=min(self.wait_s, max_s))

    def query(
        self, command_id: str, request_id: str, workspace_id: str, account_id: str
    ) -> GetAuthState:
        """The query, filled, not validated again: every field was checked already."""
        return GetAuthState.model_construct(
            command_id=command_id,
            request_id=request_id,
            workspace_id=workspace_id,
            account_id=account_id,
            after_version=self.after_version,
            wait_ms=round(self.wait_s * 1000) if self.wait_s else None,
        )

    async def unless_gone(
        self, request: Request, round_trip: Awaitable[CorrelatedReply | None]
    ) -> CorrelatedReply | None:
        """``round_trip``'s result; for a long-poll, started on the send grid, and
        ``CallerGone`` as soon as the caller disconnected, the round trip then cancelled, which
        frees its reply waiter."""
        if not self.wait_s:
            return await round_trip
        answer = asyncio.ensure_future(_on_grid(round_trip))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not answer.done():
                answer.cancel()
                await asyncio.gather(answer, return_exceptions=True)
        if answer.cancelled():
            raise CallerGone
        return answer.result()


class LongPolls:
    """The long-polls this front-end holds open, through the admission rule (owner: the
    workspace); past it a long-poll is answered at once as a plain GET, never refused."""

    def __init__(self, capacity: int) -> None:
        self.admission = Admission(
            "long-polls", Share.split(max(2, capacity), owners=4), retry_after_s=1.0
        )

    def admit(self, workspace_id: str, wait: Wait) -> tuple[Wait, Slot | None]:
        """``wait`` and its slot, or no wait (``wait_s`` 0) when the rule has no room."""
        if not wait.wait_s:
            return wait, None
        try:
            return wait, self.admission.take(workspace_id)
        except NoRoom:
            return replace(wait, wait_s=0.0), None


async def _on_grid(round_trip: Awaitable[CorrelatedReply | None]) -> CorrelatedReply | None:
    """``round_trip`` from the next ``SEND_GRID_S`` boundary on; never, if cancelled before."""
    now = asyncio.get_running_loop().time()
    try:
        await asyncio.sleep(math.ceil(now / SEND_GRID_S) * SEND_GRID_S - now)
    except asyncio.CancelledError:
        if isinstance(round_trip, Coroutine):
            round_trip.close()
        raise
    return await round_trip


async def _disconnected(request: Request) -> None:
    """Returns when the caller's connection is gone; a GET's body, if any, is dropped, and past
    the body deadline it stops watching."""
    while True:
        try:
            message = await request.receive()
        except ServiceError:
            await asyncio.Event().wait()  # no more to learn; cancelled with the request
            return
        if message["type"] == "http.disconnect":
            return


def auth_state(reply: CorrelatedReply, account_id: str, request_id: str) -> AuthState | None:
    """The state and version a 200 reply for ``account_id`` carries; 404 for the worker's 404,
    ``None`` (logged) for any other reply: the route answers it 500 and counts it."""
    if reply.http_status == 404:
        raise ServiceError.of("not_found", "The account does not exist in this workspace.")
    found, version = reply.reply.body.data, reply.reply.version
    if (
        reply.http_status != 200
        or found is None
        or found.account_id != account_id
        or version is None
    ):
        log.error("api_query_bad_reply", request_id=request_id, status=reply.http_status)
        return None
    return AuthState(
        account_id=account_id, status=found.status, auth_status=found.auth_status, version=version
    )
