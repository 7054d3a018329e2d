"""The OpenAPI table of the portal sessions route, and the ``PortalSession`` bearer scheme the
portal's routes accept besides the API key (docs/api.md, "The portal")."""

from __future__ import annotations

from typing import Any, Final

from worker.api.portal.sessions import (
    PORTAL_SESSIONS,
    PortalSessionBody,
    PortalSessionData,
    PortalSessionResponse,
)
from worker.documents.openapi.parts import (
    BODY_TIMEOUT,
    EXAMPLE_RID,
    KEY_CHECK,
    Failure,
    error_responses,
    json_body,
    json_response,
    preflight,
)

PORTAL_SCHEME: Final = {
    "type": "http",
    "scheme": "bearer",
    "description": "A portal session token (`POST /v1/portal-sessions`), confined to one"
    " workspace's endpoints, event types and deliveries and the portal's actions; other routes"
    " answer 403 `portal_scope_forbidden`.",
}
_EXAMPLE_TOKEN: Final = "pts1.eyJlIjoxNzY0MjQ1NjAwLCJrIjoia2V5X2EiLCJ3Ijoid3NfYSJ9.c2lnbmF0dXJl"


def portal_paths() -> dict[str, Any]:
    """``POST /v1/portal-sessions``."""
    example = PortalSessionResponse(
        request_id=EXAMPLE_RID,
        data=PortalSessionData(
            url=f"https://api.example.com/portal#token={_EXAMPLE_TOKEN}",
            workspace_id="ws_a",
            expires_at="2025-11-27T13:00:00Z",
        ),
    )
    body = json_body(PortalSessionBody, "Optional: a shorter session.", required=False)
    body["content"]["application/json"]["examples"] = {
        "default": {"summary": "The service's length (1 h)", "value": {}},
        "short": {"summary": "Ten minutes", "value": {"ttl_s": 600}},
    }
    failures = (
        Failure(
            "invalid_request",
            "A body that is not empty or a JSON object, unknown fields, `ttl_s` out of range.",
        ),
        *KEY_CHECK,
        Failure(
            "portal_scope_forbidden",
            "Called with a portal session token: only an API key opens a session.",
        ),
        Failure(
            "create_portal_session_failed",
            "The service has neither `API_PORTAL_SECRET` nor `WEBHOOK_SECRETS_KEY`.",
        ),
        BODY_TIMEOUT,
    )
    return {
        PORTAL_SESSIONS: {
            "post": {
                "operationId": "createPortalSession",
                "summary": "Open a portal session for the key's workspace",
                "description": "Answers the URL of the webhook portal (`/portal`) with a signed"
                " session token in its fragment, valid for `API_PORTAL_SESSION_TTL_S` (default 1"
                " h) or the shorter `ttl_s`. The token reads the workspace's endpoints, event"
                " types and deliveries, sends tests, resends, rotates secrets and deactivates or"
                " activates endpoints, through the same routes as an API key"
                " (`Authorization: Bearer`); nothing else. It ends when it expires or when the"
                " key that opened it is disabled or deleted. Nothing is stored server-side.",
                "tags": ["portal"],
                "security": [{"ApiKey": []}],
                "parameters": [{"$ref": "#/components/parameters/RequestId"}],
                "requestBody": body,
                "responses": {
                    "201": json_response(
                        "The session: give `url` to the integrator's browser.",
                        PortalSessionResponse,
                        example=example.model_dump(),
                    ),
                    **error_responses(failures),
                },
            },
            "options": preflight("preflightCreatePortalSession"),
        },
    }
