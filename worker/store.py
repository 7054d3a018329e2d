"""The state store: account records of the owned partitions, in memory, rebuilt from
``auth.state`` (the changelog) whenever a partition is assigned.

Correct without compaction: restore reads the partition from the beginning and keeps the last
record per key, so a broker that never compacts (the embedded one) only costs restore time.
"""

from __future__ import annotations

import gc
import heapq
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from worker.logs import get_logger
from worker.messages import AccountRecord, decode_record
from worker.replay import replay_to_highwater

log = get_logger(__name__)


_Timer = tuple[float, str, int]
"""A follow-up timer in the queue: (due epoch seconds, account id, partition)."""


class StateStore:
    """Records by partition, and the queue of follow-up timers of the accounts in flow.

    The timers are a heap ordered by due time, so finding the due ones costs O(log n) each
    instead of a scan of every account in flow four times a second (bench/README.md, hot spot
    #8). ``following`` maps each account in flow to its one live heap entry; an entry that
    is no longer that account's live one (the record moved on, settled or was dropped) is
    stale and skipped when it reaches the top.
    """

    def __init__(self) -> None:
        self._parts: dict[int, dict[str, AccountRecord]] = {}
        self.following: dict[str, _Timer] = {}
        self._timers: list[_Timer] = []

    def get(self, partition: int, account_id: str) -> AccountRecord | None:
        return self._parts.get(partition, {}).get(account_id)

    def put(self, partition: int, record: AccountRecord) -> None:
        self._parts.setdefault(partition, {})[record.account_id] = record
        fu = record.follow_up
        if fu is not None and not record.deregistered:
            self._arm(record.account_id, partition, min(fu.next_poll_at, fu.deadline_at))
        else:
            self.following.pop(record.account_id, None)

    def _arm(self, account_id: str, partition: int, due: float) -> None:
        live = self.following.get(account_id)
        if live is not None and live[0] == due and live[2] == partition:
            return
        timer = (due, account_id, partition)
        self.following[account_id] = timer
        heapq.heappush(self._timers, timer)

    def pop_due(self, now: float, *, retry_at: float) -> tuple[str, int] | None:
        """The next account (and its partition) whose timer is due at ``now``, or ``None``.

        Its timer is re-armed at ``retry_at``: if the caller cannot run the follow-up now, or
        the step changes nothing, the account comes back then; a step that stores a new record
        re-arms it from that record instead.
        """
        timers = self._timers
        while timers and timers[0][0] <= now:
            timer = heapq.heappop(timers)
            _, account_id, partition = timer
            if self.following.get(account_id) is timer:
                self._arm(account_id, partition, retry_at)
                return account_id, partition
        return None

    def load(self, partition: int, records: dict[str, AccountRecord]) -> None:
        """Install a restored partition (replacing whatever was there)."""
        self.drop(partition)
        self._parts[partition] = {}
        for record in records.values():
            self.put(partition, record)

    def drop(self, partition: int) -> None:
        for account_id in self._parts.pop(partition, {}):
            self.following.pop(account_id, None)
        if len(self._timers) > 2 * len(self.following) + 1024:
            # Mostly stale entries now (a partition was revoked): rebuild the heap.
            self._timers = list(self.following.values())
            heapq.heapify(self._timers)

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts.values())


@dataclass(frozen=True, slots=True)
class RestoreStats:
    partition: int
    records: int
    accounts: int
    undecodable: int
    seconds: float


async def restore_partitions(
    consumer: AIOKafkaConsumer,
    tps: list[TopicPartition],
    *,
    idle_timeout_ms: int = 200,
    batch: int = 10_000,
) -> dict[int, tuple[dict[str, AccountRecord], RestoreStats]]:
    """Read every partition in ``tps`` (of auth.state) from the beginning to its high-water
    mark, all at once, keeping the last record per account.

    ``consumer`` is a group-less consumer used only for restoring; where a partition ends is
    ``worker.replay``'s rule, the one the front-end's tails use too.
    """
    latest: dict[TopicPartition, dict[str, AccountRecord]] = {tp: {} for tp in tps}
    bad = dict.fromkeys(tps, 0)

    def fold(tp: TopicPartition, messages: list[Any]) -> None:
        bad[tp] += _apply(latest[tp], messages, tp)

    # Restored records hold no reference cycles, but each is a handful of GC-tracked objects,
    # and the cyclic collector would re-scan the growing pile over and over while it is built
    # (bench/README.md, hot spot #4). Paused for the replay, re-enabled after.
    collector_was_enabled = gc.isenabled()
    gc.disable()
    try:
        replayed = await replay_to_highwater(
            consumer, tps, fold, idle_timeout_ms=idle_timeout_ms, max_records=batch
        )
    finally:
        if collector_was_enabled:
            gc.enable()
    return {
        tp.partition: (
            latest[tp],
            RestoreStats(
                partition=tp.partition,
                records=replayed[tp].records,
                accounts=len(latest[tp]),
                undecodable=bad[tp],
                seconds=replayed[tp].seconds,
            ),
        )
        for tp in tps
    }


def _apply(latest: dict[str, AccountRecord], messages: list[Any], tp: TopicPartition) -> int:
    """Fold changelog records into ``latest``; returns how many could not be decoded."""
    bad = 0
    for msg in messages:
        if msg.value is None:  # a tombstone, from a compacting producer if there ever is one
            if msg.key:
                latest.pop(msg.key.decode(), None)
            continue
        try:
            record = decode_record(msg.value)
        except ValidationError:
            bad += 1
            log.error("state_record_undecodable", partition=tp.partition, offset=msg.offset)
            continue
        latest[record.account_id] = record
    return bad
