"""What the consume loop queues on a lane, one per (partition, key): the key's records in
order, and ``DUE``, the marker of a follow-up the key's store said is due (a poll, an expiry, a
delivery retry). A lane item is a record or ``DUE``, never anything else, so mypy tells the two
apart (docs/architecture.md, "Per-account lanes")."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, Literal, TypeAlias

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

#: A lane's key is the record's key, of any length the broker accepts: log lines keep its
#: start only.
LOGGED_KEY_CHARS = 200


class Due(Enum):
    """The one due marker: a singleton, so queuing a follow-up allocates nothing."""

    KEY = "due"


#: The follow-up of the lane's key, queued behind the key's records.
DUE: Final = Due.KEY

#: One unit of work on a lane: a record to handle, or the key's due follow-up.
LaneItem: TypeAlias = ConsumerRecord[bytes, bytes] | Literal[Due.KEY]


@dataclass(slots=True)
class Lane:
    """One account's queue of work on one partition; at most one task drains it."""

    partition: int
    items: deque[LaneItem] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


@dataclass
class Unreadable(ConsumerRecord[bytes, bytes]):  # type: ignore[misc]
    """Stands in a batch for a record the Kafka client could not parse (``worker.engine.fetch``): it
    takes the record's place on a lane and its offset in the watermark, and is dead-lettered
    (by offset: its bytes could not be read) instead of handled."""

    error: str = ""

    @classmethod
    def of(cls, tp: TopicPartition, offset: int, exc: BaseException) -> Unreadable:
        error = f"the Kafka client cannot parse the record: {type(exc).__name__}: {exc}"
        return cls(tp.topic, tp.partition, offset, -1, -1, None, None, None, -1, -1, [], error)
