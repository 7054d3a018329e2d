"""``POST .../replay``: re-send an endpoint's past events. A bounded background scan of
auth.status and auth.errors (from ``since`` by the timestamp index to the high-water mark of
its start) turns matching events into ``Replay`` records the dispatcher delivers under their
original webhook-ids; quotas per workspace and process refuse with 429 (docs/operations.md,
"Quotas"). Progress and cancellation, on every replica: ``worker.api.webhooks.replay_status``.
The scan itself is the webhook library's (``worker.webhooks.replay_scan``), shared with the
dispatcher's recovery of an endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import InitVar, dataclass
from datetime import datetime
from typing import Final, Literal

from worker.api.webhooks.quotas import REPLAY_CAPACITY, REPLAYS, Refused
from worker.api.webhooks.replay_status import PROGRESS_EVERY_S, ReplayBoard, ending
from worker.contract.webhook_endpoints import EndpointRecord
from worker.runtime.admission import Admission, Share, Slot
from worker.runtime.logs import get_logger
from worker.webhooks.replay_scan import (
    REPLAY_TIMEOUT_S,
    ReplayProgress,
    ReplayScan,
    ReplayState,
    progress_record,
)

log = get_logger(__name__)

MAX_RUNNING: Final = 2
MAX_QUEUED: Final = 8
PER_WORKSPACE: Final = 2
#: ``Retry-After`` of a refusal: a replay takes seconds to minutes (``REPLAY_TIMEOUT_S`` at most).
RETRY_AFTER_S: Final = 30


def new_replay_id() -> str:
    """``rp_`` + 32 hex characters: one per request, carried by every record it produces."""
    return f"rp_{uuid.uuid4().hex}"


@dataclass(eq=False, kw_only=True)
class ReplayRunner:
    """Runs replays as background tasks of this process (see the module docstring).

    ``scan``: the scan it runs (worker.webhooks.replay_scan, shared with the dispatcher's recovery).
    ``board``: where its replays' progress is written; the board's presence holds the
    workspace's quota across the live replicas, a slot claimed there before a replay starts.
    """

    board: ReplayBoard
    scan: ReplayScan
    max_running: InitVar[int] = MAX_RUNNING
    max_queued: InitVar[int] = MAX_QUEUED
    per_workspace: int = PER_WORKSPACE
    progress_every_s: float = PROGRESS_EVERY_S

    def __post_init__(self, max_running: int, max_queued: int) -> None:
        self._cancelling: set[str] = set()  # replays here whose cancellation was asked for
        # Replays admitted (running or queued) through the one admission rule: a workspace
        # holds at most ``per_workspace``, and a quarter stays for workspaces holding none.
        # Admitted replays run in arrival order, one per workspace at a time (its lock).
        self._slots = asyncio.Semaphore(max_running)
        capacity = max_running + max_queued
        self._admission = Admission(
            "webhook-replays",
            Share.capped(capacity, self.per_workspace),
            retry_after_s=RETRY_AFTER_S,
        )
        self._admitted: dict[str, Slot] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Per workspace with a replay admitted (``_admission.held``): the lock they run under.
        self._workspaces: dict[str, asyncio.Lock] = {}

    @property
    def active(self) -> int:
        """Replays running or waiting for a slot."""
        return len(self._tasks)

    async def begin(self, endpoint: EndpointRecord, since: datetime) -> str:
        """Queue a replay of ``endpoint``'s events since ``since``; its id.

        Raises ``Refused`` (429, ``Retry-After``) when the workspace already has
        ``per_workspace`` replays in flight (here, or across the live replicas), or this
        process ``max_running + max_queued``: a limit, not a fault of the request, so retrying
        later is the right reaction.
        """
        workspace_id = endpoint.workspace_id
        self._refuse_over(workspace_id)
        if not await self.board.presence.claim(workspace_id, self.per_workspace):
            raise _over_quota(self.per_workspace)
        replay_id, created = new_replay_id(), time.time()
        try:  # readable on every replica before the 202
            queued = progress_record(replay_id, endpoint, since, "queued", created)
            await self.board.publish(queued)
            self._refuse_over(workspace_id)  # again: others may have been admitted meanwhile
            self._admitted[replay_id] = self._admission.take(workspace_id)
        except BaseException:
            self.board.presence.release(workspace_id)
            raise
        lock = self._workspaces.setdefault(workspace_id, asyncio.Lock())
        task = asyncio.create_task(self._run(queued, endpoint, since, lock), name=replay_id)
        self._tasks[replay_id] = task
        task.add_done_callback(lambda _: self._ended(replay_id, workspace_id))
        return replay_id

    def _refuse_over(self, workspace_id: str) -> None:
        """``Refused`` when the admission rule has no room for one more of the workspace's."""
        count = self._admission.held(workspace_id)
        if count >= self.per_workspace:
            raise _over_quota(count)
        if self._admission.share.refusal(count, self._admission.in_use) is not None:
            raise Refused.too_many(
                REPLAY_CAPACITY,
                "Too many replays are in progress on this service; retry shortly."
                " Nothing was started.",
                RETRY_AFTER_S,
            )

    def _ended(self, replay_id: str, workspace_id: str) -> None:
        self.board.presence.release(workspace_id)
        self._tasks.pop(replay_id, None)
        self._admitted.pop(replay_id).release()
        if self._admission.held(workspace_id) == 0:
            del self._workspaces[workspace_id]

    def cancel(self, replay_id: str) -> bool:
        """Cancel a replay of this process (asked for on any replica); whether it ran here."""
        task = self._tasks.get(replay_id)
        if task is None:
            return False
        self._cancelling.add(replay_id)
        task.cancel()
        return True

    async def stop(self) -> None:
        """Cancel every replay (shutdown: before the producer closes)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.scan.aside.drain()

    # -- one replay ---------------------------------------------------------------------------

    async def _run(
        self, queued: ReplayProgress, endpoint: EndpointRecord, since: datetime, turn: asyncio.Lock
    ) -> None:
        """Run the replay ``queued`` announced; each of its records keeps that one's
        ``created_at``."""
        replay_id, created = queued.replay_id, queued.created_at
        # replayed (acknowledged), scanned, found: kept outside the scan so a time-out can tell
        counts = [0, 0, 0]
        started = time.perf_counter()
        state: Literal["finished", "timed_out", "failed", "cancelled"] = "failed"
        phase: list[ReplayState] = ["queued"]
        follower = self.board.follow(  # the replay's progress writes, and its cancellation
            replay_id,
            lambda: progress_record(replay_id, endpoint, since, phase[0], created, counts),
            lambda: self.cancel(replay_id),
            self.progress_every_s,
        )
        try:
            async with turn, self._slots:
                phase[0] = "running"
                try:
                    async with asyncio.timeout(REPLAY_TIMEOUT_S):
                        await self.scan.run(replay_id, endpoint, since, counts)
                    state = "finished"
                except TimeoutError:
                    state = "timed_out"
        except asyncio.CancelledError:
            state = "cancelled"
            raise
        except Exception as exc:
            log.error(
                "webhook_replay_failed",
                replay_id=replay_id,
                endpoint_id=endpoint.id,
                error=repr(exc),
            )
        finally:
            seconds = round(time.perf_counter() - started, 3)
            follower.cancel()
            done = self._ending(queued, endpoint, since, state, counts)
            with contextlib.suppress(BaseException):  # shielded: written when cancelled too
                await asyncio.shield(asyncio.ensure_future(self.board.publish(done)))
            self._cancelling.discard(replay_id)
            log.info(
                "webhook_replay_ended",
                replay_id=replay_id,
                endpoint_id=endpoint.id,
                workspace_id=endpoint.workspace_id,
                state=state,
                events_replayed=counts[0],
                events_scanned=counts[1],
                seconds=seconds,
            )

    # -- progress, where every replica reads it -------------------------------------------------

    def _ending(
        self,
        queued: ReplayProgress,
        endpoint: EndpointRecord,
        since: datetime,
        outcome: str,
        counts: list[int],
    ) -> ReplayProgress:
        """The record of how the replay ended."""
        rid = queued.replay_id
        state, error = ending(outcome, rid in self._cancelling, REPLAY_TIMEOUT_S)
        failed = 0 if state in ("done", "cancelled") else max(counts[2] - counts[0], 0)
        more = {"events_failed": failed, "error": error}
        return progress_record(rid, endpoint, since, state, queued.created_at, counts, **more)


def _over_quota(count: int) -> Refused:
    return Refused.too_many(
        REPLAYS,
        f"The workspace already has {count} replays in progress, its quota;"
        " retry when one has ended. Nothing was started.",
        RETRY_AFTER_S,
    )


__all__ = [
    "MAX_QUEUED",
    "MAX_RUNNING",
    "PER_WORKSPACE",
    "REPLAY_TIMEOUT_S",
    "ReplayRunner",
    "new_replay_id",
]
