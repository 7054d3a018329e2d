"""The auth.state record: what is on the topic decodes and re-encodes byte for byte, while
memory holds outcome command ids compacted and equal timestamps shared."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import ids
from worker.auth.flow import Policy, decide, expire, observe, settle_confirm
from worker.auth.provider.base import ProviderAuthState
from worker.contract.compact_ids import compact_id, expand_id
from worker.contract.messages import (
    AccountRecord,
    FollowUp,
    InFlight,
    Outcome,
    PasskeyConfirm,
    decode_record,
    encode_record,
)

# Written by the code before command ids were compacted (commit 5846526): canonical,
# upper-case and non-UUID command ids, an error outcome, a timer outcome at -0.0.
ON_THE_TOPIC = (
    b'{"account_id":"acc_1","workspace_id":"ws_a","status":"passkey_confirmation_sent",'
    b'"auth_status":"passkey_confirmation_sent","version":3,"updated_at":1800000001.25,'
    b'"provider":"simulator","provider_account_ref":"ref-1","deregistered":false,'
    b'"in_flight":{"command_id":"9B2F7C1E-4D3A-4E8B-9A51-0000000000AA","request_id":"req_1",'
    b'"started_at":1800000001.25,"deadline":1800000031.25},"follow_up":{"deadline_at":'
    b'1800000301.25,"next_poll_at":1800000003.25,"polls":1},"recent":[{"command_id":'
    b'"5d0c6a34-0b7e-4a0f-9a51-000000000000","http_status":200,"status":"passkey_confirmation",'
    b'"auth_status":"passkey_confirmation","version":1,"at":1800000000.5,"request_id":null,'
    b'"code":null,"numeric_code":null,"previous_status":null,"changed":true},{"command_id":'
    b'"9B2F7C1E-4D3A-4E8B-9A51-0000000000AA","http_status":409,"status":'
    b'"passkey_confirmation_sent","auth_status":"passkey_confirmation_sent","version":3,"at":'
    b'1800000001.25,"request_id":"req_0b8f4c1e7d2a4f519e3b000000000001","code":'
    b'"account_already_authorized","numeric_code":20016,"previous_status":'
    b'"passkey_confirmation","changed":false},{"command_id":"","http_status":200,"status":"x",'
    b'"auth_status":"x","version":3,"at":-0.0,"request_id":null,"code":null,"numeric_code":null,'
    b'"previous_status":null,"changed":false},{"command_id":"cmd-1","http_status":200,"status":'
    b'"passkey_confirmation_sent","auth_status":"passkey_confirmation_sent","version":3,"at":'
    b'1800000001.25,"request_id":"req-cmd-1","code":null,"numeric_code":null,"previous_status":'
    b'"passkey_confirmation","changed":true}],"type":"account_state","schema_version":1}'
)


def test_a_record_on_the_topic_round_trips_byte_for_byte() -> None:
    record = decode_record(ON_THE_TOPIC)
    assert encode_record(record) == ON_THE_TOPIC
    first, upper, timer, plain = record.recent
    assert first.cid == 0x5D0C6A340B7E4A0F9A51000000000000
    assert first.command_id == "5d0c6a34-0b7e-4a0f-9a51-000000000000"
    assert upper.cid == upper.command_id == "9B2F7C1E-4D3A-4E8B-9A51-0000000000AA"
    assert timer.cid is None and timer.command_id is None and plain.cid == "cmd-1"
    # Equal timestamps are one object, as the flow made them.
    assert upper.at is plain.at is record.updated_at
    assert record.in_flight is not None and record.in_flight.started_at is record.updated_at
    assert first.at is not record.updated_at


def test_an_outcome_no_command_caused_is_an_empty_id_on_the_wire() -> None:
    """None in memory, ``""`` on the topic (as every version has written it, and as workers
    still on the previous version read it), None again when decoded."""
    outcome = Outcome(
        cid=None,
        http_status=200,
        status="failed",
        auth_status="failed",
        version=4,
        at=1800000002.5,
        previous_status="passkey_confirmation_sent",
        changed=True,
    )
    record = AccountRecord(
        account_id="acc_1",
        workspace_id="ws_a",
        status="failed",
        auth_status="failed",
        version=4,
        updated_at=1800000002.5,
        recent=(outcome,),
    )
    value = encode_record(record)
    assert json.loads(value)["recent"][0]["command_id"] == ""
    assert b'"recent":[{"command_id":"","http_status":200,' in value
    decoded = decode_record(value)
    assert decoded == record
    assert decoded.recent[0].cid is None and decoded.recent[0].command_id is None
    assert encode_record(decoded) == value


def test_an_expired_flow_names_no_command_and_remembers_none() -> None:
    policy = Policy(providers=frozenset({"simulator"}))
    sent = AccountRecord(
        account_id="acc_1",
        workspace_id="ws_a",
        status="passkey_confirmation_sent",
        auth_status="passkey_confirmation_sent",
        version=2,
        updated_at=1800000000.0,
        follow_up=FollowUp(deadline_at=1800000300.0, next_poll_at=1800000002.0),
    )
    done = expire(sent, now=1800000300.0, policy=policy)
    assert done.record is not None and done.record.status == "failed"
    assert done.record.recent == (), "only a command's outcome is kept for its duplicates"
    assert done.status_event is not None and done.status_event.command_id is None
    polled = observe(sent, "authorized", "authorized", command_id=None, now=1.0, policy=policy)
    assert polled.record is not None and polled.record.recent == ()


def test_zero_timestamps_keep_their_sign() -> None:
    record = AccountRecord(
        account_id="acc_1",
        workspace_id="ws_a",
        status="x",
        auth_status="x",
        version=1,
        updated_at=0.0,
        recent=(
            Outcome(cid="c", http_status=200, status="x", auth_status="x", version=1, at=-0.0),
        ),
    )
    value = encode_record(record)
    assert b'"at":-0.0' in value
    assert encode_record(decode_record(value)) == value


floats = st.floats(min_value=-1e10, max_value=4e9, allow_nan=False)
statuses = st.sampled_from(["passkey_confirmation", "passkey_confirmation_sent", "authorized"])
outcomes = st.builds(
    Outcome,
    cid=st.none() | ids.filter(bool).map(compact_id),
    http_status=st.sampled_from([200, 404, 409]),
    status=statuses,
    auth_status=statuses,
    version=st.integers(0, 10**6),
    at=floats,
    rid=st.none() | ids.map(compact_id),
    code=st.none() | st.just("account_already_authorized"),
    numeric_code=st.none() | st.integers(10000, 99999),
    previous_status=st.none() | statuses,
    changed=st.booleans(),
)
records = st.builds(
    AccountRecord,
    account_id=st.just("acc_1"),
    workspace_id=st.just("ws_a"),
    status=statuses,
    auth_status=statuses,
    version=st.integers(0, 10**6),
    updated_at=floats,
    provider=st.none() | st.just("simulator"),
    provider_account_ref=st.none() | ids,
    deregistered=st.booleans(),
    in_flight=st.none() | st.builds(InFlight, ids, ids, floats, floats),
    follow_up=st.none() | st.builds(FollowUp, floats, floats, st.integers(0, 100)),
    recent=st.lists(outcomes, max_size=8).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_records_round_trip_exactly(record: AccountRecord, data: st.DataObject) -> None:
    # Some outcomes stamped with the record's own time, as the flow does.
    recent = tuple(
        replace(o, at=record.updated_at) if data.draw(st.booleans()) else o for o in record.recent
    )
    record = replace(record, recent=recent)
    value = encode_record(record)
    decoded = decode_record(value)
    assert decoded == record
    assert encode_record(decoded) == value
    assert [o.command_id for o in decoded.recent] == [
        None if o.cid is None else expand_id(o.cid) for o in record.recent
    ]
    assert [o.request_id for o in decoded.recent] == [
        None if o.rid is None else expand_id(o.rid) for o in record.recent
    ]


def test_a_uuid_command_is_deduplicated_across_a_restore() -> None:
    policy = Policy(providers=frozenset({"simulator"}))
    now = 1_800_000_000.0
    record = AccountRecord(
        account_id="acc_1",
        workspace_id="ws_a",
        status="passkey_confirmation",
        auth_status="passkey_confirmation",
        version=1,
        updated_at=now,
        provider="simulator",
        provider_account_ref="ref-1",
    )
    cmd = PasskeyConfirm(
        command_id=str(uuid.uuid4()),
        request_id=f"req_{uuid.uuid4().hex}",
        workspace_id="ws_a",
        account_id="acc_1",
        issued_at=datetime.fromtimestamp(now, UTC),
    )
    intent = decide(record, cmd, now=now, policy=policy).record
    assert intent is not None
    sent = ProviderAuthState("passkey_confirmation_sent", "passkey_confirmation_sent")
    done = settle_confirm(intent, sent, now=now + 1, policy=policy)
    assert done.record is not None and isinstance(done.record.recent[-1].cid, int)
    assert isinstance(done.record.recent[-1].rid, int)
    restored = decode_record(encode_record(done.record))
    again = decide(restored, cmd, now=now + 50, policy=policy)
    assert again.verdict == "duplicate"
    assert again.reply == done.reply and again.status_event == done.status_event
    assert again.reply is not None and again.reply.command_id == cmd.command_id
    assert again.reply.request_id == cmd.request_id
