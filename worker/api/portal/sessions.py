"""``POST /v1/portal-sessions``: an API key asks for a portal URL for its workspace (docs/api.md,
"The portal"). The answer holds a stateless token (``worker.api.portal.tokens``) in the URL's
fragment, which browsers never send to a server, so it reaches no access log."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from worker.api.bodies import json_response
from worker.api.portal.tokens import PortalTokens
from worker.api.routes import request_id_of
from worker.api.webhooks.bodies import json_object_body
from worker.contract.catalogue import ServiceError
from worker.contract.messages import Identifier
from worker.runtime.logs import get_logger

log = get_logger(__name__)

PORTAL_SESSIONS: Final = "/v1/portal-sessions"
PORTAL_PAGE: Final = "/portal"
MIN_TTL_S: Final = 60
FAILURE: Final = "create_portal_session_failed"


class PortalSessionBody(BaseModel):
    """Optional: a shorter life for the session than the service's
    `API_PORTAL_SESSION_TTL_S` (default 1 h)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl_s: Annotated[
        int | None,
        Field(
            ge=MIN_TTL_S,
            le=86_400,
            description="Seconds the session lasts; capped at `API_PORTAL_SESSION_TTL_S`.",
        ),
    ] = None


class PortalSessionData(BaseModel):
    """A portal session: open `url` in a browser. The token is in the URL's fragment
    (`#token=`), which browsers never send to a server; treat the URL as a password."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(description="The page's URL with the session token in its fragment.")
    workspace_id: Identifier
    expires_at: str = Field(description="RFC 3339 UTC time the session ends.")


class PortalSessionResponse(BaseModel):
    """Success: the portal session."""

    model_config = ConfigDict(frozen=True)

    request_id: Identifier
    data: PortalSessionData


class PortalSessions:
    """The handler. ``admitted_workspace`` is the front-end's key check and rate limit (a
    portal token is refused there: minting is outside its scope); ``tokens`` is ``None``
    without a portal secret, and the route then answers its 500; ``ttl_s`` is the longest
    (and default) life of a session."""

    def __init__(
        self,
        *,
        admitted_workspace: Callable[[Request], str],
        tokens: PortalTokens | None,
        ttl_s: float,
    ) -> None:
        self.admitted_workspace = admitted_workspace
        self.tokens = tokens
        self.ttl_s = ttl_s

    def routes(self) -> list[Route]:
        return [Route(PORTAL_SESSIONS, self.create, methods=["POST"])]

    async def create(self, request: Request) -> Response:
        workspace_id = self.admitted_workspace(request)
        key_id: str = request.scope["state"]["key_id"]
        body = await json_object_body(request, PortalSessionBody, when_empty=PortalSessionBody())
        if self.tokens is None:
            raise ServiceError.of(
                FAILURE,
                "The service has no portal secret (API_PORTAL_SECRET or WEBHOOK_SECRETS_KEY);"
                " no session was created.",
            )
        ttl_s = self.ttl_s if body.ttl_s is None else min(float(body.ttl_s), self.ttl_s)
        token, expires_at = self.tokens.mint(workspace_id, key_id, ttl_s)
        base = str(request.base_url).rstrip("/")
        expires = datetime.fromtimestamp(expires_at, UTC).isoformat().replace("+00:00", "Z")
        log.info("portal_session_created", workspace_id=workspace_id, expires_at=expires)
        data = PortalSessionData(
            url=f"{base}{PORTAL_PAGE}#token={token}", workspace_id=workspace_id, expires_at=expires
        )
        return json_response(
            PortalSessionResponse(request_id=request_id_of(request), data=data), 201
        )


__all__ = [
    "PORTAL_PAGE",
    "PORTAL_SESSIONS",
    "PortalSessionBody",
    "PortalSessionData",
    "PortalSessionResponse",
    "PortalSessions",
]
