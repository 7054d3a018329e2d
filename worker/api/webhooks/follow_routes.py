"""The routes that follow the webhooks (a replay's state and cancellation, an account's events);
another workspace's ids are answered exactly as unknown ones (docs/api.md)."""

from __future__ import annotations

import time
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from worker.api.bodies import json_response
from worker.api.reading import check_body, invalid_path, invalid_query, path_id, request_id_of
from worker.api.webhooks.account_events import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    WINDOW_EXCEEDED,
    WINDOW_S,
    CursorError,
)
from worker.api.webhooks.clients import WebhookClients
from worker.api.webhooks.follow_bodies import (
    AccountEventData,
    AccountEventsResponse,
    ReplayStatusData,
    ReplayStatusResponse,
)
from worker.api.webhooks.guard import READ, UPDATE, WebhookHandlers
from worker.contract.catalogue import ServiceError
from worker.contract.webhook_events import parse_rfc3339
from worker.runtime.logs import get_logger
from worker.webhooks.replay_scan import REPLAY_ID_RE, ReplayProgress

log = get_logger(__name__)

WEBHOOK_REPLAY_STATUS: Final = "/v1/webhook-endpoints/{endpoint_id}/replays/{replay_id}"
WEBHOOK_REPLAY_CANCEL: Final = "/v1/webhook-endpoints/{endpoint_id}/replays/{replay_id}/cancel"
ACCOUNT_EVENTS: Final = "/v1/accounts/{account_id}/events"
FOLLOW_ROUTES: Final = (WEBHOOK_REPLAY_STATUS, WEBHOOK_REPLAY_CANCEL, ACCOUNT_EVENTS)
REPLAY_NOT_FOUND: Final = "The replay does not exist for this endpoint in this workspace."
NO_EVENTS: Final = (
    "The account has no events in this workspace within the history window (unknown, another"
    " workspace's, or none yet)."
)
REPLAY_ID_RULE: Final = "replay_id must be rp_ followed by 32 lowercase hexadecimal digits"
#: How long a status request for an unknown replay id waits for this replica to read it (a
#: replay started on another replica a moment ago).
RECENT_WAIT_S: Final = 0.5
_QUERY: Final = frozenset({"cursor", "limit", "since"})


class FollowRoutes(WebhookHandlers):
    """The handlers (``WebhookHandlers``) of a replay's status and an account's events."""

    def routes(self) -> list[Route]:
        route = self.route
        return [
            route(WEBHOOK_REPLAY_STATUS, self.replay_status, "GET", READ),
            route(WEBHOOK_REPLAY_CANCEL, self.cancel_replay, "POST", UPDATE),
            route(ACCOUNT_EVENTS, self.account_events, "GET", READ),
        ]

    # -- checks ------------------------------------------------------------------------------

    async def _replay(
        self, request: Request, failure: str
    ) -> tuple[WebhookClients, ReplayProgress]:
        """Key, configured, ids well-formed, the endpoint of the workspace, the replay of the
        endpoint: (clients, the replay's progress); 404 for anything not the caller's."""
        clients, workspace_id = self._caller(request, failure)
        endpoint_id = path_id(request, "endpoint_id")
        replay_id: str = request.path_params["replay_id"]
        if REPLAY_ID_RE.fullmatch(replay_id) is None:
            raise invalid_path(REPLAY_ID_RULE)
        await self._ready(failure, clients.endpoints, clients.replays.board.presence)
        self._find(clients, workspace_id, endpoint_id)
        progress = clients.replays.board.get(workspace_id, endpoint_id, replay_id)
        if progress is None:
            await clients.replays.board.seen(replay_id, RECENT_WAIT_S)
            progress = clients.replays.board.get(workspace_id, endpoint_id, replay_id)
            if progress is None:
                raise ServiceError.of("not_found", REPLAY_NOT_FOUND)
        return clients, progress

    # -- replays -----------------------------------------------------------------------------

    async def replay_status(self, request: Request) -> Response:
        return _status(request, (await self._replay(request, READ))[1])

    async def cancel_replay(self, request: Request) -> Response:
        """Ask for the replay's cancellation: 202 while it runs (the replica running it stops
        within a progress interval), 200 with the replay unchanged once it has ended."""
        await check_body(request)
        clients, progress = await self._replay(request, UPDATE)
        if progress.ended:
            return _status(request, progress)
        await clients.replays.board.request_cancel(progress)
        clients.replays.cancel(progress.replay_id)  # at once when it runs here
        log.info(
            "webhook_replay_cancel_requested",
            replay_id=progress.replay_id,
            endpoint_id=progress.endpoint_id,
        )
        return _status(request, progress.model_copy(update={"cancel_requested": True}), 202)

    # -- an account's events -----------------------------------------------------------------

    async def account_events(self, request: Request) -> Response:
        clients, workspace_id = self._caller(request, READ)
        account_id = path_id(request, "account_id")
        query = request.query_params
        for name in query:
            if name not in _QUERY:
                raise ServiceError.of("invalid_request", f"Unknown query parameter: {name[:40]}.")
            if len(query.getlist(name)) > 1:
                raise ServiceError.of("invalid_request", f"Repeated query parameter: {name}.")
        limit = _limit(query.get("limit"))
        cursor_text = query.get("cursor")
        since_text = query.get("since")
        # With a cursor, ``since`` (the first page's, sent again as paged APIs' clients do) is
        # checked for its form and otherwise ignored: the cursor already starts after it.
        cursor = None
        if cursor_text is not None:
            try:
                cursor = clients.cursors.decode(
                    cursor_text, account_id=account_id, workspace_id=workspace_id
                )
            except CursorError:
                raise invalid_query(
                    "cursor is not one this service issued for this account (pass next_cursor"
                    " unchanged)"
                ) from None
        since = None
        if since_text is not None:
            try:
                since = parse_rfc3339(since_text)
            except ValueError as exc:
                raise invalid_query(f"since {exc}") from None
            if cursor is not None:
                since = None
            elif since.timestamp() < time.time() - WINDOW_S:
                raise ServiceError.of(WINDOW_EXCEEDED)
        with clients.events.turn(workspace_id):
            try:
                page = await clients.events.page(
                    workspace_id, account_id, cursor=cursor, since=since, limit=limit
                )
            except CursorError:
                raise invalid_query(
                    "cursor no longer applies (the topics changed); start again without it"
                ) from None
        if cursor is None and not page.found_any and not page.has_more:
            raise ServiceError.of("not_found", NO_EVENTS)
        return json_response(
            AccountEventsResponse(
                request_id=request_id_of(request),
                data=[AccountEventData.of(e) for e in page.events],
                next_cursor=clients.cursors.encode(page.cursor),
                has_more=page.has_more,
            )
        )


def _status(request: Request, progress: ReplayProgress, status: int = 200) -> Response:
    data = ReplayStatusData.of(progress)
    return json_response(ReplayStatusResponse(request_id=request_id_of(request), data=data), status)


def _limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_LIMIT
    if not (text.isascii() and text.isdigit()) or len(text) > 4 or not 1 <= int(text) <= MAX_LIMIT:
        raise invalid_query(f"limit must be 1-{MAX_LIMIT}")
    return int(text)


__all__ = ["ACCOUNT_EVENTS", "FOLLOW_ROUTES", "FollowRoutes"]
