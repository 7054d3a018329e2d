"""Portal session tokens: stateless (nothing stored), HMAC-signed, expiring, carrying their
workspace and the id of the API key that minted them, re-checked in the keys file on every
request, so a disabled or deleted key ends its sessions at the next reload. The signing key
is derived from ``API_PORTAL_SECRET`` or else ``WEBHOOK_SECRETS_KEY``. Tokens are never logged
and reach the page in the URL fragment (docs/architecture.md, "The portal")."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from worker.contract.messages import valid_id

__all__ = [
    "MAX_TOKEN_CHARS",
    "PORTAL_SCOPE",
    "TOKEN_PREFIX",
    "PortalClaims",
    "PortalTokens",
    "in_portal_scope",
]

TOKEN_PREFIX: Final = "pts1."
MAX_TOKEN_CHARS: Final = 1024
"""Longer bearer values are refused before any decoding (a token is about 250 characters)."""
_LABEL: Final = b"passkey-auth-worker portal session v1"

PORTAL_SCOPE: Final[frozenset[tuple[str, str]]] = frozenset(
    {
        ("GET", "/v1/webhook-endpoints"),
        ("GET", "/v1/webhook-endpoints/{endpoint_id}"),
        ("GET", "/v1/webhook-endpoints/{endpoint_id}/deliveries"),
        ("GET", "/v1/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}"),
        ("POST", "/v1/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/resend"),
        ("POST", "/v1/webhook-endpoints/{endpoint_id}/test"),
        ("POST", "/v1/webhook-endpoints/{endpoint_id}/rotate-secret"),
        ("POST", "/v1/webhook-endpoints/{endpoint_id}/deactivate"),
        ("POST", "/v1/webhook-endpoints/{endpoint_id}/activate"),
        ("GET", "/v1/event-types"),
    }
)
"""The routes a portal session may call, by (method, route template): read the endpoints, the
event catalogue and the delivery log, send tests, resend, rotate a secret, deactivate and
activate. Every other route (keys, portal sessions, confirms, creating, changing or deleting
an endpoint, replays) answers 403 ``portal_scope_forbidden`` to a portal token. Routes listed
here that a front-end does not serve answer their 404 as to any caller."""


def in_portal_scope(method: str, template: str | None) -> bool:
    """Whether a portal session may call ``method`` on ``template`` (``HEAD`` as ``GET``)."""
    if template is None:
        return False
    return ("GET" if method == "HEAD" else method, template) in PORTAL_SCOPE


@dataclass(frozen=True, slots=True)
class PortalClaims:
    """What a valid token says: its workspace, the minting key's id, its expiry (Unix s)."""

    workspace_id: str
    key_id: str
    expires_at: int


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PortalTokens:
    """Mints and verifies portal tokens with a key derived from ``secret`` (HMAC-SHA256 of a
    fixed label): the configured secret itself never signs anything, so a token reveals
    nothing about it, and the same secret used elsewhere gives unrelated signatures."""

    def __init__(self, secret: str, *, clock: Callable[[], float] = time.time) -> None:
        if not secret:
            raise ValueError("the portal secret must not be empty")
        self._key = hmac.new(secret.encode("utf-8"), _LABEL, hashlib.sha256).digest()
        self._clock = clock

    def __repr__(self) -> str:  # never the key
        return "PortalTokens(<key hidden>)"

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).digest())

    def mint(self, workspace_id: str, key_id: str, ttl_s: float) -> tuple[str, int]:
        """A token for ``workspace_id`` minted by ``key_id``, valid ``ttl_s`` seconds from now;
        returns it and its expiry (Unix seconds)."""
        expires_at = int(self._clock() + ttl_s)
        claims = {"w": workspace_id, "k": key_id, "e": expires_at}
        payload = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
        return f"{TOKEN_PREFIX}{payload}.{self._sign(payload)}", expires_at

    def verify(self, token: str) -> PortalClaims | None:
        """The claims of a well-formed, correctly signed, unexpired token, else ``None``. The
        signature is checked (in constant time) before the payload is decoded."""
        if len(token) > MAX_TOKEN_CHARS or not token.startswith(TOKEN_PREFIX):
            return None
        payload, dot, signature = token[len(TOKEN_PREFIX) :].partition(".")
        if not dot or not payload or not payload.isascii() or not signature.isascii():
            return None
        if not hmac.compare_digest(self._sign(payload), signature):
            return None
        try:
            claims = json.loads(_unb64(payload))
        except (ValueError, binascii.Error):
            return None
        if not isinstance(claims, dict):
            return None
        workspace_id, key_id, expires_at = claims.get("w"), claims.get("k"), claims.get("e")
        if not (isinstance(workspace_id, str) and valid_id(workspace_id)):
            return None
        if not (isinstance(key_id, str) and valid_id(key_id)):
            return None
        if not isinstance(expires_at, int) or isinstance(expires_at, bool):
            return None
        if self._clock() >= expires_at:
            return None
        return PortalClaims(workspace_id, key_id, expires_at)
