"""Portal session tokens (``worker.runtime.signed``), never logged, bound to the minting key's id
and *print* (a keyed digest of its stored hash and creation time), so each request re-checks that
the key is in force, unchanged since issue, and the session unrevoked (docs/architecture.md)."""

from __future__ import annotations

import hmac
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from worker.api.keys import KeyEntry
from worker.contract.messages import valid_id
from worker.runtime.signed import SignedCodec

__all__ = [
    "MAX_TOKEN_CHARS",
    "PORTAL_SCOPE",
    "SESSION_ID_RE",
    "TOKEN_PREFIX",
    "MintedSession",
    "PortalClaims",
    "PortalTokens",
    "in_portal_scope",
]

TOKEN_PREFIX: Final = "pts1."
MAX_TOKEN_CHARS: Final = 1024
"""Longer bearer values are refused before any decoding (a token is about 250 characters)."""
_LABEL: Final = b"passkey-auth-worker portal session v1"
_PRINT_LABEL: Final = b"key print\x00"
SESSION_ID_RE: Final = re.compile(r"^ps_[0-9a-f]{32}$")
#: A token may outlive its TTL by this much (the expiry is rounded to whole seconds).
_TTL_SLACK_S: Final = 2.0

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
    """What a valid token says: its workspace, the minting key's id and print, its session id,
    when it was issued (Unix ms) and its expiry (Unix s)."""

    workspace_id: str
    key_id: str
    key_print: str
    session_id: str
    issued_at_ms: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class MintedSession:
    """A new token and what the session-create answer says of it."""

    token: str
    session_id: str
    issued_at_ms: int
    expires_at: int


class PortalTokens:
    """Mints and verifies portal tokens (``worker.runtime.signed``, under the portal's own
    label: the same secret used elsewhere, for cursors, gives unrelated signatures)."""

    def __init__(
        self,
        secret: str,
        *,
        clock: Callable[[], float] = time.time,
        max_ttl_s: float = 86_400.0,
    ) -> None:
        self._codec = SignedCodec(
            secret.encode("utf-8"), label=_LABEL, prefix=TOKEN_PREFIX, max_chars=MAX_TOKEN_CHARS
        )
        self._clock = clock
        #: A token whose life is longer is refused, so a revocation kept ``max_ttl_s`` covers
        #: every token it can name (``API_PORTAL_SESSION_TTL_S``).
        self.max_ttl_s = max_ttl_s

    def __repr__(self) -> str:  # never the key
        return "PortalTokens(<key hidden>)"

    def key_print(self, entry: KeyEntry) -> str:
        """The print of a stored key: its digest and creation time under the signing key, so
        a key deleted and created again under the same id (even with the same raw key, at
        another time) has another print, and a token shows nothing of the key's hash."""
        created = "" if entry.created_at is None else repr(entry.created_at)
        return self._codec.digest(_PRINT_LABEL + entry.digest + b"\x00" + created.encode(), 12)

    def mint(self, workspace_id: str, key: KeyEntry, ttl_s: float) -> MintedSession:
        """A token for ``workspace_id`` minted by ``key``, valid ``ttl_s`` seconds from now
        (at most ``max_ttl_s``), under a new session id."""
        now = self._clock()
        issued_at_ms = int(now * 1000)
        expires_at = int(now + min(ttl_s, self.max_ttl_s))
        session_id = f"ps_{uuid.uuid4().hex}"
        claims = {
            "w": workspace_id,
            "k": key.key_id,
            "p": self.key_print(key),
            "s": session_id,
            "i": issued_at_ms,
            "e": expires_at,
        }
        return MintedSession(self._codec.encode(claims), session_id, issued_at_ms, expires_at)

    def bound(self, claims: PortalClaims, key: KeyEntry | None) -> bool:
        """Whether ``claims`` still hold for ``key`` (the entry in force under the claims'
        key id and workspace, ``None`` when there is none): the same key (its print) and not
        disabled or enabled since the token was issued."""
        if key is None or key.workspace_id != claims.workspace_id:
            return False
        if not hmac.compare_digest(self.key_print(key), claims.key_print):
            return False
        return key.changed_at is None or claims.issued_at_ms >= round(key.changed_at * 1000)

    def verify(self, token: str) -> PortalClaims | None:
        """The claims of a well-formed, correctly signed, unexpired token, else ``None``."""
        claims = self._codec.decode(token) or {}
        workspace, key_id, key_print, session, issued_ms, expires = map(claims.get, "wkpsie")
        if not (
            isinstance(workspace, str)
            and valid_id(workspace)
            and isinstance(key_id, str)
            and valid_id(key_id)
            and isinstance(key_print, str)
            and key_print.isascii()
            and len(key_print) == 16
            and isinstance(session, str)
            and SESSION_ID_RE.fullmatch(session)
            and type(issued_ms) is int
            and type(expires) is int
        ):
            return None
        if self._clock() >= expires or expires - issued_ms / 1000 > self.max_ttl_s + _TTL_SLACK_S:
            return None
        return PortalClaims(workspace, key_id, key_print, session, issued_ms, expires)
