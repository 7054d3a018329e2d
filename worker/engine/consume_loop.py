"""The consume loop of the worker and the webhook dispatcher: fetch, hand each record to the
lane of its partition and key, commit the completion watermark, drive due timers, restore on
assignment. The loop owns order, concurrency, offsets and rebalances; what a record means is
the ``Handler``'s (docs/architecture.md, "The consume engine", "Per-account lanes", "Watermark
commits", "Rebalances", "Failure handling"; the in-flight bound and each key's share of it in
``ConsumeLoop._room``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from worker.engine.faults import Fault, is_permanent, is_process_fault
from worker.engine.fetch import GapWatch, gap_logger
from worker.engine.fetch import getmany as fetch_records
from worker.engine.offsets import HANDLING, Handling, Hold, OffsetTracker
from worker.engine.replay import high_water_marks
from worker.engine.store import restore_partitions
from worker.runtime.logs import get_logger

log = get_logger(__name__)

RestoreConsumerFactory = Callable[[], AIOKafkaConsumer]


class LoopStore(Protocol):
    """What the loop needs of a state store (``worker.engine.store.PartitionedStore``)."""

    tracks_handover: ClassVar[bool]

    def handed_over(self, topic: str, partition: int, end: int) -> None: ...

    @staticmethod
    def decode(value: bytes) -> tuple[str, Any]: ...

    def load(self, partition: int, records: dict[str, Any]) -> None: ...

    def drop(self, partition: int) -> None: ...

    def pop_due(self, now: float, *, retry_at: float) -> tuple[str, int] | None: ...

    def __len__(self) -> int: ...


class Handler(Protocol):
    """One unit of work per record or due key: the worker's ``Executor``, the dispatcher's
    ``Dispatcher``. A unit that raises is retried, then recovered or given up; only a process
    fault (``worker.engine.faults.is_process_fault``), here or in ``recover``, ends the process."""

    @property
    def store(self) -> LoopStore: ...

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> Iterable[str] | None:
        """Apply one record; may return keys (of the record's partition) due at once."""

    async def follow_up(self, partition: int, key: str) -> None:
        """Act on a key the store said is due."""

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        """Dead-letter a record whose handling failed for good (acknowledged before the
        offset is committed). Raising here ends the process: the record cannot be let go."""

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        """Set aside a due key whose follow-up failed for good (postpone it)."""


class LoopMetrics(Protocol):
    """The loop's own series (``WorkerMetrics``, ``WebhookMetrics``)."""

    in_flight: Any
    lag: Any
    store_accounts: Any
    restore_seconds: Any
    restore_records: Any
    restore_undecodable: Any
    rebalances: Any
    ready: Any
    unit_failures: Any
    offset_gaps: Any
    key_pauses: Any

    def beat(self) -> None: ...


@dataclass
class Unreadable(ConsumerRecord[bytes, bytes]):  # type: ignore[misc]
    """Stands in a batch for a record the Kafka client could not parse (``worker.engine.fetch``): it
    takes the record's place on a lane and its offset in the watermark, and is dead-lettered
    (by offset: its bytes could not be read) instead of handled."""

    error: str = ""

    @classmethod
    def of(cls, tp: TopicPartition, offset: int, exc: BaseException) -> Unreadable:
        return cls(
            tp.topic,
            tp.partition,
            offset,
            -1,
            -1,
            None,
            None,
            None,
            -1,
            -1,
            [],
            error=f"the Kafka client cannot parse the record: {type(exc).__name__}: {exc}",
        )


@dataclass(slots=True)
class Lane:
    """One account's queue of work on one partition; at most one task drains it."""

    partition: int
    items: deque[ConsumerRecord[bytes, bytes] | None] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


#: A lane's key is the record's key, of any length the broker accepts: log lines keep its
#: start only.
LOGGED_KEY_CHARS = 200

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
    rebalance_budget_s: float = 10.0
    shutdown_grace_s: float = 20.0
    poll_timeout_ms: int = 100
    max_poll_records: int = 500
    final_commit_timeout_s: float = FINAL_COMMIT_TIMEOUT_S
    record_attempts: int = 3
    retry_backoff_s: tuple[float, float] = (0.2, 2.0)
    hold_overdue_s: float = 2.0
    """Age at which a record's unreleased hold gets its ``on_overdue`` call."""
    gap_hold_s: float = 1.0
    """How long an offset never seen below a fetched record is waited for before the loop
    goes on past it, reported (``worker.engine.fetch.GapWatch``)."""
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


class _Revoked(Exception):
    """The partition of a unit being retried was revoked: its next owner retries it."""


class ConsumeLoop(ConsumerRebalanceListener):  # type: ignore[misc]
    """One process's consume loop. Build the clients outside and pass them in."""

    def __init__(
        self,
        *,
        consumer: AIOKafkaConsumer,
        restore_consumer: RestoreConsumerFactory,
        executor: Handler,
        metrics: LoopMetrics,
        config: LoopConfig,
        unordered: Callable[[ConsumerRecord[bytes, bytes]], bool] | None = None,
    ) -> None:
        self.consumer = consumer
        self._unordered = unordered
        #: Queries run beside their lane: task -> (partition, key).
        self.asides: dict[asyncio.Task[None], tuple[int, str]] = {}
        self._aside_load: dict[tuple[int, str], int] = {}
        self._restore_consumer = restore_consumer
        self.executor = executor
        self.store = executor.store
        self.metrics = metrics
        self.config = config
        self.lanes: dict[tuple[int, str], Lane] = {}
        self.trackers: dict[TopicPartition, OffsetTracker] = {}
        self.holds: deque[Hold] = deque()
        self.active: set[int] = set()
        self.in_flight = 0
        self.ready = False
        self.last_beat = time.monotonic()
        self._paused_for_backpressure = False
        self._key_share = config.key_share
        #: A hot key's partition resumes once every hot key of it is down to this.
        self._key_resume_at = self._key_share // 2
        #: Keys at their share, per partition number (only active partitions).
        self._hot: dict[int, set[str]] = {}
        #: Partition numbers paused in the consumer because a key of theirs is hot.
        self.key_paused: set[int] = set()
        self._stopping = asyncio.Event()
        self._fatal: BaseException | None = None
        self.gaps = GapWatch(
            gap_logger(log, "consume-loop", lambda: metrics.offset_gaps.inc()),
            hold_s=config.gap_hold_s,
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to stop fetching and drain (SIGTERM)."""
        self._stopping.set()

    async def run(self) -> None:
        """Consume until ``stop()``; raises when a lane failed (the process must exit)."""
        self.consumer.subscribe(list(self.config.topics), listener=self)
        stop_requested = asyncio.ensure_future(self._stopping.wait())
        helpers = [
            asyncio.create_task(self._every(self.config.commit_interval_s, self._commit_tick)),
            asyncio.create_task(self._every(self.config.timer_interval_s, self._sweep_timers)),
            stop_requested,
        ]
        try:
            while not self._stopping.is_set():
                self.beat()
                batch = await self._poll(stop_requested)
                for tp, records in batch.items():
                    if tp.partition not in self.active:
                        continue  # revoked while the fetch was in flight; the next owner has it
                    for msg in records:
                        if not self._dispatch(tp, msg):
                            # No room: the partition is read again from this record once
                            # it resumes (aiokafka drops what it buffered past it).
                            self._seek_back(tp, msg.offset)
                            break
                self._apply_backpressure()
            if self._fatal is None:
                await self._drain(self.config.shutdown_grace_s)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if self._fatal is None:
                await self._final_commit()
            await self._cancel_lanes()
            self.ready = False
            self.metrics.ready.set(0)
        if self._fatal is not None:
            raise RuntimeError("consume loop failed") from self._fatal

    async def _poll(
        self, stop_requested: asyncio.Future[Any]
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        """One fetch, given up as soon as ``stop()`` is called.

        aiokafka's fetch waits without bound while a rebalance is in progress
        (``Fetcher.fetched_records`` awaits the new assignment), and a rebalance lasts until
        the slowest member rejoins: up to the group's rebalance timeout, or a session timeout
        for a member that died. A SIGTERM must not wait for that. Giving up loses nothing:
        records leave aiokafka's buffer only after that wait, in the step that returns them, and
        the offsets of records never dispatched are never committed.
        """
        fetch = asyncio.ensure_future(
            fetch_records(
                self.consumer,
                timeout_ms=self.config.poll_timeout_ms,
                max_records=max(
                    1, min(self.config.max_poll_records, self.config.max_in_flight - self.in_flight)
                ),
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

    def _dispatch(self, tp: TopicPartition, msg: ConsumerRecord[bytes, bytes]) -> bool:
        """Hand ``msg`` to its lane (or run it beside); False, and nothing done, when there is
        no room for it (``_room``): the caller reads the partition again from it later."""
        key = msg.key.decode("utf-8", "replace") if msg.key else f"\0no-key:{tp.partition}"
        if not self._room(tp.partition, key):
            return False
        tracker = self.trackers.get(tp)
        if tracker is None:  # not setdefault: that would build a tracker for every record
            tracker = self.trackers[tp] = OffsetTracker()
        tracker.dispatched(msg.offset)
        if self._unordered is not None and self._unordered(msg):
            self._aside(key, tp, msg)
            return True
        self._enqueue(key, tp.partition, msg)
        return True

    def _room(self, partition: int, key: str) -> bool:
        """Whether a fetched record of ``key`` may be dispatched: the loop's in-flight bound
        (``max_in_flight``) and the key's share of it (``key_share``) both hard.

        A key at its share (one account's 404 flood, one account's events behind failing
        endpoints) pauses its own partition only (``_apply_backpressure``), so other
        partitions keep flowing instead of the whole bound filling with one slow lane and
        every partition pausing. The partition is Kafka's ordering unit: the other keys of a
        paused partition wait too, for as long as the hot lane takes to drain from its share
        to half of it; that is the trade-off, and all a hot key can hold up."""
        if self.in_flight >= self.config.max_in_flight:
            return False
        if self._load(partition, key) >= self._key_share:
            self._heat(partition, key)
            return False
        return True

    def _load(self, partition: int, key: str) -> int:
        """What ``key`` of ``partition`` holds of the in-flight bound: its lane's queue (the
        running item included) and its queries running beside."""
        lane = self.lanes.get((partition, key))
        queued = len(lane.items) if lane is not None else 0
        return queued + self._aside_load.get((partition, key), 0)

    def _heat(self, partition: int, key: str) -> None:
        if partition in self.active:
            self._hot.setdefault(partition, set()).add(key)

    def _heat_if_full(self, partition: int, key: str) -> None:
        """Mark ``key`` hot once it holds its share, by the measure ``_room`` checks."""
        if self._load(partition, key) >= self._key_share:
            self._heat(partition, key)

    def _cooled(self, partition: int, key: str) -> None:
        """``key`` let go of some of its share: drop it from its partition's hot keys once it
        is down to half the share (the partition resumes at the next poll)."""
        keys = self._hot.get(partition)
        if keys is None or key not in keys:
            return
        if self._load(partition, key) <= self._key_resume_at:
            keys.discard(key)
            if not keys:
                del self._hot[partition]

    def _seek_back(self, tp: TopicPartition, offset: int) -> None:
        try:
            self.consumer.seek(tp, offset)
        except KafkaError:  # no longer assigned: the next owner reads it from the commit
            log.warning("seek_back_failed", partition=tp.partition, offset=offset)

    def _aside(self, key: str, tp: TopicPartition, msg: ConsumerRecord[bytes, bytes]) -> None:
        """Run ``msg`` now, in a task of its own (see the module docstring)."""
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)
        where = (tp.partition, key)
        self._aside_load[where] = self._aside_load.get(where, 0) + 1
        self._heat_if_full(tp.partition, key)
        task = asyncio.create_task(self._run_aside(key, tp, msg))
        self.asides[task] = where
        task.add_done_callback(self._aside_done)

    def _aside_done(self, task: asyncio.Task[None]) -> None:
        where = self.asides.pop(task, None)
        self._settled()
        if where is None:
            return
        left = self._aside_load.get(where, 0) - 1
        if left > 0:
            self._aside_load[where] = left
        else:
            self._aside_load.pop(where, None)
        self._cooled(*where)

    async def _run_aside(
        self, key: str, tp: TopicPartition, msg: ConsumerRecord[bytes, bytes]
    ) -> None:
        try:
            await self._contained(key, tp.partition, msg)
        except asyncio.CancelledError:
            raise
        except _Revoked:
            return  # the next owner answers it
        except BaseException as exc:  # a process fault: as a lane's, it stops the loop
            log.exception("aside_failed", account_id=key[:LOGGED_KEY_CHARS])
            self._fatal = exc
            self._stopping.set()
            return
        tracker = self.trackers.get(tp)
        if tracker is not None:
            tracker.finished(msg.offset)

    def _enqueue(self, key: str, partition: int, item: ConsumerRecord[bytes, bytes] | None) -> None:
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)
        lane = self.lanes.get((partition, key))
        if lane is None:
            lane = self.lanes[(partition, key)] = Lane(partition)
        lane.items.append(item)
        self._heat_if_full(partition, key)
        if lane.task is None:
            lane.task = asyncio.create_task(self._drain_lane(key, lane))

    async def _drain_lane(self, key: str, lane: Lane) -> None:
        try:
            while lane.items:
                item = lane.items[0]
                if lane.partition not in self.active:
                    break  # revoked: the new owner replays what we did not finish
                due = await self._contained(key, lane.partition, item)
                if item is not None:
                    self.trackers[TopicPartition(item.topic, item.partition)].finished(item.offset)
                    for due_key in due or ():
                        self._enqueue(due_key, lane.partition, None)
                lane.items.popleft()
                self._settled()
                self._cooled(lane.partition, key)
        except asyncio.CancelledError:
            raise
        except _Revoked:
            pass  # the next owner replays what was not finished
        except BaseException as exc:
            log.exception("lane_failed", account_id=key[:LOGGED_KEY_CHARS])
            self._fatal = exc
            self._stopping.set()
        finally:
            self.in_flight -= len(lane.items)
            self.metrics.in_flight.set(self.in_flight)
            if self.lanes.get((lane.partition, key)) is lane:
                del self.lanes[(lane.partition, key)]
            lane.items.clear()
            self._cooled(lane.partition, key)

    async def _contained(
        self, key: str, partition: int, item: ConsumerRecord[bytes, bytes] | None
    ) -> Iterable[str] | None:
        """Run one unit of work (a record, or a due key when ``item`` is None) so that a fault
        about it stays with it: retried with a pause, then recovered or given up. A process
        fault propagates (the lane then stops the loop)."""
        stage = "follow_up" if item is None else "record"
        if isinstance(item, Unreadable):
            log.error(
                "record_unreadable", partition=partition, offset=item.offset, error=item.error
            )
            await self.executor.recover(item, Fault("unreadable", item.error[:300]))
            self.metrics.unit_failures.labels(stage, "dead_lettered").inc()
            return None
        attempt = 1
        while True:
            try:
                if item is None:
                    await self.executor.follow_up(partition, key)
                    return None
                return await self._handle(item)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                if is_process_fault(exc):
                    raise
                where = {
                    "stage": stage,
                    "key": key[:LOGGED_KEY_CHARS],
                    "partition": partition,
                    "attempt": attempt,
                }
                if item is not None:
                    where["offset"] = item.offset
                if attempt < self.config.record_attempts and not is_permanent(exc):
                    log.warning("unit_failed_retrying", error=repr(exc)[:300], **where)
                    self.metrics.unit_failures.labels(stage, "retried").inc()
                    await asyncio.sleep(self.config.backoff(attempt))
                    if partition not in self.active:
                        raise _Revoked from exc
                    attempt += 1
                    continue
                fault = Fault.of(exc, attempts=attempt)
                log.error(
                    "unit_failed",
                    reason=fault.reason,
                    exception=fault.exception,
                    fingerprint=fault.fingerprint,
                    exc_info=exc,
                    **where,
                )
                if item is not None:
                    await self.executor.recover(item, fault)
                    self.metrics.unit_failures.labels(stage, "dead_lettered").inc()
                else:
                    await self._give_up(partition, key, fault)
                return None

    async def _handle(self, item: ConsumerRecord[bytes, bytes]) -> Iterable[str] | None:
        """``Handler.handle`` with the record in context, so that it may ``hold_record``."""
        tp = TopicPartition(item.topic, item.partition)
        tracker = self.trackers.get(tp)
        if tracker is None:
            return await self.executor.handle(item)
        token = HANDLING.set(Handling(self.holds, tp, tracker, item.offset))
        try:
            return await self.executor.handle(item)
        finally:
            HANDLING.reset(token)

    async def _give_up(self, partition: int, key: str, fault: Fault) -> None:
        """Postpone a due key that keeps failing; a failure to postpone is only logged (the
        timer brings the key back, and nothing is committed for a due key)."""
        self.metrics.unit_failures.labels("follow_up", "given_up").inc()
        try:
            await self.executor.give_up(partition, key, fault)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if is_process_fault(exc):
                raise
            log.error(
                "give_up_failed",
                key=key[:LOGGED_KEY_CHARS],
                partition=partition,
                error=repr(exc)[:300],
            )

    def _settled(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.set(self.in_flight)

    def _apply_backpressure(self) -> None:
        """Pause fetching while too much is in flight, every partition; resume at half the
        limit. Pause the partition of a key at its share (``_room``) alone; resume it once
        every hot key of it is down to half the share. Called between fetches only, so that
        no pause races a rebalance: ``active`` holds assigned partitions only."""
        hot = {p for p in self._hot if p in self.active}
        heated = hot - self.key_paused
        cooled = (self.key_paused - hot) & self.active
        for p in sorted(heated):
            keys = sorted(self._hot[p])
            log.warning(
                "partition_paused_for_key",
                partition=p,
                keys=len(keys),
                key=keys[0][:LOGGED_KEY_CHARS],
                share=self._key_share,
                in_flight=self.in_flight,
            )
            self.metrics.key_pauses.inc()
        for p in sorted(cooled):
            log.info("partition_resumed_for_key", partition=p, in_flight=self.in_flight)
        self.key_paused = hot
        if not self._paused_for_backpressure and self.in_flight >= self.config.max_in_flight:
            self.consumer.pause(*self._owned())
            self._paused_for_backpressure = True
        elif self._paused_for_backpressure and self.in_flight < self.config.max_in_flight // 2:
            self.consumer.resume(*self._owned(self.active - hot))
            self._paused_for_backpressure = False
        elif not self._paused_for_backpressure:
            if heated:
                self.consumer.pause(*self._owned(heated))
            if cooled:
                self.consumer.resume(*self._owned(cooled))

    async def _sweep_timers(self) -> None:
        """Enqueue a follow-up step for every idle account whose poll or deadline is due.

        An account that is busy (its lane runs) or on a partition not yet active is retried
        one interval later, as is everything still due when the in-flight limit is reached.
        """
        now = time.time()
        retry_at = now + self.config.timer_interval_s
        while self.in_flight < self.config.max_in_flight:
            due = self.store.pop_due(now, retry_at=retry_at)
            if due is None:
                return
            account_id, partition = due
            if partition in self.active and (partition, account_id) not in self.lanes:
                self._enqueue(account_id, partition, None)

    # -- commit --------------------------------------------------------------------------------

    async def _commit_tick(self) -> None:
        """The periodic commit, after asking the owners of overdue holds to release them."""
        self._overdue_holds(time.monotonic() - self.config.hold_overdue_s)
        await self._commit()

    def _overdue_holds(self, older_than: float) -> None:
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

    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit every owned partition's watermark that moved; update lag."""
        offsets: dict[TopicPartition, int] = {}
        for tp, tracker in self.trackers.items():
            if only is not None and tp not in only:
                continue
            mark = tracker.watermark()
            if mark is not None and mark != tracker.committed:
                offsets[tp] = mark
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

    async def _final_commit(self) -> None:
        """The last commit before leaving, bounded in time and never fatal.

        A commit refused because the group rebalanced (the partitions already belong to
        someone else) or one the broker does not answer in time loses nothing: the records
        after the last committed watermark are replayed by the next owner and answered from
        the dedup window. Raising here would turn a clean SIGTERM into a non-zero exit.
        """
        try:
            await asyncio.wait_for(self._commit(), timeout=self.config.final_commit_timeout_s)
        except (KafkaError, TimeoutError) as exc:
            log.warning("final_commit_failed", error=repr(exc))

    # -- rebalance -----------------------------------------------------------------------------

    def _owned(self, partitions: Iterable[int] | None = None) -> list[TopicPartition]:
        """The input topic-partitions of ``partitions`` (default: every active one)."""
        numbers = self.active if partitions is None else partitions
        return [TopicPartition(t, p) for p in numbers for t in self.config.topics]

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        mine = {tp for tp in revoked if tp.topic in self.config.topics}
        if not mine:
            return
        self.metrics.rebalances.labels("revoked").inc()
        parts = {tp.partition for tp in mine}
        self.active -= parts
        await self._wait_lanes(parts, self.config.rebalance_budget_s)
        try:
            await self._commit(only=mine)
        except KafkaError as exc:
            log.warning("commit_on_revoke_failed", error=repr(exc))
        for tp in mine:
            self.trackers.pop(tp, None)
            with contextlib.suppress(KeyError):
                self.metrics.lag.remove(tp.topic, str(tp.partition))
        for p in parts:
            self.store.drop(p)
            # The consumer forgets a revoked partition's pause; so do we.
            self._hot.pop(p, None)
        self.key_paused -= parts
        self.metrics.store_accounts.set(len(self.store))
        log.info("partitions_revoked", partitions=sorted(parts))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        mine = sorted(
            (tp for tp in assigned if tp.topic in self.config.topics),
            key=lambda t: (t.partition, t.topic),
        )
        if not mine:
            self.ready = True
            self.metrics.ready.set(1)
            return
        self.metrics.rebalances.labels("assigned").inc()
        self.ready = False
        self.metrics.ready.set(0)
        self.consumer.pause(*mine)
        if self._stopping.is_set():
            # A rebalance that completes while we shut down: ``consumer.stop()`` waits for it,
            # so restoring partitions we will never process would only delay the LeaveGroup
            # that hands them to the next owner. They stay paused and are never dispatched.
            log.info(
                "assignment_ignored_stopping", partitions=sorted({tp.partition for tp in mine})
            )
            return
        restorer = self._restore_consumer()
        await restorer.start()
        try:
            numbers = sorted({tp.partition for tp in mine})
            state_tps = [TopicPartition(self.config.state_topic, p) for p in numbers]
            restored = await restore_partitions(restorer, state_tps, decode=self.store.decode)
            # Where the inputs end now that every previous owner gave them up: what lies below
            # may have been fetched, and acted on, before (docs/architecture.md,
            # "Write-ahead intent"). Read after the restore, so it covers every record whose
            # state the restore saw.
            ends = await high_water_marks(restorer, mine) if self.store.tracks_handover else {}
        finally:
            await restorer.stop()
        for partition, (records, _) in restored.items():
            self.store.load(partition, records)
        for tp, end in ends.items():
            self.store.handed_over(tp.topic, tp.partition, end)
        # Restored records live as long as the partition; keep them out of every future
        # full collection, which otherwise re-scans all of them (bench/README.md, hot spot #13).
        gc.freeze()
        for partition, (_, stats) in restored.items():
            self.metrics.restore_seconds.observe(stats.seconds)
            self.metrics.restore_records.inc(stats.records)
            self.metrics.restore_undecodable.inc(stats.undecodable)
            log.info(
                "partition_restored",
                partition=partition,
                records=stats.records,
                accounts=stats.accounts,
                undecodable=stats.undecodable,
                seconds=round(stats.seconds, 4),
            )
        self.beat()
        self.active |= {tp.partition for tp in mine}
        self.metrics.store_accounts.set(len(self.store))
        if not self._paused_for_backpressure:
            self.consumer.resume(*(tp for tp in mine if tp.partition not in self.key_paused))
        self.ready = True
        self.metrics.ready.set(1)

    # -- draining ------------------------------------------------------------------------------

    async def _wait_lanes(self, partitions: set[int] | None, budget: float) -> None:
        """Let running work of ``partitions`` (all when None) finish; cancel it after budget.

        Cancelling is safe: a cancelled confirm left its offset uncommitted, below the end the
        next owner notes on assignment, so that owner re-drives it with the same idempotency
        key (asking the provider first).
        """
        deadline = time.monotonic() + budget
        while True:
            busy = [
                lane.task
                for lane in self.lanes.values()
                if lane.task is not None and (partitions is None or lane.partition in partitions)
            ]
            busy += [
                t for t, (p, _) in self.asides.items() if partitions is None or p in partitions
            ]
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
        log.info("draining", in_flight=self.in_flight, grace_s=grace)
        owned = self._owned()
        if owned:
            self.consumer.pause(*owned)
        await self._wait_lanes(None, grace)

    async def _cancel_lanes(self) -> None:
        tasks = [lane.task for lane in self.lanes.values() if lane.task is not None]
        tasks += list(self.asides)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
