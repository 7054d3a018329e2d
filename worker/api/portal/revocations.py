"""Revoked portal sessions, shared by the replicas on the compacted ``api.presence`` topic:
``ps_ws/<workspace>`` (its sessions issued until ``before_ms``) and ``ps_s/<workspace>/<session>``
(the key names the workspace, so another's id revokes nothing). A record lives as long as a token
it names can; past a bound a record becomes its workspace's cut-off: a bound only revokes more."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final, Literal

from pydantic import Field

from worker.api.keys import KeyStore
from worker.api.portal.tokens import SESSION_ID_RE, PortalClaims, PortalTokens
from worker.api.presence import Presence
from worker.api.request_rate import RateLimited
from worker.contract.messages import Identifier, TopicRecord
from worker.engine.compacted_view import ViewPart

#: Every key on ``api.presence`` that is a portal revocation's.
KEY_PREFIX: Final = b"ps_"
#: Sessions one workspace may hold revoked one by one (each for at most a session's life).
MAX_REVOKED_PER_WORKSPACE: Final = 1000
#: Sessions held revoked one by one, all workspaces together.
MAX_TRACKED: Final = 50_000
#: Workspaces with a cut-off held; past it (records of workspaces the keys file does not
#: know would be needed) every portal session is refused until the extra records expire.
MAX_WORKSPACES: Final = 10_000


class PortalRevocation(TopicRecord):
    """The value under a ``ps_`` key: a workspace's cut-off (``session_id`` null: sessions
    issued at or before ``before_ms`` are dead) or one session revoked."""

    type: Literal["portal_revocation"] = "portal_revocation"
    workspace_id: Identifier
    session_id: str | None = Field(default=None, pattern=SESSION_ID_RE.pattern)
    before_ms: int = Field(ge=0, description="When revoked: Unix milliseconds, writer's clock.")
    until: float = Field(description="Unix seconds after which no token it names is alive.")

    @property
    def record_key(self) -> str:
        if self.session_id is None:
            return f"ps_ws/{self.workspace_id}"
        return f"ps_s/{self.workspace_id}/{self.session_id}"


class PortalRevocations(ViewPart):
    """Every replica's view of the revoked sessions, and the writes to it; ``presence`` reads
    and writes the topic (``None``: this process's view only)."""

    def __init__(
        self,
        presence: Presence | None,
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
        per_workspace: int = MAX_REVOKED_PER_WORKSPACE,
        max_tracked: int = MAX_TRACKED,
        max_workspaces: int = MAX_WORKSPACES,
    ) -> None:
        super().__init__(presence, KEY_PREFIX, name="portal-revocations", sweep_every_s=60.0)
        self._clock = clock
        self.ttl_s = ttl_s
        self.per_workspace = per_workspace
        self.max_tracked = max_tracked
        self.max_workspaces = max_workspaces
        #: workspace -> (cut-off ms, until)
        self._cutoffs: dict[str, tuple[int, float]] = {}
        #: workspace -> session id -> until
        self._sessions: dict[str, dict[str, float]] = {}
        self._tracked = 0
        #: Every session is refused until then: a cut-off past ``max_workspaces`` was read.
        self._refuse_all_until = 0.0
        #: Records read past a bound (turned into cut-offs, or refusing every session).
        self.overflowed = 0

    def __len__(self) -> int:
        """Sessions held revoked one by one plus workspaces with a cut-off."""
        return self._tracked + len(self._cutoffs)

    # -- the check ---------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether every revocation written before this replica started has been read: until
        then no portal session is accepted (a revoked one could be)."""
        return self.view is None or (self.view.caught_up and self.view.running)

    def revoked(self, claims: PortalClaims) -> bool:
        """Whether the session of ``claims`` is revoked (or cannot be told apart yet)."""
        now = self._clock()
        if not self.ready or now < self._refuse_all_until:
            return True
        cutoff = self._cutoffs.get(claims.workspace_id)
        if cutoff is not None and claims.issued_at_ms <= cutoff[0]:
            return True
        return claims.session_id in self._sessions.get(claims.workspace_id, {})

    # -- reading -----------------------------------------------------------------------------

    def take(self, msg: Any) -> None:
        """One ``ps_`` record, as the presence tail read it."""
        key = (msg.key or b"").decode("utf-8", "replace")
        if msg.value is None:
            self._tombstoned(key)
            return
        record = self.decoded(PortalRevocation.model_validate_json, msg.value)
        if record is not None and record.record_key != key:
            self.undecodable += 1
        elif record is not None:
            self._apply(record)

    def _tombstoned(self, key: str) -> None:
        """A tombstone is written only for an expired record: dropping early is harmless to
        a live token only if the record is past ``until``, so ``until`` is checked too."""
        now = self._clock()
        parts = key.split("/")
        if len(parts) == 2 and parts[0] == "ps_ws":
            held = self._cutoffs.get(parts[1])
            if held is not None and held[1] <= now:
                del self._cutoffs[parts[1]]
        elif len(parts) == 3 and parts[0] == "ps_s":
            sessions = self._sessions.get(parts[1], {})
            until = sessions.get(parts[2])
            if until is not None and until <= now:
                self._forget_session(parts[1], parts[2])

    def _apply(self, record: PortalRevocation) -> None:
        if record.until <= self._clock():
            return
        if record.session_id is None:
            self._cut(record.workspace_id, record.before_ms, record.until)
            return
        sessions = self._sessions.get(record.workspace_id, {})
        if record.session_id in sessions:
            sessions[record.session_id] = max(sessions[record.session_id], record.until)
            return
        # Two replicas may each admit one more than the bound at once: the view allows twice.
        if len(sessions) >= 2 * self.per_workspace:
            self.overflowed += 1
            self._cut(record.workspace_id, record.before_ms, record.until)
            return
        if self._tracked >= self.max_tracked:
            # Full in all: the workspace holding the most pays (its sessions fold into its own
            # cut-off), never the one whose revocation arrives; the same on every replica.
            self.overflowed += 1
            self._fold_largest(record.before_ms)
        self._sessions.setdefault(record.workspace_id, {})[record.session_id] = record.until
        self._tracked += 1

    def _cut(self, workspace_id: str, before_ms: int, until: float) -> None:
        held = self._cutoffs.get(workspace_id)
        if held is None and len(self._cutoffs) >= self.max_workspaces:
            self.overflowed += 1
            self._refuse_all_until = max(self._refuse_all_until, until)
            return
        if held is not None:
            before_ms, until = max(before_ms, held[0]), max(until, held[1])
        self._cutoffs[workspace_id] = (before_ms, until)

    def _fold_largest(self, before_ms: int) -> None:
        """The workspace holding the most single revocations gets a cut-off at ``before_ms``
        (every session of it issued until then dead, so nothing is un-revoked) instead."""
        largest = max(self._sessions, key=lambda ws: (len(self._sessions[ws]), ws))
        sessions = self._sessions.pop(largest)
        self._tracked -= len(sessions)
        until = max(sessions.values())
        # A session revoked at r was issued before r (= its record's until less a life).
        revoked_ms = int((until - self.ttl_s - 2.0) * 1000)
        self._cut(largest, max(before_ms, revoked_ms), until)

    def _forget_session(self, workspace_id: str, session_id: str) -> None:
        sessions = self._sessions.get(workspace_id)
        if sessions is not None and sessions.pop(session_id, None) is not None:
            self._tracked -= 1
            if not sessions:
                del self._sessions[workspace_id]

    # -- writing -----------------------------------------------------------------------------

    async def revoke_session(self, workspace_id: str, session_id: str) -> None:
        """Revoke one session of ``workspace_id``: held here at once, then written for the other
        replicas; 429 while the workspace holds ``per_workspace`` revoked one by one."""
        held = self._sessions.get(workspace_id, {})
        if session_id not in held and len(held) >= self.per_workspace:
            raise RateLimited.after(
                min(held.values()) - self._clock(),
                f"This workspace has revoked {self.per_workspace} portal sessions one by one"
                " within a session's life; revoke them all (DELETE /v1/portal-sessions) or"
                " retry after {} s.",
            )
        await self._write(self._record(workspace_id, session_id))

    async def revoke_all(self, workspace_id: str) -> None:
        """Revoke every session of ``workspace_id`` issued until now (sessions opened later
        are not touched); held here at once, then written for the other replicas."""
        await self._write(self._record(workspace_id, None))

    def _record(self, workspace_id: str, session_id: str | None) -> PortalRevocation:
        now = self._clock()
        return PortalRevocation(
            workspace_id=workspace_id,
            session_id=session_id,
            before_ms=int(now * 1000),
            until=now + self.ttl_s + 2.0,  # the token expiry's rounding
        )

    async def _write(self, record: PortalRevocation) -> None:
        self._apply(record)
        await self.send(record.record_key, record.model_dump_json().encode())

    # -- expiry ------------------------------------------------------------------------------

    def expired(self) -> list[str]:
        """Drop the records past ``until`` from the view; their keys, to tombstone."""
        now = self._clock()
        gone = [f"ps_ws/{ws}" for ws, (_, until) in self._cutoffs.items() if until <= now]
        for key in gone:
            del self._cutoffs[key.removeprefix("ps_ws/")]
        for workspace_id, sessions in list(self._sessions.items()):
            for session_id, until in list(sessions.items()):
                if until <= now:
                    self._forget_session(workspace_id, session_id)
                    gone.append(f"ps_s/{workspace_id}/{session_id}")
        return gone

    async def sweep(self) -> None:
        """Drop the expired records and tombstone them (every replica does: harmless twice)."""
        await self.tombstone(self.expired())


def session_claims(
    token: str,
    tokens: PortalTokens | None,
    keys: KeyStore,
    revocations: PortalRevocations | None,
) -> PortalClaims | None:
    """The claims of a portal session in force (``PortalTokens.bound``) and not revoked, else
    ``None``."""
    claims = None if tokens is None else tokens.verify(token)
    if claims is None or tokens is None:
        return None
    if not tokens.bound(claims, keys.entry_in_force(claims.key_id, claims.workspace_id)):
        return None
    if revocations is not None and revocations.revoked(claims):
        return None
    return claims


__all__ = [
    "KEY_PREFIX",
    "MAX_REVOKED_PER_WORKSPACE",
    "MAX_TRACKED",
    "MAX_WORKSPACES",
    "PortalRevocation",
    "PortalRevocations",
    "session_claims",
]
