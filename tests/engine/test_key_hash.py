"""``worker.engine.key_hash`` against aiokafka's ``murmur2`` and ``DefaultPartitioner`` as the
oracle, and the remembered hashes bounded."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner, murmur2
from hypothesis import given
from hypothesis import strategies as st

from worker.engine.key_hash import _HASHES, _HASHES_MAX, KeyPartitioner, key_hash


@given(st.binary(max_size=200))
def test_key_hash_is_aiokafkas_murmur2(key: bytes) -> None:
    assert key_hash(key) == murmur2(key)
    assert key_hash(key) == murmur2(key)  # remembered


@given(st.binary(min_size=0, max_size=64), st.integers(min_value=1, max_value=300))
def test_key_partitioner_equals_the_default(key: bytes, n: int) -> None:
    partitions = list(range(n))
    ours = KeyPartitioner()(key, partitions, partitions)
    assert ours == DefaultPartitioner()(key, partitions, partitions)


def test_key_partitioner_without_a_key_picks_an_available_partition() -> None:
    assert KeyPartitioner()(None, [0, 1, 2], [2]) == 2


def test_the_remembered_hashes_stay_bounded() -> None:
    for i in range(_HASHES_MAX + 10):
        assert key_hash(b"acc-%d" % i) == murmur2(b"acc-%d" % i)
    assert len(_HASHES) <= _HASHES_MAX
