"""The consume loop: lanes per partition and key, holds through Kafka, rebalances and stop."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, cast

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from devstack.broker import free_port
from tests.conftest import SettingsFactory
from worker.auth.metrics import WorkerMetrics
from worker.auth.store import StateStore
from worker.engine.broker_health import BrokerHealth
from worker.engine.consume_loop import ConsumeLoop, LoopConfig
from worker.engine.faults import Fault
from worker.engine.kafka import KafkaConfig, build_consumer, build_producer, ensure_topics
from worker.engine.offsets import Hold, hold_record
from worker.engine.runner import (
    ProbeAddress,
    ProcessParts,
    RunOptions,
    consume_loop,
    group_consumer,
    run_consume_loop,
)

# --- lanes ---------------------------------------------------------------------------------


class _Gauge:
    def set_function(self, read: Any) -> None:
        pass


class _Metrics:
    in_flight = _Gauge()

    def beat(self) -> None:
        pass


class _HoldPartitionOne:
    """A handler whose records of partition 1 wait until released."""

    store: Any = None

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.done: list[tuple[int, int]] = []

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        if msg.partition == 1:
            await self.release.wait()
        self.done.append((msg.partition, msg.offset))

    async def follow_up(self, partition: int, key: str) -> None:
        pass

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")


def _record(partition: int, offset: int, key: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", partition, offset, 0, 0, key, b"{}", None, len(key), 2, [])


async def test_a_key_on_two_partitions_has_a_lane_on_each() -> None:
    """A key's record on another partition (the worker forwards those home) neither waits for
    nor holds up its records on this one, and is revoked with its own partition only."""
    handler = _HoldPartitionOne()
    worker = ConsumeLoop(
        consumer=cast(Any, None),
        restore_consumer=cast(Any, None),
        executor=handler,
        metrics=cast(Any, _Metrics()),
        config=LoopConfig(topics=("t",), state_topic="s"),
    )
    worker.pressure.active = {0, 1}
    worker._dispatch(TopicPartition("t", 1), _record(1, 5, b"acc"))
    worker._dispatch(TopicPartition("t", 0), _record(0, 7, b"acc"))
    for _ in range(100):
        if handler.done:
            break
        await asyncio.sleep(0.01)
    assert handler.done == [(0, 7)]
    assert worker.trackers[TopicPartition("t", 0)].watermark() == 8
    worker.active.discard(1)  # revoked while its record runs
    handler.release.set()
    await asyncio.gather(*(lane.task for lane in list(worker.lanes.values()) if lane.task))
    assert worker.lanes == {}
    assert worker.pressure.in_flight == 0


class _Holding(_HoldPartitionOne):
    """Takes a hold on every record it handles and keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.holds: list[Hold] = []
        self.overdue: list[int] = []

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        hold = hold_record(on_overdue=lambda: self.overdue.append(msg.offset))
        assert hold is not None
        self.holds.append(hold)
        self.done.append((msg.partition, msg.offset))


async def _two_records_handled(worker: ConsumeLoop, handler: _Holding) -> TopicPartition:
    """Offsets 3 and 4 of partition 0 dispatched and handled (each held by its handler)."""
    worker.pressure.active = {0}
    tp = TopicPartition("t", 0)
    worker._dispatch(tp, _record(0, 3, b"a"))
    worker._dispatch(tp, _record(0, 4, b"b"))
    for _ in range(100):
        if len(handler.done) == 2 and not worker.lanes:
            break
        await asyncio.sleep(0.01)
    return tp


async def test_a_record_held_by_its_handler_is_not_committed_until_released() -> None:
    handler = _Holding()
    worker = ConsumeLoop(
        consumer=cast(Any, None),
        restore_consumer=cast(Any, None),
        executor=handler,
        metrics=cast(Any, _Metrics()),
        config=LoopConfig(topics=("t",), state_topic="s", hold_overdue_s=0.05),
    )
    tp = await _two_records_handled(worker, handler)
    assert worker.lanes == {}, "both handled"
    assert worker.trackers[tp].watermark() == 3, "handled, but held"
    handler.holds[0].release()
    handler.holds[0].release()  # idempotent
    assert worker.trackers[tp].watermark() == 4
    worker.commits.overdue_holds(1e18)
    assert handler.overdue == [4], "only the live hold is overdue, once"
    worker.commits.overdue_holds(1e18)
    assert handler.overdue == [4]
    # revoked: the tracker goes, a late release is harmless and the offset was never passed
    del worker.trackers[tp]
    handler.holds[1].release()
    assert not worker.commits.holds


