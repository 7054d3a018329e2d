"""decode_command: every poison shape becomes a precise failure, never an exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.contract.messages import (
    DecodeFailure,
    DeregisterAccount,
    ObserveAuthState,
    PasskeyConfirm,
    RegisterAccount,
    decode_command,
    request_id_of,
    workspace_id_of,
)

GOOD = {
    "type": "passkey_confirm",
    "schema_version": 1,
    "command_id": "c-1",
    "request_id": "r-1",
    "workspace_id": "ws_a",
    "account_id": "acc_1",
    "issued_at": "2026-11-21T10:00:00Z",
}


def enc(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_decodes_each_command_type() -> None:
    assert isinstance(decode_command(b"acc_1", enc(GOOD)), PasskeyConfirm)
    reg = {
        "type": "register_account",
        "command_id": "c",
        "workspace_id": "w",
        "account_id": "acc_1",
        "status": "pending_auth",
    }
    assert isinstance(decode_command(b"acc_1", enc(reg)), RegisterAccount)
    obs = {
        "type": "observe_auth_state",
        "command_id": "c",
        "account_id": "acc_1",
        "status": "authorized",
        "auth_status": "authorized",
    }
    assert isinstance(decode_command(b"acc_1", enc(obs)), ObserveAuthState)
    der = {
        "type": "deregister_account",
        "command_id": "c",
        "workspace_id": "w",
        "account_id": "acc_1",
    }
    assert isinstance(decode_command(b"acc_1", enc(der)), DeregisterAccount)


def test_the_ids_a_command_may_name() -> None:
    """The caller's request id and the workspace, for the commands that carry them; None
    (not an empty string, not an attribute error) for the others."""
    confirm = decode_command(b"acc_1", enc(GOOD))
    query = decode_command(b"acc_1", enc({**GOOD, "type": "get_auth_state"}))
    observed = decode_command(
        b"acc_1",
        enc({**GOOD, "type": "observe_auth_state", "status": "x", "auth_status": "x"}),
    )
    register = decode_command(
        b"acc_1", enc({**GOOD, "type": "register_account", "status": "pending_auth"})
    )
    deregister = decode_command(b"acc_1", enc({**GOOD, "type": "deregister_account"}))
    commands = [confirm, query, observed, register, deregister]
    assert not any(isinstance(c, DecodeFailure) for c in commands)
    ids = [
        (request_id_of(c), workspace_id_of(c)) for c in commands if not isinstance(c, DecodeFailure)
    ]
    assert ids == [("r-1", "ws_a"), ("r-1", "ws_a"), (None, None), (None, "ws_a"), (None, "ws_a")]


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (b"acc_1", None, "not_json"),
        (b"acc_1", b"\xff\xfe", "not_json"),
        (b"acc_1", b"{not json", "not_json"),
        (b"acc_1", b"[1]", "not_object"),
        (b"acc_1", b'"str"', "not_object"),
        (b"acc_1", enc({**GOOD, "type": "nope"}), "unknown_type"),
        (b"acc_1", enc({k: v for k, v in GOOD.items() if k != "type"}), "unknown_type"),
        (b"acc_1", enc({**GOOD, "request_id": None}), "invalid"),
        (b"acc_1", enc({**GOOD, "issued_at": "yesterday"}), "invalid"),
        (b"acc_1", enc({**GOOD, "schema_version": 2}), "invalid"),
        (b"acc_1", enc({**GOOD, "account_id": "a" * 129}), "invalid"),
        (b"acc_1", enc({**GOOD, "account_id": "../etc"}), "invalid"),
        (b"acc_1", enc({**GOOD, "command_id": 12}), "invalid"),
        (b"acc_2", enc(GOOD), "key_mismatch"),
        (None, enc(GOOD), "key_mismatch"),
        (b"acc_1", b"{" + b" " * 70_000 + b"}", "too_large"),
    ],
)
def test_poison_is_a_precise_failure(key: bytes | None, value: bytes | None, reason: str) -> None:
    result = decode_command(key, value)
    assert isinstance(result, DecodeFailure)
    assert result.reason == reason
    assert result.detail


def test_failure_keeps_readable_ids_for_the_error_event() -> None:
    result = decode_command(b"acc_1", enc({**GOOD, "issued_at": "x"}))
    assert isinstance(result, DecodeFailure)
    assert (result.account_id, result.workspace_id, result.command_id, result.request_id) == (
        "acc_1",
        "ws_a",
        "c-1",
        "r-1",
    )
    hostile = decode_command(b"k", enc({"type": "passkey_confirm", "account_id": "a b\n"}))
    assert isinstance(hostile, DecodeFailure) and hostile.account_id is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.one_of(st.none(), st.binary(max_size=20)))
def test_random_bytes_never_raise(value: bytes, key: bytes | None) -> None:
    result = decode_command(key, value)
    assert isinstance(result, DecodeFailure)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([*GOOD.keys(), "status", "auth_status", "provider", "extra"]),
        json_values,
    ),
    st.sampled_from(
        [
            "passkey_confirm",
            "register_account",
            "observe_auth_state",
            "deregister_account",
            "other",
            7,
        ]
    ),
)
def test_random_objects_never_raise(obj: dict[str, object], type_: object) -> None:
    obj["type"] = type_
    account = obj.get("account_id")
    key = account.encode() if isinstance(account, str) else b"k"
    result = decode_command(key, enc(obj))
    if not isinstance(result, DecodeFailure):
        assert result.account_id == account
