"""Committing the consume loop's progress: the completion watermark of each owned input
partition (``worker.engine.offsets``), the holds on it and their overdue calls, the periodic and
the last commit, and the lag they leave (docs/architecture.md, "Watermark commits")."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from worker.engine.offsets import Hold, OffsetTracker
from worker.runtime.logs import get_logger

# The lines are the consume loop's: they keep its logger name, which dashboards and searches use.
log = get_logger("worker.engine.consume_loop")


@dataclass(eq=False)
class Commits:
    """The trackers of the owned input partitions (one per topic-partition, made on its first
    dispatched record) and the holds taken on them, in the order they were taken."""

    consumer: AIOKafkaConsumer
    _: KW_ONLY
    #: The loop's series (``LoopSeries``): ``lag``.
    metrics: Any
    hold_overdue_s: float
    final_timeout_s: float
    trackers: dict[TopicPartition, OffsetTracker] = field(default_factory=dict, init=False)
    holds: deque[Hold] = field(default_factory=deque, init=False)

    def tracker(self, tp: TopicPartition) -> OffsetTracker:
        """The tracker of ``tp``, made on first use (not ``setdefault``: that would build one
        for every record)."""
        tracker = self.trackers.get(tp)
        if tracker is None:
            tracker = self.trackers[tp] = OffsetTracker()
        return tracker

    async def commit_tick(self) -> None:
        """The periodic commit, after asking the owners of overdue holds to release them."""
        self.overdue_holds(time.monotonic() - self.hold_overdue_s)
        await self.commit()

    def overdue_holds(self, older_than: float) -> None:
        """Call ``on_overdue`` of every live hold taken before ``older_than`` (holds are kept
        in the order they were taken; released and revoked ones are just dropped)."""
        holds = self.holds
        while holds and holds[0].since <= older_than:
            hold = holds.popleft()
            if hold.on_overdue is None or not hold.holds(self.trackers.get(hold.tp)):
                continue
            try:
                hold.on_overdue()
            except Exception as exc:  # the hold stays: its offset is just not committed
                log.error("hold_overdue_failed", offset=hold.offset, error=repr(exc)[:300])
        while holds and holds[0].released:
            holds.popleft()

    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit every owned partition's watermark that moved; update lag."""
        marks = {tp: t.watermark() for tp, t in self.trackers.items() if only is None or tp in only}
        offsets = {tp: m for tp, m in marks.items() if m not in (None, self.trackers[tp].committed)}
        if offsets:
            await self.consumer.commit(offsets)
            for tp, mark in offsets.items():
                committed = self.trackers.get(tp)
                if committed is not None:  # revoked while the commit was in flight
                    committed.committed = mark
        for tp, tracker in list(self.trackers.items()):
            high = self.consumer.highwater(tp)
            if high is not None and tracker.committed is not None:
                self.metrics.lag.labels(tp.topic, str(tp.partition)).set(
                    max(0, high - tracker.committed)
                )

    async def final_commit(self) -> None:
        """The last commit before leaving, bounded in time and never fatal: a refused or
        unanswered one loses nothing (the next owner replays past the last watermark, answered
        from the dedup window), and raising would make a clean SIGTERM a non-zero exit."""
        try:
            await asyncio.wait_for(self.commit(), timeout=self.final_timeout_s)
        except (KafkaError, TimeoutError) as exc:
            log.warning("final_commit_failed", error=repr(exc))

    async def revoked(self, tps: Iterable[TopicPartition]) -> None:
        """Commit what ``tps`` finished, then forget their trackers and lag series."""
        mine = set(tps)
        try:
            await self.commit(only=mine)
        except KafkaError as exc:
            log.warning("commit_on_revoke_failed", error=repr(exc))
        for tp in mine:
            self.trackers.pop(tp, None)
            with contextlib.suppress(KeyError):
                self.metrics.lag.remove(tp.topic, str(tp.partition))
