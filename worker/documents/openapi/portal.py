"""The OpenAPI table of the portal sessions routes (open one, revoke one, revoke all), and the
``PortalSession`` bearer scheme the portal's routes accept besides the API key (docs/api.md,
"The portal")."""

from __future__ import annotations

from typing import Any, Final

from worker.api.portal.sessions import (
    PORTAL_SESSION,
    PORTAL_SESSIONS,
    SESSION_ID_RULE,
    PortalSessionBody,
    PortalSessionData,
    PortalSessionResponse,
)
from worker.api.portal.tokens import SESSION_ID_RE
from worker.documents.openapi.parts import (
    BODY_TIMEOUT,
    EXAMPLE_RID,
    KEY_CHECK,
    RID_HEADER,
    Failure,
    error_responses,
    header,
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
_EXAMPLE_SESSION: Final = "ps_9b2f6c1e4d8a4f0b8c3e5a7d1f2b4c6e"
_REVOKE_FAILURES: Final = (
    *KEY_CHECK,
    Failure(
        "portal_scope_forbidden",
        "Called with a portal session token: only an API key revokes sessions.",
    ),
    Failure(
        "create_portal_session_failed",
        "The service has neither `API_PORTAL_SECRET` nor `WEBHOOK_SECRETS_KEY`.",
    ),
)


def portal_paths() -> dict[str, Any]:
    """``POST`` and ``DELETE /v1/portal-sessions``, ``DELETE /v1/portal-sessions/{id}``."""
    example = PortalSessionResponse(
        request_id=EXAMPLE_RID,
        data=PortalSessionData(
            url=f"https://api.example.com/portal#token={_EXAMPLE_TOKEN}",
            session_id=_EXAMPLE_SESSION,
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
                " (`Authorization: Bearer`); nothing else. It ends when it expires, when it is"
                " revoked (`DELETE`), or when the key that opened it is disabled (for good:"
                " enabling the key again does not bring it back), deleted or replaced. The URL is"
                " on the service's `API_PUBLIC_BASE_URL`, or relative (`/portal#token=...`) when"
                " that is not set; never on the request's `Host`. The answer carries a secret:"
                " `Cache-Control: no-store`.",
                "tags": ["portal"],
                "security": [{"ApiKey": []}],
                "parameters": [{"$ref": "#/components/parameters/RequestId"}],
                "requestBody": body,
                "responses": {
                    "201": _no_store(
                        json_response(
                            "The session: give `url` to the integrator's browser.",
                            PortalSessionResponse,
                            example=example.model_dump(),
                        )
                    ),
                    **error_responses(failures),
                },
            },
            "delete": _revoke(
                "revokePortalSessions",
                "Revoke every portal session of the key's workspace",
                "Every session of the workspace opened until now ends, on every front-end"
                " replica (within a fetch of the shared `api.presence` topic); sessions opened"
                " afterwards are not touched.",
                (),
                _REVOKE_FAILURES,
            ),
            "options": preflight("preflightCreatePortalSession"),
        },
        PORTAL_SESSION: {
            "delete": _revoke(
                "revokePortalSession",
                "Revoke one portal session",
                "The session ends on every front-end replica (within a fetch of the shared"
                " `api.presence` topic); the workspace's other sessions go on. Any well-formed id"
                " answers 204: an id the workspace never opened (unknown, or another"
                " workspace's) is answered exactly the same and revokes nothing. A workspace"
                " holds at most 1000 sessions revoked one by one within a session's life; past"
                " it, 429 (revoke them all instead).",
                (
                    {
                        "name": "session_id",
                        "in": "path",
                        "required": True,
                        "description": "The `session_id` answered when the session was opened.",
                        "schema": {"type": "string", "pattern": SESSION_ID_RE.pattern},
                        "example": _EXAMPLE_SESSION,
                    },
                ),
                (
                    Failure("invalid_request", f"Invalid path parameter: {SESSION_ID_RULE}."),
                    *_REVOKE_FAILURES[:2],
                    Failure(
                        "rate_limited",
                        "The workspace's rate limit, or it holds 1000 sessions revoked one by"
                        " one within a session's life.",
                    ),
                    *_REVOKE_FAILURES[3:],
                ),
            ),
            "options": preflight("preflightPortalSession", "session_id"),
        },
    }


def _no_store(response: dict[str, Any]) -> dict[str, Any]:
    response.setdefault("headers", {})["Cache-Control"] = header(
        {"type": "string", "const": "no-store"}, "The answer names a secret: never cached."
    )
    return response


def _revoke(
    operation_id: str,
    summary: str,
    description: str,
    parameters: tuple[dict[str, Any], ...],
    failures: tuple[Failure, ...],
) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "summary": summary,
        "description": description,
        "tags": ["portal"],
        "security": [{"ApiKey": []}],
        "parameters": [*parameters, {"$ref": "#/components/parameters/RequestId"}],
        "responses": {
            "204": _no_store({"description": "Revoked; no body.", "headers": dict(RID_HEADER)}),
            **error_responses(failures),
        },
    }
