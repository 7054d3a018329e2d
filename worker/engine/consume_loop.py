"""The consume loop of the worker and the webhook dispatcher: fetch, hand each record to the
lane of its partition and key, commit the completion watermark, drive due timers, restore on
assignment. The loop owns order, concurrency, offsets and rebalances; what a record means is
the ``Handler``'s (docs/architecture.md, "The consume engine", "Per-account lanes", "Watermark
commits", "Rebalances", "Failure handling"). Its parts: what a lane holds (``lanes``), the
in-flight bound and each key's share of it (``pressure``), one unit of work and its retries
(``units``), the watermark commits (``commits``), taking partitions on (``assignment``).
Over 500 lines: dispatch, lanes, batch units and rebalances share the loop's state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord

from worker.engine.assignment import RestoreConsumerFactory, report_restored, restore
from worker.engine.commits import Commits
from worker.engine.faults import is_process_fault
from worker.engine.fetch import GapWatch, gap_logger
from worker.engine.fetch import getmany as fetch_records
from worker.engine.handler import Handler
from worker.engine.lanes import DUE, LOGGED_KEY_CHARS, Lane, LaneItem, Unreadable
from worker.engine.metrics import LoopSeries
from worker.engine.pressure import Pressure, input_partitions
from worker.engine.units import Revoked, Units
from worker.runtime.logs import get_logger

log = get_logger(__name__)

#: The records of one fetched partition handed to ``Handler.handle_batch`` as one unit of
#: work, each with its key and the lane the unit holds for it.
Unit: TypeAlias = list[tuple[str, Lane, ConsumerRecord[bytes, bytes]]]
Release: TypeAlias = Callable[[list[ConsumerRecord[bytes, bytes]], bool], None]
Batch: TypeAlias = Callable[[list[ConsumerRecord[bytes, bytes]], Release], Awaitable[None]]

#: Upper bound of the last commit after the drain; part of ``runner.shutdown_hard_limit``.
FINAL_COMMIT_TIMEOUT_S = 5.0

#: The default share of the in-flight bound one lane key may hold (``LoopConfig.key_share``):
#: a twentieth of the bound, at least this many (never more than the bound itself).
KEY_SHARE_FLOOR = 16
KEY_SHARE_DIVISOR = 20


def default_key_share(max_in_flight: int) -> int:
    """``max(16, max_in_flight // 20)``, capped at ``max_in_flight``: 50 for the default 1000."""
    return min(max_in_flight, max(KEY_SHARE_FLOOR, max_in_flight // KEY_SHARE_DIVISOR))


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """``topics`` are co-partitioned inputs (a key lands on the same partition number of each,
    and a range assignor gives one member the same numbers of all); ``state_topic`` is their
    changelog, restored per owned partition number."""

    topics: tuple[str, ...]
    state_topic: str
    max_in_flight: int = 1000
    commit_interval_s: float = 0.2
    timer_interval_s: float = 0.25
    rebalance_budget_s: float = 20.0
    shutdown_grace_s: float = 20.0
    poll_timeout_ms: int = 100
    max_poll_records: int = 500
    record_attempts: int = 3
    retry_backoff_s: tuple[float, float] = (0.2, 2.0)
    hold_overdue_s: float = 2.0
    """Age at which a record's unreleased hold gets its ``on_overdue`` call."""
    max_in_flight_per_key: int | None = None
    """The share of ``max_in_flight`` one lane key (partition, key) may hold, queued and
    running; ``None``: ``default_key_share``. A key at its share pauses its partition only."""

    @property
    def key_share(self) -> int:
        if self.max_in_flight_per_key is None:
            return default_key_share(self.max_in_flight)
        return max(1, min(self.max_in_flight, self.max_in_flight_per_key))

    def backoff(self, attempt: int) -> float:
        """The pause after failed attempt ``attempt`` (1-based): doubling, capped."""
        first, cap = self.retry_backoff_s
        return float(min(cap, first * 2 ** (attempt - 1)))


class ConsumeLoop(ConsumerRebalanceListener):  # type: ignore[misc]
    """One process's consume loop. Build the clients outside and pass them in."""

    def __init__(
        self,
        *,
        consumer: AIOKafkaConsumer,
        restore_consumer: RestoreConsumerFactory,
        executor: Handler,
        metrics: LoopSeries,
        config: LoopConfig,
        unordered: Callable[[ConsumerRecord[bytes, bytes]], bool] | None = None,
        gap_hold_s: float = 0.0,  # KafkaConfig.offset_gap_hold_s
    ) -> None:
        self.consumer = consumer
        self._unordered = unordered
        #: Queries run beside their lane: task -> (partition, key).
        self.asides: dict[asyncio.Task[None], tuple[int, str]] = {}
        self._restore_consumer = restore_consumer
        self.executor = executor
        #: The handler's batch entry and its writes' flush, if it has them (``Handler``).
        self._batch: Batch | None = getattr(executor, "handle_batch", None)
        self._flush: Callable[[], Awaitable[None]] | None = getattr(executor, "flush", None)
        self.store = executor.store
        self.metrics = metrics
        self.config = config
        self.lanes: dict[tuple[int, str], Lane] = {}
        self.commits = Commits(
            consumer,
            metrics=metrics,
            hold_overdue_s=config.hold_overdue_s,
            final_timeout_s=FINAL_COMMIT_TIMEOUT_S,
        )
        self.trackers = self.commits.trackers
        self.pressure = Pressure(
            consumer=consumer,
            topics=config.topics,
            lanes=self.lanes,
            metrics=metrics,
            max_in_flight=config.max_in_flight,
            key_share=config.key_share,
        )
        self.units = Units(
            executor,
            metrics=metrics,
            commits=self.commits,
            active=lambda: self.pressure.active,
            attempts=config.record_attempts,
            backoff=config.backoff,
        )
        self.ready = False
        self.last_beat = time.monotonic()
        self._stopping = asyncio.Event()
        #: The sweep ``sweep_soon`` scheduled, not run yet; None when none is, or the loop is
        #: not running (``_sweeps``).
        self._soon: asyncio.Handle | None = None
        self._sweeps = False
        self._fatal: BaseException | None = None
        self.gaps = (
            GapWatch(
                gap_logger(log, "consume-loop", lambda: metrics.offset_gaps.inc()),
                hold_s=gap_hold_s,
            )
            if gap_hold_s > 0
            else None
        )

    @property
    def active(self) -> set[int]:
        """Partition numbers assigned and restored: the only ones dispatched."""
        return self.pressure.active

    async def completed(self, tp: TopicPartition) -> int | None:
        """How far this member has handled ``tp``: its completion watermark, or before it
        dispatched a record of it, its position (the commit it took it from, every record
        below finished by a previous owner); ``None`` when not assigned here."""
        tracker = self.trackers.get(tp)
        mark = None if tracker is None else tracker.watermark()
        if mark is not None:
            return mark
        try:
            return int(await self.consumer.position(tp))
        except IllegalStateError:
            return None

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to stop fetching and drain (SIGTERM)."""
        self._stopping.set()

    async def run(self) -> None:
        """Consume until ``stop()``; raises when a lane failed (the process must exit)."""
        self.consumer.subscribe(list(self.config.topics), listener=self)
        stop_requested = asyncio.ensure_future(self._stopping.wait())
        self._sweeps = True
        helpers = [
            asyncio.create_task(
                self._every(self.config.commit_interval_s, self.commits.commit_tick)
            ),
            asyncio.create_task(self._every(self.config.timer_interval_s, self._sweep_timers)),
            stop_requested,
        ]
        try:
            while not self._stopping.is_set():
                self.beat()
                batch = await self._poll(stop_requested)
                for tp, records in batch.items():
                    if tp.partition in self.pressure.active:  # else revoked meanwhile
                        self._hand(tp, records)
                self.pressure.apply()
            if self._fatal is None:
                await self._drain(self.config.shutdown_grace_s)
        finally:
            self._sweeps = False
            if self._soon is not None:
                self._soon.cancel()
                self._soon = None
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if self._fatal is None:
                await self.commits.final_commit()
            await self._cancel_lanes()
            self._set_ready(False)
        if self._fatal is not None:
            raise RuntimeError("consume loop failed") from self._fatal

    async def _poll(
        self, stop_requested: asyncio.Future[Any]
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        """One fetch, given up as soon as ``stop()`` is called: aiokafka's fetch waits without
        bound during a rebalance (up to the slowest member's rejoin), which a SIGTERM must not.
        Nothing is lost: records leave aiokafka's buffer only after that wait, and offsets of
        records never dispatched are never committed."""
        fetch = asyncio.ensure_future(
            fetch_records(
                self.consumer,
                timeout_ms=self.config.poll_timeout_ms,
                max_records=min(self.config.max_poll_records, self.pressure.fetchable()),
                on_unreadable=Unreadable.of,
                gaps=self.gaps,
            )
        )
        try:
            await asyncio.wait((fetch, stop_requested), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not fetch.done():
                fetch.cancel()
        return {} if fetch.cancelled() or not fetch.done() else fetch.result()

    def beat(self) -> None:
        self.last_beat = time.monotonic()
        self.metrics.beat()

    async def _every(self, interval: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except KafkaError as exc:  # commit during a rebalance, broker hiccup: retry later
                log.warning("periodic_task_failed", task=fn.__name__, error=repr(exc))
            except Exception as exc:  # a bug must not end periodic commits in silence
                log.error("periodic_task_failed", task=fn.__name__, error=repr(exc)[:300])

    # -- dispatch ------------------------------------------------------------------------------

    def _hand(self, tp: TopicPartition, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        """Dispatch one partition's fetched records, those whose keys have no lane as one unit
        when the handler takes batches."""
        unit: Unit | None = None if self._batch is None else []
        for msg in records:
            if not self._dispatch(tp, msg, unit):
                # No room: the partition is read again from this record once it resumes
                # (aiokafka drops what it buffered past it).
                self._seek_back(tp, msg.offset)
                return

    def _dispatch(
        self,
        tp: TopicPartition,
        msg: ConsumerRecord[bytes, bytes],
        unit: Unit | None = None,
    ) -> bool:
        """Hand ``msg`` to its lane (or run it beside); False, and nothing done, when there is
        no room for it (``Pressure.room``): the caller reads the partition again from it later.
        With a ``unit`` (the handler's batch entry), a record whose key has no lane joins it:
        its lane is held by the unit's task (``_run_unit``), later records queue behind it."""
        key = msg.key.decode("utf-8", "replace") if msg.key else f"\0no-key:{tp.partition}"
        if not self.pressure.room(tp.partition, key):
            return False
        self.commits.tracker(tp).dispatched(msg.offset)
        if self._unordered is not None and self._unordered(msg):
            self._aside(key, tp, msg)
            return True
        if unit is None or (tp.partition, key) in self.lanes or isinstance(msg, Unreadable):
            self._enqueue(key, tp.partition, msg)
            return True
        lane = self._enqueue(key, tp.partition, msg, run=False)
        lane.task = unit[0][1].task if unit else asyncio.create_task(self._run_unit(unit))
        unit.append((key, lane, msg))
        return True

    def _seek_back(self, tp: TopicPartition, offset: int) -> None:
        try:
            self.consumer.seek(tp, offset)
        except KafkaError:  # no longer assigned: the next owner reads it from the commit
            log.warning("seek_back_failed", partition=tp.partition, offset=offset)

    def _aside(self, key: str, tp: TopicPartition, msg: ConsumerRecord[bytes, bytes]) -> None:
        """Run ``msg`` now, in a task of its own (see the module docstring)."""
        where = (tp.partition, key)
        self.pressure.aside_started(where)
        task = asyncio.create_task(self._run_aside(key, tp, msg))
        self.asides[task] = where
        task.add_done_callback(lambda done: self.pressure.aside_finished(self.asides.pop(done)))

    async def _run_aside(
        self, key: str, tp: TopicPartition, msg: ConsumerRecord[bytes, bytes]
    ) -> None:
        try:
            await self.units.run(key, tp.partition, msg)
        except asyncio.CancelledError:
            raise
        except Revoked:
            return  # the next owner answers it
        except BaseException as exc:  # a process fault: as a lane's, it stops the loop
            self._fail("aside_failed", key, exc)
            return
        tracker = self.trackers.get(tp)
        if tracker is not None:
            tracker.finished(msg.offset)

    def _fail(self, event: str, key: str, exc: BaseException) -> None:
        """A process fault in a unit of ``key``: the loop stops and ``run`` raises it."""
        log.exception(event, account_id=key[:LOGGED_KEY_CHARS])
        self._fatal = exc
        self._stopping.set()

    def _enqueue(self, key: str, partition: int, item: LaneItem, *, run: bool = True) -> Lane:
        self.pressure.add(partition, 1)
        lane = self.lanes.get((partition, key))
        if lane is None:
            lane = self.lanes[(partition, key)] = Lane(partition)
        lane.items.append(item)
        self.pressure.heat_if_full(partition, key)
        if run and lane.task is None:
            lane.task = asyncio.create_task(self._drain_lane(key, lane))
        return lane

    async def _run_unit(self, unit: Unit) -> None:
        """The first record of each of ``unit``'s lanes, one per key, as one unit of work
        (``Handler.handle_batch``; docs/architecture.md, "Per-account lanes"). A record it
        lets go (``release``) goes on: finished, its key's next records, or not, the record
        and those behind it, through ``_drain_lane`` (retried, dead-lettered); so does any
        it had not let go when it returns. Cancelled (revoked past its
        budget, stopping), it finishes nothing more: the next owner replays the rest."""
        held = {id(msg): (key, lane) for key, lane, msg in unit}

        def release(msgs: list[ConsumerRecord[bytes, bytes]], finished: bool) -> None:
            for msg in msgs:
                key, lane = held.pop(id(msg))
                if finished:
                    tracker = self.trackers.get(TopicPartition(msg.topic, msg.partition))
                    if tracker is not None:
                        tracker.finished(msg.offset)
                    lane.items.popleft()
                    self.pressure.add(lane.partition, -1)
                self._go_on(key, lane)

        try:
            assert self._batch is not None  # a unit is made only for a handler with one
            await self._batch([msg for _, _, msg in unit], release)
        except BaseException as exc:
            if is_process_fault(exc):
                for key, lane in held.values():
                    self._close_lane(key, lane)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                self._fail("lane_failed", unit[0][0], exc)
                return
            log.warning("batch_failed", records=len(held), error=repr(exc)[:300])
        for key, lane in held.values():  # each left to its lane, retried on its own
            self._go_on(key, lane)

    def _go_on(self, key: str, lane: Lane) -> None:
        """A lane its unit let go: drained by a task of its own, or closed if empty."""
        lane.task = None
        if lane.items:
            lane.task = asyncio.create_task(self._drain_lane(key, lane))
        else:
            self._close_lane(key, lane)

    async def _drain_lane(self, key: str, lane: Lane) -> None:
        pressure = self.pressure
        try:
            while lane.items:
                item = lane.items[0]
                if lane.partition not in pressure.active:
                    break  # revoked: the new owner replays what we did not finish
                due = await self.units.run(key, lane.partition, item)
                if item is not DUE:
                    self.trackers[TopicPartition(item.topic, item.partition)].finished(item.offset)
                    for due_key in due or ():
                        self._enqueue(due_key, lane.partition, DUE)
                lane.items.popleft()
                pressure.add(lane.partition, -1)
                pressure.cooled(lane.partition, key)
        except asyncio.CancelledError:
            raise
        except Revoked:
            pass  # the next owner replays what was not finished
        except BaseException as exc:
            self._fail("lane_failed", key, exc)
        finally:
            self._close_lane(key, lane)

    def _close_lane(self, key: str, lane: Lane) -> None:
        """Let ``lane`` go with what it still holds (nothing once drained)."""
        self.pressure.add(lane.partition, -len(lane.items))
        if self.lanes.get((lane.partition, key)) is lane:
            del self.lanes[(lane.partition, key)]
        lane.items.clear()
        self.pressure.cooled(lane.partition, key)

    def sweep_soon(self) -> None:
        """Sweep the store's timers at the event loop's next turn, not at the next tick: a key
        was made due now from outside its lane (``PartitionedStore.sweep_soon``). Calls within
        one turn share one sweep; none once the loop has stopped."""
        if self._sweeps and self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self._sweep_now)

    def _sweep_now(self) -> None:
        self._soon = None
        try:
            self._sweep_due()
        except Exception as exc:  # as ``_every``: a bug must not pass in silence
            log.error("periodic_task_failed", task="sweep_soon", error=repr(exc)[:300])

    async def _sweep_timers(self) -> None:
        self._sweep_due()

    def _sweep_due(self) -> None:
        """Enqueue a follow-up for every idle account whose poll or deadline is due; a busy one
        (its lane runs), one of a partition not active or at its share, and all still due at
        the in-flight limit, are retried one interval later."""
        now = time.time()
        retry_at = now + self.config.timer_interval_s
        while self.pressure.in_flight < self.config.max_in_flight:
            due = self.store.pop_due(now, retry_at=retry_at)
            if due is None:
                return
            account_id, partition = due
            if (
                partition in self.pressure.active
                and (partition, account_id) not in self.lanes
                and self.pressure.admits(partition)
            ):
                self._enqueue(account_id, partition, DUE)

    # -- rebalance -----------------------------------------------------------------------------

    def _set_ready(self, ready: bool) -> None:
        self.ready = ready
        self.metrics.ready.set(1 if ready else 0)

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        mine = {tp for tp in revoked if tp.topic in self.config.topics}
        if not mine:
            return
        self.metrics.rebalances.labels("revoked").inc()
        parts = {tp.partition for tp in mine}
        self.pressure.active -= parts
        deadline = time.monotonic() + self.config.rebalance_budget_s
        await self._wait_lanes(parts, self.config.rebalance_budget_s)
        await self._flushed(deadline)
        await self.commits.revoked(mine)
        for p in parts:
            self.store.drop(p)
        self.pressure.forget(parts)
        self.metrics.store_accounts.set(len(self.store))
        log.info("partitions_revoked", partitions=sorted(parts))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Take ``assigned`` on, paused until their state is restored: restore, hand-over,
        freeze the restored records, report, then dispatch them."""
        mine = sorted(
            (tp for tp in assigned if tp.topic in self.config.topics),
            key=lambda t: (t.partition, t.topic),
        )
        if not mine:
            self._set_ready(True)
            return
        self.metrics.rebalances.labels("assigned").inc()
        self._set_ready(False)
        self.consumer.pause(*mine)
        if self._stopping.is_set():
            # A rebalance that completes while we shut down: ``consumer.stop()`` waits for it,
            # so restoring partitions we will never process would only delay the LeaveGroup
            # that hands them to the next owner. They stay paused and are never dispatched.
            log.info(
                "assignment_ignored_stopping", partitions=sorted({tp.partition for tp in mine})
            )
            return
        restored = await restore(self._restore_consumer, self.store, self.config.state_topic, mine)
        report_restored(self.metrics, restored)
        self._activate(mine)

    def _activate(self, mine: list[TopicPartition]) -> None:
        """Dispatch ``mine`` from now on: resumed unless the loop or a hot key holds them."""
        self.beat()
        self.pressure.active |= {tp.partition for tp in mine}
        self.metrics.store_accounts.set(len(self.store))
        if not self.pressure.paused:
            self.consumer.resume(
                *(tp for tp in mine if tp.partition not in self.pressure.key_paused)
            )
        self._set_ready(True)

    # -- draining ------------------------------------------------------------------------------

    async def _wait_lanes(self, partitions: set[int] | None, budget: float) -> None:
        """Let running work of ``partitions`` (all when None) finish; cancel it after budget.
        Safe: a cancelled unit's offset stays uncommitted, and its next owner re-drives it with
        the same idempotency key (asking the provider first)."""
        deadline = time.monotonic() + budget
        while True:
            busy = self._tasks(partitions)
            if not busy:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                for task in busy:
                    task.cancel()
                await asyncio.gather(*busy, return_exceptions=True)
                log.warning("work_abandoned", tasks=len(busy))
                return
            await asyncio.wait(busy, timeout=left)

    async def _drain(self, grace: float) -> None:
        log.info("draining", in_flight=self.pressure.in_flight, grace_s=grace)
        owned = input_partitions(self.config.topics, self.pressure.active)
        if owned:
            self.consumer.pause(*owned)
        deadline = time.monotonic() + grace
        await self._wait_lanes(None, grace)
        await self._flushed(deadline)

    async def _flushed(self, deadline: float) -> None:
        """The handler's writes no unit waits for, before the loop commits, within what is
        left of the lanes' budget (``deadline``): what they hold is committed past once they
        are acknowledged; one cut short (or failed) leaves its offsets uncommitted, to be
        read again."""
        if self._flush is None:
            return
        try:
            await asyncio.wait_for(self._flush(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            log.warning("writes_abandoned")
        except Exception as exc:
            log.error("writes_failed", error=repr(exc)[:300])

    def _tasks(self, partitions: set[int] | None = None) -> list[asyncio.Task[None]]:
        """The running lanes (a batch unit once for all its lanes) and queries beside them of
        ``partitions`` (all when None)."""
        mine = [(lane.partition, lane.task) for lane in self.lanes.values() if lane.task]
        mine += [(p, task) for task, (p, _) in self.asides.items()]
        return list(dict.fromkeys(t for p, t in mine if partitions is None or p in partitions))

    async def _cancel_lanes(self) -> None:
        tasks = self._tasks()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
