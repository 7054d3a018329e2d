"""Opening and revoking portal sessions (docs/api.md, "The portal"). The signed token rides in the
URL's fragment, which browsers never send, so it reaches no access log; the URL is built on
``API_PUBLIC_BASE_URL``, never on the request's ``Host``, and the answer is never cached."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Annotated, Final

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from worker.api.bodies import DataResponse, json_response
from worker.api.keys import KeyStore
from worker.api.portal.revocations import PortalRevocations
from worker.api.portal.tokens import SESSION_ID_RE, PortalTokens
from worker.api.reading import invalid_path, request_id_of
from worker.api.webhooks.bodies import json_object_body
from worker.contract.catalogue import ServiceError
from worker.contract.messages import Identifier, Strict
from worker.runtime.logs import get_logger

log = get_logger(__name__)

PORTAL_SESSIONS: Final = "/v1/portal-sessions"
PORTAL_SESSION: Final = "/v1/portal-sessions/{session_id}"
SESSION_ID_RULE: Final = "session_id must be ps_ and 32 lowercase hex digits"
NO_STORE: Final = MappingProxyType({"Cache-Control": "no-store"})
PORTAL_PAGE: Final = "/portal"
MIN_TTL_S: Final = 60
FAILURE: Final = "create_portal_session_failed"


class PortalSessionBody(Strict):
    """Optional: a shorter life for the session than the service's
    `API_PORTAL_SESSION_TTL_S` (default 1 h)."""

    ttl_s: Annotated[
        int | None,
        Field(
            ge=MIN_TTL_S,
            le=86_400,
            description="Seconds the session lasts; capped at `API_PORTAL_SESSION_TTL_S`.",
        ),
    ] = None


class PortalSessionData(Strict):
    """A portal session: open `url` in a browser. The token is in the URL's fragment
    (`#token=`), which browsers never send to a server; treat the URL as a password."""

    url: str = Field(
        description="The page's URL with the session token in its fragment: on the service's"
        " `API_PUBLIC_BASE_URL`, or relative (`/portal#token=...`) when that is not set."
    )
    session_id: str = Field(
        pattern=SESSION_ID_RE.pattern,
        description="The session's id: `DELETE /v1/portal-sessions/{session_id}` revokes it.",
    )
    workspace_id: Identifier
    expires_at: str = Field(description="RFC 3339 UTC time the session ends.")


class PortalSessionResponse(DataResponse[PortalSessionData]):
    """Success: the portal session."""


@dataclass(eq=False, kw_only=True)
class PortalSessions:
    """The handlers, behind the front-end's key check (a portal token may neither mint nor
    revoke); without a portal secret (``tokens`` ``None``) they answer their 500."""

    admitted_workspace: Callable[[Request], str]
    keys: KeyStore
    tokens: PortalTokens | None
    revocations: PortalRevocations
    ttl_s: float
    #: ``API_PUBLIC_BASE_URL``; ``None``: the page's URL is relative.
    public_base_url: str | None = None

    def routes(self) -> list[Route]:
        return [
            Route(PORTAL_SESSIONS, self.create, methods=["POST"]),
            Route(PORTAL_SESSIONS, self.revoke_all, methods=["DELETE"]),
            Route(PORTAL_SESSION, self.revoke, methods=["DELETE"]),
        ]

    @staticmethod
    def _no_portal(what: str) -> ServiceError:
        return ServiceError.of(
            FAILURE,
            f"The service has no portal secret (API_PORTAL_SECRET or WEBHOOK_SECRETS_KEY); {what}.",
        )

    async def create(self, request: Request) -> Response:
        workspace_id = self.admitted_workspace(request)
        key_id: str = request.scope["state"]["key_id"]
        body = await json_object_body(request, PortalSessionBody, when_empty=PortalSessionBody())
        if self.tokens is None:
            raise self._no_portal("no session was created")
        key = self.keys.entry_in_force(key_id, workspace_id)
        if key is None:  # disabled between the check and now
            raise ServiceError.of(
                "invalid_api_key", "The API key is not recognised or has been disabled."
            )
        ttl_s = self.ttl_s if body.ttl_s is None else min(float(body.ttl_s), self.ttl_s)
        minted = self.tokens.mint(workspace_id, key, ttl_s)
        expires = datetime.fromtimestamp(minted.expires_at, UTC).isoformat()
        expires = expires.replace("+00:00", "Z")
        log.info(
            "portal_session_created",
            workspace_id=workspace_id,
            session_id=minted.session_id,
            expires_at=expires,
        )
        data = PortalSessionData(
            url=f"{self.public_base_url or ''}{PORTAL_PAGE}#token={minted.token}",
            session_id=minted.session_id,
            workspace_id=workspace_id,
            expires_at=expires,
        )
        return json_response(
            PortalSessionResponse(request_id=request_id_of(request), data=data), 201, NO_STORE
        )

    async def revoke(self, request: Request) -> Response:
        """204 for every well-formed id: the workspace's own session is revoked; an id it
        never opened (unknown, or another workspace's) is recorded under this workspace and
        so revokes nothing, with the same answer."""
        workspace_id = self.admitted_workspace(request)
        session_id: str = request.path_params["session_id"]
        if SESSION_ID_RE.fullmatch(session_id) is None:
            raise invalid_path(SESSION_ID_RULE)
        if self.tokens is None:
            raise self._no_portal("there are no sessions to revoke")
        await self.revocations.revoke_session(workspace_id, session_id)
        log.info("portal_session_revoked", workspace_id=workspace_id, session_id=session_id)
        return Response(status_code=204, headers=NO_STORE)

    async def revoke_all(self, request: Request) -> Response:
        """204: every session of the workspace opened until now is revoked."""
        workspace_id = self.admitted_workspace(request)
        if self.tokens is None:
            raise self._no_portal("there are no sessions to revoke")
        await self.revocations.revoke_all(workspace_id)
        log.info("portal_sessions_revoked", workspace_id=workspace_id)
        return Response(status_code=204, headers=NO_STORE)


__all__ = [
    "NO_STORE",
    "PORTAL_PAGE",
    "PORTAL_SESSION",
    "PORTAL_SESSIONS",
    "SESSION_ID_RULE",
    "PortalSessionBody",
    "PortalSessionData",
    "PortalSessionResponse",
    "PortalSessions",
]
