"""Each optimisation ``worker.speedups`` keeps, against its plain equivalent as the oracle."""

from __future__ import annotations

import uuid
from dataclasses import replace

from aiokafka.partitioner import DefaultPartitioner, murmur2
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from tests.strategies import ids
from worker.contract.messages import AccountRecord, InFlight, Outcome, decode_record, encode_record
from worker.speedups import (
    _HASHES,
    _HASHES_MAX,
    KeyPartitioner,
    compact_id,
    expand_id,
    key_hash,
)


def _canonical_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _request_id(value: str) -> bool:
    """``req_`` + a UUID's 32 lowercase hex digits: what the front-end makes."""
    hex_part = value.removeprefix("req_")
    return (
        value.startswith("req_")
        and len(hex_part) == 32
        and all(c in "0123456789abcdef" for c in hex_part)
    )


@given(ids)
def test_compact_id_is_exactly_reversible(value: str) -> None:
    compacted = compact_id(value)
    assert expand_id(compacted) == value
    assert isinstance(compacted, int) == (_canonical_uuid(value) or _request_id(value))


@given(st.uuids())
def test_compacted_ids_are_the_uuid_modules_numbers(value: uuid.UUID) -> None:
    assert compact_id(str(value)) == value.int
    assert expand_id(value.int) == str(uuid.UUID(int=value.int))
    request_id = compact_id("req_" + value.hex)
    assert isinstance(request_id, int) and request_id != value.int
    assert expand_id(request_id) == "req_" + value.hex


def test_the_two_compacted_forms_never_meet() -> None:
    hex_id = "0123456789abcdef0123456789abcdef"
    as_uuid = str(uuid.UUID(hex_id))
    assert compact_id(as_uuid) != compact_id("req_" + hex_id)
    assert expand_id(compact_id("req_" + "0" * 32)) == "req_" + "0" * 32


# The plain decode: the same adapter without a validation context shares nothing.
_plain = TypeAdapter(AccountRecord)
stamps = st.sampled_from([0.0, -0.0, 1.0, 1_800_000_001.25]) | st.floats(-1e10, 4e9)
outcomes = st.builds(
    Outcome,
    cid=st.none() | ids.filter(bool).map(compact_id),
    http_status=st.just(200),
    status=st.just("x"),
    auth_status=st.just("x"),
    version=st.integers(0, 9),
    at=stamps,
    rid=st.none() | ids.map(compact_id),
)
records = st.builds(
    AccountRecord,
    account_id=st.just("acc_1"),
    workspace_id=st.just("ws_a"),
    status=st.just("x"),
    auth_status=st.just("x"),
    version=st.integers(0, 9),
    updated_at=stamps,
    in_flight=st.none() | st.builds(InFlight, ids, ids, stamps, stamps),
    recent=st.lists(outcomes, max_size=4).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_shared_timestamps_decode_as_plain_floats_do(
    record: AccountRecord, data: st.DataObject
) -> None:
    # Some stamped with the record's own time, as the flow stamps them.
    own = st.booleans()
    recent = tuple(replace(o, at=record.updated_at) if data.draw(own) else o for o in record.recent)
    in_flight = record.in_flight
    if in_flight is not None and data.draw(own):
        in_flight = replace(in_flight, started_at=record.updated_at)
    record = replace(record, recent=recent, in_flight=in_flight)
    value = encode_record(record)

    decoded, plain = decode_record(value), _plain.validate_json(value)
    assert decoded == plain == record
    assert encode_record(decoded) == encode_record(plain) == value
    at = decoded.updated_at
    stamped = [o.at for o in decoded.recent]
    if decoded.in_flight is not None:
        stamped.append(decoded.in_flight.started_at)
    for stamp in stamped:
        # One object where equal and not zero (0.0 == -0.0 but they encode differently).
        assert (stamp is at) == (stamp == at and at != 0)


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
