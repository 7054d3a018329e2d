"""The state store: account records of the owned partitions, in memory, rebuilt from
``auth.state`` (the changelog) whenever a partition is assigned.

Correct without compaction: restore reads the partition from the beginning and keeps the last
record per key, so a broker that never compacts (the embedded one) only costs restore time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from worker.logs import get_logger
from worker.messages import AccountRecord, decode_record

log = get_logger(__name__)


class StateStore:
    """Records by partition, and the index of accounts whose follow-up timers are running."""

    def __init__(self) -> None:
        self._parts: dict[int, dict[str, AccountRecord]] = {}
        self.following: dict[str, int] = {}

    def get(self, partition: int, account_id: str) -> AccountRecord | None:
        return self._parts.get(partition, {}).get(account_id)

    def put(self, partition: int, record: AccountRecord) -> None:
        self._parts.setdefault(partition, {})[record.account_id] = record
        if record.follow_up is not None and not record.deregistered:
            self.following[record.account_id] = partition
        else:
            self.following.pop(record.account_id, None)

    def load(self, partition: int, records: dict[str, AccountRecord]) -> None:
        """Install a restored partition (replacing whatever was there)."""
        self.drop(partition)
        self._parts[partition] = {}
        for record in records.values():
            self.put(partition, record)

    def drop(self, partition: int) -> None:
        for account_id in self._parts.pop(partition, {}):
            self.following.pop(account_id, None)

    def partitions(self) -> set[int]:
        return set(self._parts)

    def records(self, partition: int) -> Iterator[AccountRecord]:
        yield from self._parts.get(partition, {}).values()

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts.values())


@dataclass(frozen=True, slots=True)
class RestoreStats:
    partition: int
    records: int
    accounts: int
    undecodable: int
    seconds: float


async def restore_partition(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    *,
    idle_timeout_ms: int = 300,
    batch: int = 10_000,
) -> tuple[dict[str, AccountRecord], RestoreStats]:
    """Read ``tp`` of auth.state from the beginning to its high-water mark.

    ``consumer`` is a group-less consumer used only for restoring. The embedded broker answers
    ``end_offsets`` wrongly (design.md §10), so the end is the fetch response's high-water
    mark, or an idle poll when the partition is empty.
    """
    started = time.perf_counter()
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    latest: dict[str, AccountRecord] = {}
    count = bad = 0
    while True:
        chunk = await consumer.getmany(tp, timeout_ms=idle_timeout_ms, max_records=batch)
        records = chunk.get(tp, [])
        for msg in records:
            count += 1
            key = msg.key.decode() if msg.key else None
            if msg.value is None:  # tombstone (written by a compacting producer, if any)
                if key:
                    latest.pop(key, None)
                continue
            try:
                record = decode_record(msg.value)
            except ValidationError:
                bad += 1
                log.error("state_record_undecodable", partition=tp.partition, offset=msg.offset)
                continue
            latest[record.account_id] = record
        high = consumer.highwater(tp)
        position = await consumer.position(tp)
        if not records and (high is None or position >= high):
            break
        if high is not None and position >= high:
            break
        await asyncio.sleep(0)
    stats = RestoreStats(
        partition=tp.partition,
        records=count,
        accounts=len(latest),
        undecodable=bad,
        seconds=time.perf_counter() - started,
    )
    return latest, stats
