"""Long-polls parked where the state lives; each holds an admission slot until its answer is
acknowledged, and past a cap is answered at once (docs/architecture.md, "Long-polls")."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

from worker.auth.flow import Decision, answer_query, is_owner
from worker.auth.metrics import WorkerMetrics
from worker.auth.publish import Publisher
from worker.auth.store import StateStore
from worker.contract.messages import SLACK_SHARE, AccountRecord, GetAuthState
from worker.runtime.admission import Admission, NoRoom, Share, Slot
from worker.runtime.logs import get_logger

log = get_logger(__name__)

#: How a parked wait ended (the ``reason`` label of ``passkey_auth_parked_waits_ended``, each
#: series created at zero from ``WAIT_END_REASONS``).
EndReason = Literal["changed", "timeout", "cap", "revoked", "stop"]

#: Parked waits per process, per workspace and per account (``WORKER_PARKED_WAITS_*``).
PARKED_MAX: Final = 10_000
PARKED_PER_WORKSPACE: Final = 1_000
PARKED_PER_ACCOUNT: Final = 64
#: How long the stop waits for the last answers to be acknowledged before the producer closes.
STOP_BUDGET_S: Final = 5.0


#: The account's open publication window, if any (``Executor._windows``).
WindowOf = Callable[[tuple[int, str]], "asyncio.Future[None] | None"]


@dataclass(frozen=True, slots=True)
class WaitLimits:
    """The caps of parked waits: per process, per workspace, per account."""

    process: int = PARKED_MAX
    per_workspace: int = PARKED_PER_WORKSPACE
    per_account: int = PARKED_PER_ACCOUNT

    def share(self) -> Share:
        """A quarter of the process's cap kept for workspaces holding none, so one workspace
        at its share cannot starve the rest."""
        reserve = self.process // 4 if self.per_workspace < self.process else 0
        return Share(
            capacity=self.process,
            per_owner=min(self.per_workspace, self.process),
            reserve=min(reserve, self.process - 1),
        )


@dataclass(eq=False, slots=True)
class _Wait:
    partition: int
    query: GetAuthState
    after: int
    reply_to: int | None
    slot: Slot
    ended: bool = False
    #: The slot (its due time) whose timer answers this wait when its time is up.
    due: float | None = None

    @property
    def key(self) -> tuple[int, str]:
        return self.partition, self.query.account_id


@dataclass(eq=False)
class ParkedWaits:
    """The worker's parked long-polls (see the module docstring)."""

    store: StateStore
    publisher: Publisher
    metrics: WorkerMetrics
    window_of: WindowOf
    limits: WaitLimits = field(default_factory=WaitLimits)

    def __post_init__(self) -> None:
        self.store.before_drop = self.revoked
        self.admission = Admission("parked_waits", self.limits.share())
        #: ≤ ``per_account`` per (partition, account); all ≤ the process's cap (admission).
        self.waits: dict[tuple[int, str], list[_Wait]] = {}
        #: The parked waits by the slot their time-out falls in, and each slot's one timer.
        self.slots: dict[float, tuple[set[_Wait], asyncio.TimerHandle]] = {}
        #: Answers being sent, one task for those ended in one pass (a slot's time-outs);
        #: each holds its waits' slots until acknowledged. ``_batch``: the one still open.
        self.sends: set[asyncio.Task[None]] = set()
        self._batch: list[tuple[_Wait, Decision]] | None = None
        self.parked = 0
        self._closed = False

    # -- parking ------------------------------------------------------------------------------

    def park(
        self,
        partition: int,
        query: GetAuthState,
        record: AccountRecord | None,
        reply_to: int | None,
    ) -> bool:
        """Park ``query`` when it asks to wait and has something to wait for; False when it
        is to be answered at once (no wait asked, nothing to wait on, past a cap, stopping)."""
        if not query.wait_ms or record is None or record.deregistered:
            return False
        if not is_owner(record, query):
            return False  # answered 404 at once, as for an unknown account
        after = record.version if query.after_version is None else query.after_version
        if record.version > after:
            return False  # already past it
        if self._closed:
            self._ended("stop")
            return False
        key = (partition, query.account_id)
        waiting = self.waits.get(key)
        if waiting is not None and len(waiting) >= self.limits.per_account:
            self._ended("cap")
            return False
        try:
            slot = self.admission.take(query.workspace_id)
        except NoRoom:
            self._ended("cap")
            return False
        wait = _Wait(partition, query, after, reply_to, slot)
        self._arm(wait, query.wait_ms / 1000)
        self.waits.setdefault(key, []).append(wait)
        self.parked += 1
        self.metrics.parked_waits.inc()
        return True

    # -- ending -------------------------------------------------------------------------------

    def changed(self, partition: int, record: AccountRecord) -> None:
        """``record`` was just stored: answer the waits it takes past their version, from it."""
        waiting = self.waits.get((partition, record.account_id))
        if not waiting:
            return
        for wait in [w for w in waiting if w.after < record.version]:
            self._end(wait, "changed", record)

    def revoked(self, partition: int) -> None:
        """``partition`` is being dropped: answer its waits with the state as it is (their
        callers ask again, and the new owner answers)."""
        for wait in [w for key, ws in self.waits.items() if key[0] == partition for w in ws]:
            self._end_as_is(wait, "revoked")

    async def close(self, budget_s: float = STOP_BUDGET_S) -> None:
        """The process stops: answer every wait with the state as it is and wait (within
        ``budget_s``) for the answers to be acknowledged, before the producer closes."""
        self._closed = True
        for wait in [w for ws in self.waits.values() for w in ws]:
            self._end_as_is(wait, "stop")
        if not self.sends:
            return
        _, pending = await asyncio.wait(set(self.sends), timeout=budget_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("parked_answers_abandoned", answers=len(pending))
            await asyncio.gather(*pending, return_exceptions=True)

    def _arm(self, wait: _Wait, wait_s: float) -> None:
        """Put ``wait`` in the slot its time-out falls in: the first slot boundary past its
        time, slots ``SLACK_SHARE * wait_s`` apart (3 s at 30 s). Time-outs of one slot are
        answered in one pass and one produce request, and their callers' next asks arrive
        together; a time-out says nothing changed, so its lateness goes unseen."""
        loop = asyncio.get_running_loop()
        slack = SLACK_SHARE * wait_s
        deadline = loop.time() + wait_s
        due = math.ceil(deadline / slack) * slack if slack > 0 else deadline
        held = self.slots.get(due)
        if held is None:
            held = self.slots[due] = (set(), loop.call_at(due, self._slot_due, due))
        held[0].add(wait)
        wait.due = due

    def _slot_due(self, due: float) -> None:
        """A slot's time is up: every wait in it timed out, answered in this one pass (a slot
        emptied earlier took its timer with it; its waits are all parked)."""
        waits, _ = self.slots.pop(due)
        for wait in waits:
            wait.due = None
            self._timed_out(wait)

    def _disarm(self, wait: _Wait) -> None:
        if wait.due is None:
            return
        waits, timer = self.slots[wait.due]
        waits.discard(wait)
        if not waits:
            timer.cancel()
            del self.slots[wait.due]
        wait.due = None

    def _timed_out(self, wait: _Wait) -> None:
        """The wait's time is up: answer with the state as it is, or, while the account's
        changed record is being sent, once it is stored."""
        window = self.window_of(wait.key)
        if window is not None and not window.done():
            window.add_done_callback(lambda _: self._end_as_is(wait, "timeout"))
            return
        self._end_as_is(wait, "timeout")

    def _end_as_is(self, wait: _Wait, reason: EndReason) -> None:
        self._end(wait, reason, self.store.get(*wait.key))

    def _end(self, wait: _Wait, reason: EndReason, record: AccountRecord | None) -> None:
        if wait.ended:
            return
        wait.ended = True
        self._disarm(wait)
        waiting = self.waits.get(wait.key)
        if waiting is not None:
            waiting.remove(wait)
            if not waiting:
                del self.waits[wait.key]
        self.parked -= 1
        self.metrics.parked_waits.dec()
        self._ended(reason)
        decision = answer_query(record, wait.query)
        if self._batch is None:  # the first answer of this pass: its task takes the rest too
            self._batch = []
            task = asyncio.get_running_loop().create_task(self._answer(self._batch))
            self.sends.add(task)
            task.add_done_callback(self.sends.discard)
        self._batch.append((wait, decision))

    async def _answer(self, batch: list[tuple[_Wait, Decision]]) -> None:
        """The answers ended before this task's first step (its batch), under one ack wait."""
        self._batch = None
        try:
            await self.publisher.answer([(decision, wait.reply_to) for wait, decision in batch])
        except Exception as exc:  # the callers' own deadlines answer them
            for wait, _ in batch:
                log.warning(
                    "parked_answer_failed",
                    account_id=wait.query.account_id,
                    command_id=wait.query.command_id,
                    error=repr(exc),
                )
        finally:
            for wait, _ in batch:
                wait.slot.release()

    def _ended(self, reason: EndReason) -> None:
        self.metrics.parked_waits_ended.labels(reason).inc()