class _FlushReleases(_Holding):
    """Releases its records' holds only in ``flush`` (its writes no unit waits for)."""

    async def flush(self) -> None:
        await asyncio.sleep(0)
        for hold in self.holds:
            hold.release()


class _Series:
    """A metric family that takes what the loop writes."""

    def labels(self, *_: str) -> _Series:
        return self

    def inc(self) -> None:
        pass

    def set(self, _: float) -> None:
        pass

    def remove(self, *_: str) -> None:
        pass


class _LoopMetrics(_Metrics):
    rebalances = store_accounts = lag = _Series()


class _Committing:
    """The consumer as the loop uses it to pause, commit and read lag: notes each commit."""

    def __init__(self) -> None:
        self.committed: list[dict[TopicPartition, int]] = []

    def pause(self, *_: TopicPartition) -> None:
        pass

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.committed.append(dict(offsets))

    def highwater(self, tp: TopicPartition) -> None:
        return None


@pytest.mark.parametrize("how", ["revoked", "stopped"])
async def test_the_handlers_flush_runs_after_its_lanes_and_before_the_commit(how: str) -> None:
    """Writes a handler started that no unit waits for (the dispatcher's successes' log
    entries) release their records' holds once acknowledged: the loop waits for them (its
    ``flush``) after the lanes, so the commit of a revocation or a stop passes them."""
    handler = _FlushReleases()
    consumer = _Committing()
    worker = ConsumeLoop(
        consumer=cast(Any, consumer),
        restore_consumer=cast(Any, None),
        executor=handler,
        metrics=cast(Any, _LoopMetrics()),
        config=LoopConfig(topics=("t",), state_topic="s"),
    )
    tp = await _two_records_handled(worker, handler)
    assert worker.trackers[tp].watermark() == 3, "handled, still held by their writes"
    if how == "revoked":
        worker.store = cast(Any, _DroppingStore())
        await worker.on_partitions_revoked({tp})
    else:
        await worker._drain(1.0)
        await worker.commits.final_commit()
    assert consumer.committed == [{tp: 5}], "committed past both, once their writes were"


