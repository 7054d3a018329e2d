"""Replays that can be followed from any front-end replica: the runner writes a replay's
progress to the compacted ``api.presence`` topic under its id, every replica's presence tail
hands those records to its ``ReplayBoard``, and a cancellation (key ``<id>/cancel``) is
honoured by the replica that runs it. Bounded per workspace, by age and in all; a replay whose
runner went silent reads as failed (docs/architecture.md, "Following a replay")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final, Literal

from pydantic import Field

from worker.api.presence import Presence
from worker.api.webhooks.quotas import REPLAY_CAPACITY, Refused
from worker.contract.messages import Identifier, TopicRecord
from worker.engine.compacted_view import ViewPart
from worker.webhooks.replay_scan import (
    PROGRESS_EVERY_S,
    REPLAY_ID_RE,
    ReplayProgress,
    ReplayState,
    following,
)

#: Every key on ``api.presence`` that is a replay's (the presence tail hands them here).
KEY_PREFIX: Final = b"rp_"
CANCEL_SUFFIX: Final = "/cancel"
KEPT_PER_WORKSPACE: Final = 20
KEPT_FOR_S: Final = 24 * 3600.0
MAX_TRACKED: Final = 10_000
STALE_AFTER_S: Final = 15 * PROGRESS_EVERY_S
SWEEP_EVERY_S: Final = 60.0
STALLED: Final = "the front-end replica running the replay stopped"
STALLED_RECOVERY: Final = "the dispatcher recovering the endpoint stopped; the next resumes it"


class ReplayCancel(TopicRecord):
    """A request to cancel a replay (key: ``<replay id>/cancel``)."""

    type: Literal["webhook_replay_cancel"] = "webhook_replay_cancel"
    replay_id: str = Field(pattern=REPLAY_ID_RE.pattern)
    workspace_id: Identifier
    at: float


def ending(outcome: str, cancel_asked: bool, timeout_s: float) -> tuple[ReplayState, str | None]:
    """The public state (and error) of a replay the runner ended as ``outcome`` (finished,
    timed_out, failed, cancelled): a cancellation nobody asked for is the replica stopping."""
    if outcome == "finished":
        return "done", None
    if outcome == "cancelled" and cancel_asked:
        return "cancelled", None
    if outcome == "timed_out":
        return "failed", f"timed out after {timeout_s:g} s"
    if outcome == "cancelled":
        return "failed", STALLED
    return "failed", "internal error"


class ReplayBoard(ViewPart):
    """Every replica's view of the replays' progress, and the writes to it (see the module
    docstring). ``presence`` (unstarted) reads the topic, hands the replays' records here and
    writes the board's with its own producer and broker health; ``clock`` (wall clock) is
    injectable."""

    def __init__(
        self,
        presence: Presence,
        *,
        clock: Callable[[], float] = time.time,
        kept_per_workspace: int = KEPT_PER_WORKSPACE,
        kept_for_s: float = KEPT_FOR_S,
        max_tracked: int = MAX_TRACKED,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        super().__init__(presence, KEY_PREFIX, name="webhook-replay", sweep_every_s=SWEEP_EVERY_S)
        self.presence = presence
        self._clock = clock
        self.kept_per_workspace = kept_per_workspace
        self.kept_for_s = kept_for_s
        self.max_tracked = max_tracked
        self.stale_after_s = stale_after_s
        self._replays: dict[str, ReplayProgress] = {}
        self._cancels: set[str] = set()

    def __len__(self) -> int:
        return len(self._replays)

    # -- reading ---------------------------------------------------------------------------------

    def take(self, msg: Any) -> None:
        """One record of a replay, as the presence tail read it."""
        key = (msg.key or b"").decode("utf-8", "replace")
        if msg.value is None:
            if key.endswith(CANCEL_SUFFIX):
                self._cancels.discard(key.removesuffix(CANCEL_SUFFIX))
            else:
                self._replays.pop(key, None)
        elif key.endswith(CANCEL_SUFFIX):
            cancel = self.decoded(ReplayCancel.model_validate_json, msg.value)
            if cancel is not None and cancel.replay_id in self._replays:
                self._cancels.add(cancel.replay_id)
        elif (progress := self.decoded(ReplayProgress.model_validate_json, msg.value)) is not None:
            self._apply(progress)

    def _apply(self, progress: ReplayProgress) -> bool:
        """Keep ``progress``; false when it is of a new replay and ``max_tracked`` are held."""
        held = self._replays.get(progress.replay_id)
        if held is None and len(self._replays) >= self.max_tracked:
            return False
        if held is not None and held.ended and not progress.ended:
            return True  # a late progress record never reopens an ended replay
        if held is not None and progress.updated_at < held.updated_at and not progress.ended:
            return True
        self._replays[progress.replay_id] = progress
        return True

    def get(self, workspace_id: str, endpoint_id: str, replay_id: str) -> ReplayProgress | None:
        """The replay as the caller may see it: ``None`` unless it is of ``workspace_id`` and
        ``endpoint_id`` and still kept; a queued or running replay whose runner went silent
        reads as failed."""
        progress = self._replays.get(replay_id)
        if (
            progress is None
            or progress.workspace_id != workspace_id
            or progress.endpoint_id != endpoint_id
        ):
            return None
        now = self._clock()
        if now - progress.updated_at > self.kept_for_s:
            return None
        requested = progress.cancel_requested or replay_id in self._cancels
        if not progress.ended and now - progress.updated_at > self.stale_after_s:
            error = STALLED_RECOVERY if progress.recovery else STALLED
            update = {"state": "failed", "error": error, "cancel_requested": requested}
            return progress.model_copy(update=update)
        return progress.model_copy(update={"cancel_requested": requested})

    def cancel_requested(self, replay_id: str) -> bool:
        return replay_id in self._cancels

    async def seen(self, replay_id: str, timeout: float) -> bool:
        """Whether ``replay_id`` is known here, waiting up to ``timeout`` for this replica to
        read it (a replay started on another replica a moment ago)."""
        return await self.presence.until(lambda: replay_id in self._replays, timeout)

    # -- writing ---------------------------------------------------------------------------------

    async def publish(self, progress: ReplayProgress) -> None:
        """Write ``progress`` (acknowledged) and apply it here at once (read-your-writes);
        ``Refused`` (429), nothing written, for a new replay while ``max_tracked`` are held."""
        if not self._apply(progress):
            raise Refused.too_many(
                REPLAY_CAPACITY,
                "Too many replays are kept on this service; retry later. Nothing was started.",
                60,
            )
        await self.send(progress.replay_id, progress.model_dump_json().encode())

    async def request_cancel(self, progress: ReplayProgress) -> None:
        """Ask whichever replica runs ``progress`` to cancel it."""
        cancel = ReplayCancel(
            replay_id=progress.replay_id, workspace_id=progress.workspace_id, at=self._clock()
        )
        self._cancels.add(progress.replay_id)
        await self.send(progress.replay_id + CANCEL_SUFFIX, cancel.model_dump_json().encode())

    def follow(
        self,
        replay_id: str,
        progress: Callable[[], ReplayProgress],
        cancel: Callable[[], object],
        every_s: float,
    ) -> asyncio.Task[None]:
        """A running replay's progress notes (``following``); ``cancel`` it instead once a
        cancellation was asked for (on any replica)."""

        def asked() -> bool:
            if self.cancel_requested(replay_id):
                cancel()
                return True
            return False

        write = following(lambda: self.publish(progress()), every_s, asked)
        return asyncio.create_task(write, name=f"{replay_id}-progress")

    def expired(self) -> list[str]:
        """Replay ids past their keeping: older than ``kept_for_s``, or ended and beyond the
        newest ``kept_per_workspace`` of their workspace."""
        now = self._clock()
        by_workspace: dict[str, list[ReplayProgress]] = {}
        out = []
        for progress in self._replays.values():
            if now - progress.updated_at > self.kept_for_s:
                out.append(progress.replay_id)
            else:
                by_workspace.setdefault(progress.workspace_id, []).append(progress)
        for kept in by_workspace.values():
            kept.sort(key=lambda p: p.created_at, reverse=True)
            out += [p.replay_id for p in kept[self.kept_per_workspace :] if p.ended]
        return out

    async def sweep(self) -> int:
        """Tombstone (both keys) and forget every expired replay; how many."""
        gone = self.expired()
        for replay_id in gone:
            self._replays.pop(replay_id, None)
            self._cancels.discard(replay_id)
            await self.tombstone((replay_id, replay_id + CANCEL_SUFFIX))
        return len(gone)


__all__ = [
    "KEPT_FOR_S",
    "KEPT_PER_WORKSPACE",
    "MAX_TRACKED",
    "PROGRESS_EVERY_S",
    "ReplayBoard",
    "ReplayCancel",
    "ending",
]
