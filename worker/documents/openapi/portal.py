"""The OpenAPI table of the portal sessions routes, and the ``PortalSession`` bearer scheme the
portal's routes accept besides the API key."""

from __future__ import annotations

from typing import Any, Final

from worker.api.portal import sessions
from worker.api.portal.tokens import SESSION_ID_RE
from worker.documents.openapi.parts import (
    EXAMPLE_RID,
    KEY_CHECK,
    RID_HEADER,
    Failure,
    json_body,
    json_response,
    no_store,
    operation,
    param,
    path_item,
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
_NO_SECRET: Final = Failure(
    "create_portal_session_failed",
    "The service has neither `API_PORTAL_SECRET` nor `WEBHOOK_SECRETS_KEY`.",
)


def _only_a_key(does: str) -> Failure:
    return Failure(
        "portal_scope_forbidden", f"Called with a portal session token: only an API key {does}."
    )


def _revoke(op_id: str, summary: str, description: str, failures: Any, params: Any) -> Any:
    revoked = no_store({"description": "Revoked; no body.", "headers": dict(RID_HEADER)})
    return operation(
        op_id, summary, description, failures, ok={"204": revoked}, params=params, tag="portal"
    )


def portal_paths() -> dict[str, Any]:
    """``POST`` and ``DELETE /v1/portal-sessions``, ``DELETE /v1/portal-sessions/{id}``."""
    example = sessions.PortalSessionResponse(
        request_id=EXAMPLE_RID,
        data=sessions.PortalSessionData(
            url=f"https://api.example.com/portal#token={_EXAMPLE_TOKEN}",
            session_id=_EXAMPLE_SESSION,
            workspace_id="ws_a",
            expires_at="2025-11-27T13:00:00Z",
        ),
    )
    examples = {
        "default": {"summary": "The service's length (1 h)", "value": {}},
        "short": {"summary": "Ten minutes", "value": {"ttl_s": 600}},
    }
    revoke = (_only_a_key("revokes sessions"), _NO_SECRET)
    too_many = Failure(
        "rate_limited",
        "The workspace's rate limit, or it holds 1000 sessions revoked one by one within a"
        " session's life.",
    )
    session_id = param(
        "session_id",
        "path",
        "The `session_id` answered when the session was opened.",
        {"type": "string", "pattern": SESSION_ID_RE.pattern},
        example=_EXAMPLE_SESSION,
    )
    return {
        **path_item(
            sessions.PORTAL_SESSIONS,
            post=operation(
                "createPortalSession",
                "Open a portal session for the key's workspace",
                "Answers the URL of the webhook portal (`/portal`) with a signed session token in"
                " its fragment, valid for `API_PORTAL_SESSION_TTL_S` (default 1 h) or the shorter"
                " `ttl_s`. The token reads the workspace's endpoints, event types and deliveries,"
                " sends tests, resends, rotates secrets and deactivates or activates endpoints,"
                " through the same routes as an API key (`Authorization: Bearer`); nothing else."
                " It ends when it expires, when it is revoked (`DELETE`), or when the key that"
                " opened it is disabled (for good: enabling the key again does not bring it"
                " back), deleted or replaced. The URL is on the service's `API_PUBLIC_BASE_URL`,"
                " or relative (`/portal#token=...`) when that is not set; never on the request's"
                " `Host`. The answer carries a secret: `Cache-Control: no-store`.",
                (
                    Failure(
                        "invalid_request",
                        "A body that is not empty or a JSON object, unknown fields, `ttl_s` out"
                        " of range.",
                    ),
                    *KEY_CHECK,
                    _only_a_key("opens a session"),
                    _NO_SECRET,
                ),
                ok={
                    "201": no_store(
                        json_response(
                            "The session: give `url` to the integrator's browser.",
                            sessions.PortalSessionResponse,
                            example=example.model_dump(),
                        )
                    )
                },
                tag="portal",
                body=json_body(
                    sessions.PortalSessionBody,
                    "Optional: a shorter session.",
                    False,
                    examples=examples,
                ),
            ),
            delete=_revoke(
                "revokePortalSessions",
                "Revoke every portal session of the key's workspace",
                "Every session of the workspace opened until now ends, on every front-end"
                " replica (within a fetch of the shared `api.presence` topic); sessions opened"
                " afterwards are not touched.",
                (*KEY_CHECK, *revoke),
                ("RequestId",),
            ),
        ),
        **path_item(
            sessions.PORTAL_SESSION,
            preflight="preflightPortalSession",
            delete=_revoke(
                "revokePortalSession",
                "Revoke one portal session",
                "The session ends on every front-end replica (within a fetch of the shared"
                " `api.presence` topic); the workspace's other sessions go on. Any well-formed"
                " id answers 204: an id the workspace never opened (unknown, or another"
                " workspace's) is answered exactly the same and revokes nothing. A workspace"
                " holds at most 1000 sessions revoked one by one within a session's life; past"
                " it, 429 (revoke them all instead).",
                (
                    Failure(
                        "invalid_request", f"Invalid path parameter: {sessions.SESSION_ID_RULE}."
                    ),
                    *KEY_CHECK[:2],
                    too_many,
                    *revoke,
                ),
                (session_id, "RequestId"),
            ),
        ),
    }
