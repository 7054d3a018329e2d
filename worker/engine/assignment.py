"""The steps of taking partitions on (docs/architecture.md, "Rebalances"): restore their state
from the changelog, note where each input partition ended when it was handed over, keep the
restored records out of the collector's generations, and report what was restored."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.engine.catch_up import high_water_marks
from worker.engine.handler import LoopStore
from worker.engine.store import RestoreStats, restore_partitions
from worker.runtime.logs import get_logger

# The lines are the consume loop's: they keep its logger name, which dashboards and searches use.
log = get_logger("worker.engine.consume_loop")

RestoreConsumerFactory = Callable[[], AIOKafkaConsumer]

#: Per partition number: the latest record of every key, and what reading them took.
Restored: TypeAlias = dict[int, tuple[dict[str, Any], RestoreStats]]


async def restore(
    factory: RestoreConsumerFactory,
    store: LoopStore,
    state_topic: str,
    mine: list[TopicPartition],
) -> Restored:
    """Load the state of ``mine``'s partition numbers into ``store`` and return what was read.
    A store that tracks the hand-over is told where each input of ``mine`` ended, read after
    the restore so it covers every record whose state the restore saw: what lies below may
    have been fetched, and acted on, by a previous owner (docs/architecture.md, "Write-ahead
    intent"). The restored records live as long as their partition, so they are kept out of
    every future full collection, which otherwise re-scans all of them."""
    restorer = factory()
    await restorer.start()
    try:
        numbers = sorted({tp.partition for tp in mine})
        state_tps = [TopicPartition(state_topic, p) for p in numbers]
        restored = await restore_partitions(restorer, state_tps, decode=store.decode)
        ends = await high_water_marks(restorer, mine) if store.tracks_handover else {}
    finally:
        await restorer.stop()
    for partition, (records, _) in restored.items():
        store.load(partition, records)
    for tp, end in ends.items():
        store.handed_over(tp.topic, tp.partition, end)
    gc.freeze()  # measured in bench/README.md, "Hot spots found and removed"
    return restored


def report_restored(metrics: Any, restored: Restored) -> None:
    """The restore's series (``LoopSeries``) and one log line per partition."""
    for partition, (_, stats) in restored.items():
        metrics.restore_seconds.observe(stats.seconds)
        metrics.restore_records.inc(stats.records)
        metrics.restore_undecodable.inc(stats.undecodable)
        log.info(
            "partition_restored",
            partition=partition,
            records=stats.records,
            accounts=stats.accounts,
            undecodable=stats.undecodable,
            seconds=round(stats.seconds, 4),
        )
