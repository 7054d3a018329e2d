"""Where a command belongs: its key's home partition of auth.commands (aiokafka's murmur2, so
the worker and the front-end never disagree); a command from a client with another
partitioner is forwarded there (docs/architecture.md, "Keys, compaction and co-partitioning")."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import KW_ONLY, dataclass

from worker.engine.key_hash import key_hash

FORWARDED_FROM = "forwarded-from"
"""Header added to a forwarded command: ``<topic>:<partition>:<offset>`` of the original."""


REPLY_PARTITION = "reply-partition"
"""Header of a command naming the auth.replies partition its sender reads (decimal ASCII);
absent: the reply is keyed by the account like every other record (docs/architecture.md,
"Replies to the waiting replica")."""


def reply_partition(headers: Collection[tuple[str, bytes]]) -> int | None:
    """The partition a command's reply goes to, when its sender named one it can use."""
    for name, value in headers:
        if name == REPLY_PARTITION:
            try:
                wanted = int(value)
            except ValueError:
                return None
            return wanted if wanted >= 0 else None
    return None


def home_partition(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner gives ``key`` (``toPositive(murmur2
    (key)) % partitions``, as aiokafka's ``DefaultPartitioner`` with partitions 0..n-1)."""
    return (key_hash(key) & 0x7FFFFFFF) % partitions


def forwarded_from(headers: Collection[tuple[str, bytes]]) -> str | None:
    """Where a forwarded command came from, or None for one that was produced here first."""
    for name, value in headers:
        if name == FORWARDED_FROM:
            return value.decode("utf-8", "replace")
    return None


@dataclass(frozen=True, eq=False)
class Router:
    """Home partitions of one topic's keys, by the partition count of the consumer's metadata
    (the count the producers' partitioners used, following partitions added later), the
    setting only before metadata is known (``COMMANDS_PARTITIONS`` sizes new topics only)."""

    topic: str
    _: KW_ONLY
    partitions_for_topic: Callable[[str], Collection[int] | None]
    fallback: int

    def partitions(self) -> int:
        known = self.partitions_for_topic(self.topic)
        return len(known) if known else self.fallback

    def home(self, key: bytes) -> int:
        return home_partition(key, self.partitions())
