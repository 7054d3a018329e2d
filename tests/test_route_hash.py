"""The worker's own murmur2 and producer partitioner equal aiokafka's, bit for bit."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from worker.route import KeyPartitioner, key_hash, murmur2


@given(st.binary(max_size=200))
def test_murmur2_equals_aiokafkas(key: bytes) -> None:
    assert murmur2(key) == aiokafka_murmur2(key)
    assert key_hash(key) == aiokafka_murmur2(key)


@given(st.binary(min_size=0, max_size=64), st.integers(min_value=1, max_value=300))
def test_key_partitioner_equals_the_default(key: bytes, n: int) -> None:
    partitions = list(range(n))
    ours = KeyPartitioner()(key, partitions, partitions)
    assert ours == DefaultPartitioner()(key, partitions, partitions)


def test_key_partitioner_without_a_key_picks_an_available_partition() -> None:
    assert KeyPartitioner()(None, [0, 1, 2], [2]) == 2
