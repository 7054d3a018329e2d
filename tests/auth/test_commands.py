"""``decide`` names every command type: a type it does not know is a bug it refuses, never a
deregistration by default (the rest of the decision table is ``test_flow.py``'s)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, cast

import pytest

from worker.auth.flow import Policy, decide
from worker.contract.messages import (
    AccountRecord,
    Command,
    DeregisterAccount,
    GetAuthState,
    ObserveAuthState,
    PasskeyConfirm,
    RegisterAccount,
)

NOW = 1_800_000_000.0
POLICY = Policy(providers=frozenset({"simulator"}))
RECORD = AccountRecord(
    account_id="acc_1",
    workspace_id="ws_a",
    status="passkey_confirmation",
    auth_status="passkey_confirmation",
    version=3,
    updated_at=NOW - 10,
)


@dataclass(frozen=True)
class Stranger:
    """Shaped like a command (ids, workspace) but of no type ``decide`` names."""

    command_id: str = "cmd-x"
    workspace_id: str = "ws_a"
    account_id: str = "acc_1"
    type: str = "stranger"


def test_the_command_union_is_the_five_decide_names() -> None:
    union = typing.get_args(Command)[0]
    assert set(typing.get_args(union)) == {
        RegisterAccount,
        ObserveAuthState,
        PasskeyConfirm,
        DeregisterAccount,
        GetAuthState,
    }


def test_an_unknown_command_type_is_refused_not_taken_for_a_deregister() -> None:
    with pytest.raises(AssertionError):
        decide(RECORD, cast(Any, Stranger()), now=NOW, policy=POLICY)
    assert not RECORD.deregistered


def test_a_deregister_is_decided_by_its_own_case() -> None:
    cmd = DeregisterAccount(command_id="cmd-d", workspace_id="ws_a", account_id="acc_1")
    decision = decide(RECORD, cmd, now=NOW, policy=POLICY)
    assert decision.verdict == "ok"
    assert decision.record is not None and decision.record.deregistered
