"""The auth.state record: what is on the topic decodes and re-encodes byte for byte, while
memory holds equal timestamps shared."""

from __future__ import annotations

from worker.messages import (
    AccountRecord,
    Outcome,
    decode_record,
    encode_record,
)

# Written by the code before timestamps were shared (commit 5846526): canonical,
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
    first, upper, _timer, plain = record.recent
    # Equal timestamps are one object, as the flow made them.
    assert upper.at is plain.at is record.updated_at
    assert record.in_flight is not None and record.in_flight.started_at is record.updated_at
    assert first.at is not record.updated_at


def test_zero_timestamps_keep_their_sign() -> None:
    record = AccountRecord(
        account_id="acc_1",
        workspace_id="ws_a",
        status="x",
        auth_status="x",
        version=1,
        updated_at=0.0,
        recent=(
            Outcome(
                command_id="c", http_status=200, status="x", auth_status="x", version=1, at=-0.0
            ),
        ),
    )
    value = encode_record(record)
    assert b'"at":-0.0' in value
    assert encode_record(decode_record(value)) == value