class _StuckThenFlushing(_HoldPartitionOne):
    """A record that never finishes, and a flush that would take a while."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed = False

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        await asyncio.Event().wait()

    async def flush(self) -> None:
        await asyncio.sleep(0.05)
        self.flushed = True


async def test_the_flush_at_a_revocation_gets_only_what_the_lanes_left_of_the_budget() -> None:
    """One budget for the lanes and the flush together: lanes that used it all up leave the
    flush none, so a revocation is not held twice the budget."""
    handler = _StuckThenFlushing()
    worker = ConsumeLoop(
        consumer=cast(Any, _Committing()),
        restore_consumer=cast(Any, None),
        executor=handler,
        metrics=cast(Any, _LoopMetrics()),
        config=LoopConfig(topics=("t",), state_topic="s", rebalance_budget_s=0.2),
    )
    worker.pressure.active = {0}
    tp = TopicPartition("t", 0)
    worker._dispatch(tp, _record(0, 3, b"a"))
    for _ in range(5):
        await asyncio.sleep(0)  # its lane is in the record now
    assert worker.lanes, "the record runs"
    worker.store = cast(Any, _DroppingStore())
    await worker.on_partitions_revoked({tp})
    assert not handler.flushed, "the flush was cut short: the lanes had used the budget"


class _DroppingStore:
    def drop(self, partition: int) -> None:
        pass

    def __len__(self) -> int:
        return 0


# --- stopping during a rebalance ----------------------------------------------------------


class _Idle:
    """A handler for a loop that is only started and stopped."""

    def __init__(self) -> None:
        self.store = StateStore()

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        pass

    async def follow_up(self, partition: int, key: str) -> None:
        pass

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        raise AssertionError(f"nothing fails here: {fault}")


class _RevokeHeld(ConsumerRebalanceListener):  # type: ignore[misc]
    """A group member whose revocation waits until released: the group's rebalance cannot
    complete while it waits, as with a member that drains slowly or died mid-rebalance."""

    def __init__(self) -> None:
        self.assigned = asyncio.Event()
        self.revoking = asyncio.Event()
        self.release = asyncio.Event()

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if self.assigned.is_set():
            self.revoking.set()
            await self.release.wait()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        if assigned:
            self.assigned.set()


@pytest.mark.integration
async def test_stop_does_not_wait_for_a_rebalance_another_member_holds_up(
    make_settings: SettingsFactory,
) -> None:
    """aiokafka's fetch blocks until a rebalance in progress completes; a SIGTERM that
    arrives then must still stop the loop at once, not when the slowest member rejoins (a
    chaos run saw a worker overrun its shutdown hard limit this way)."""
    settings = make_settings(partitions=2)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    group = settings.kafka_consumer_group
    holder_listener = _RevokeHeld()
    holder = build_consumer(
        kafka,
        group_id=group,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=300,
        rebalance_timeout_ms=60_000,
        max_poll_interval_ms=300_000,
    )
    holder.subscribe([settings.topics.commands], listener=holder_listener)
    await holder.start()
    polling = asyncio.create_task(_poll_forever(holder))
    config = replace(settings.loop_config("worker"), max_in_flight=10)
    loop = _idle_loop(kafka, config, group)
    running: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(holder_listener.assigned.wait(), 30)
        await loop.consumer.start()
        running = asyncio.create_task(loop.run())
        # The loop's join starts a rebalance, which the holder's revocation holds up.
        await asyncio.wait_for(holder_listener.revoking.wait(), 30)
        assert not loop.ready
        loop.stop()
        # The rebalance is held until the end: a loop that waits for it never stops, so the
        # bound only ends a failing test (a loaded machine may take seconds to stop).
        done, _ = await asyncio.wait({running}, timeout=60)
        assert done, "the loop waited for the rebalance to complete"
        assert not holder_listener.release.is_set()  # the rebalance was still held up
        running.result()
    finally:
        holder_listener.release.set()
        if running is not None and not running.done():
            running.cancel()
        polling.cancel()
        await asyncio.gather(*(t for t in (running, polling) if t), return_exceptions=True)
        await asyncio.wait({asyncio.ensure_future(holder.stop())}, timeout=10)
        await asyncio.wait({asyncio.ensure_future(loop.consumer.stop())}, timeout=10)


def _idle_loop(kafka: KafkaConfig, config: LoopConfig, group: str) -> ConsumeLoop:
    """A consume loop of ``group`` whose handler does nothing."""
    return consume_loop(
        kafka,
        config,
        consumer=group_consumer(kafka, config, group),
        handler=_Idle(),
        metrics=WorkerMetrics(CollectorRegistry()),
    )


async def _poll_forever(consumer: AIOKafkaConsumer) -> None:
    while True:
        await consumer.getmany(timeout_ms=100)


async def test_readyz_follows_the_process_own_condition(make_settings: SettingsFactory) -> None:
    """``ProcessParts.also_ready`` (the dispatcher's: its endpoints tail runs) keeps
    ``/readyz`` red while false, however ready the loop and the broker are."""
    settings = make_settings(partitions=1)
    kafka = settings.kafka_config()
    await ensure_topics(kafka, settings.topic_plan())
    config, group = settings.loop_config("worker"), settings.kafka_consumer_group
    loop = _idle_loop(kafka, config, group)
    own, port, stop = [False], free_port(), asyncio.Event()
    parts = ProcessParts(
        build_producer(kafka), CollectorRegistry(), BrokerHealth(), also_ready=lambda: own[0]
    )
    probes = ProbeAddress("127.0.0.1", port, "probes")
    run = RunOptions("worker", group, kafka.bootstrap, probes, install_signals=False, stop=stop)
    running = asyncio.create_task(run_consume_loop(loop, parts, run))
    try:
        for _ in range(300):
            if loop.ready or running.done():
                break
            await asyncio.sleep(0.1)
        assert loop.ready, "the loop never took its partition"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/readyz")).status_code == 503
            own[0] = True
            assert (await client.get("/readyz")).status_code == 200
    finally:
        stop.set()
        await asyncio.wait_for(running, 60)
