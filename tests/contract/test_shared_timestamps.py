"""``worker.contract.shared_timestamps`` against the plain decode as the oracle: a record decodes
to what it decodes to without sharing, and equal stamps are one object."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from tests.strategies import ids
from worker.contract.compact_ids import compact_id
from worker.contract.messages import AccountRecord, InFlight, Outcome, decode_record, encode_record

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
