"""Running one unit of work of the consume loop (a record, or a key's due follow-up) so that a
fault about it stays with it: retried with a doubling pause, then the record dead-lettered or
the follow-up given up; only a process fault ends the process (docs/architecture.md, "Failure
handling")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from worker.engine.commits import Commits
from worker.engine.dead_letter import DeadLetterLost
from worker.engine.faults import Fault, is_permanent, is_process_fault
from worker.engine.handler import Handler
from worker.engine.lanes import DUE, LOGGED_KEY_CHARS, LaneItem, Unreadable
from worker.engine.offsets import HANDLING, Handling
from worker.runtime.logs import get_logger

# The lines are the consume loop's: they keep its logger name, which dashboards and searches use.
log = get_logger("worker.engine.consume_loop")


class Revoked(Exception):
    """The partition of a unit being retried was revoked: its next owner retries it."""


@dataclass(eq=False)
class Units:
    """Runs units of work for one loop. ``active`` is read at each retry: a unit of a partition
    let go meanwhile stops retrying (``Revoked``)."""

    executor: Handler
    _: KW_ONLY
    metrics: Any
    commits: Commits
    active: Callable[[], set[int]]
    attempts: int
    backoff: Callable[[int], float]

    async def run(self, key: str, partition: int, item: LaneItem) -> Iterable[str] | None:
        """Run one unit of work (a record, or ``key``'s follow-up when ``item`` is ``DUE``) so
        that a fault about it stays with it: retried with a pause, then recovered or given up.
        A process fault propagates (the lane then stops the loop)."""
        stage = "follow_up" if item is DUE else "record"
        if isinstance(item, Unreadable):
            log.error(
                "record_unreadable", partition=partition, offset=item.offset, error=item.error
            )
            await self._recover(item, Fault("unreadable", item.error[:300]), key, partition)
            return None
        attempt = 1
        while True:
            try:
                if item is DUE:
                    await self.executor.follow_up(partition, key)
                    return None
                # ``Handler.handle`` with the record in context, so that it may
                # ``hold_record`` (set here, not in a coroutine around it: a frame fewer).
                tp = TopicPartition(item.topic, item.partition)
                tracker = self.commits.trackers.get(tp)
                if tracker is None:
                    return await self.executor.handle(item)
                token = HANDLING.set(Handling(self.commits.holds, tp, tracker, item.offset))
                try:
                    return await self.executor.handle(item)
                finally:
                    HANDLING.reset(token)
            except BaseException as exc:
                if is_process_fault(exc):  # a cancellation among them: not an Exception
                    raise
                where = {"stage": stage, "key": key[:LOGGED_KEY_CHARS], "partition": partition}
                where |= {"attempt": attempt, "offset": getattr(item, "offset", None)}
                if attempt < self.attempts and not is_permanent(exc):
                    log.warning("unit_failed_retrying", error=repr(exc)[:300], **where)
                    self.metrics.unit_failures.labels(stage, "retried").inc()
                    await asyncio.sleep(self.backoff(attempt))
                    if partition not in self.active():
                        raise Revoked from exc
                    attempt += 1
                    continue
                fault = Fault.of(exc, attempts=attempt)
                log.error("unit_failed", exc_info=exc, **fault.logged(), **where)
                if item is not DUE:
                    await self._recover(item, fault, key, partition)
                else:
                    await self._give_up(partition, key, fault)
                return None

    async def _recover(
        self, item: ConsumerRecord[bytes, bytes], fault: Fault, key: str, partition: int
    ) -> None:
        """Hand a record that failed for good to the handler's ``recover`` (its dead letter).
        A dead letter the topic refused even in its minimal form (``DeadLetterLost``) is
        counted (``unit_failures{stage="record",outcome="dead_letter_lost"}``) and logged,
        and the record let go all the same: only its copy is lost, and holding the lane on it
        would stop the key, and the loop, for good (docs/architecture.md, "Failure
        handling"). Anything else ``recover`` raises still ends the loop."""
        try:
            await self.executor.recover(item, fault)
        except DeadLetterLost as exc:
            where = {"key": key[:LOGGED_KEY_CHARS], "partition": partition, "offset": item.offset}
            log.error("dead_letter_lost", error=exc.detail, **fault.logged(), **where)
            self.metrics.unit_failures.labels("record", "dead_letter_lost").inc()
            return
        self.metrics.unit_failures.labels("record", "dead_lettered").inc()

    async def _give_up(self, partition: int, key: str, fault: Fault) -> None:
        """Postpone a due key that keeps failing; a failure to postpone is only logged (the
        timer brings the key back, and nothing is committed for a due key)."""
        self.metrics.unit_failures.labels("follow_up", "given_up").inc()
        try:
            await self.executor.give_up(partition, key, fault)
        except BaseException as exc:
            if is_process_fault(exc):  # a cancellation among them: not an Exception
                raise
            log.error(
                "give_up_failed",
                key=key[:LOGGED_KEY_CHARS],
                partition=partition,
                error=repr(exc)[:300],
            )
