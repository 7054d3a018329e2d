"""A key's murmur2 hash, remembered for the last few thousand keys: the worker hashes each
account key several times per command (its home partition, the producer's partitioner), and
aiokafka computes murmur2 in Python each time. ``tests/engine/test_key_hash.py`` holds it to
aiokafka's own ``murmur2`` and ``DefaultPartitioner`` as the oracle."""

from __future__ import annotations

import random
from collections.abc import Sequence

from aiokafka.partitioner import murmur2

_HASHES: dict[bytes, int] = {}
_HASHES_MAX = 8192


def key_hash(key: bytes) -> int:
    """``murmur2(key)``, remembered for the last few thousand keys."""
    digest = _HASHES.get(key)
    if digest is None:
        if len(_HASHES) >= _HASHES_MAX:
            _HASHES.clear()
        digest = _HASHES[key] = murmur2(key)
    return digest


class KeyPartitioner:
    """aiokafka's ``DefaultPartitioner`` on ``key_hash``: the worker producer's
    ``partitioner``."""

    def __call__(
        self, key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
    ) -> int:
        if key is None:
            return random.choice(available or all_partitions)
        return all_partitions[(key_hash(key) & 0x7FFFFFFF) % len(all_partitions)]
