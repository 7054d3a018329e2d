"""``evolve`` is ``dataclasses.replace`` for the hot path: same result, or a clear error."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.evolve import evolve
from worker.messages import AccountRecord, FollowUp, InFlight

BASE = AccountRecord(
    account_id="acc_1",
    workspace_id="ws_a",
    status="passkey_confirmation",
    auth_status="passkey_confirmation",
    version=2,
    updated_at=1.0,
    provider="simulator",
    provider_account_ref="ref-1",
)

floats = st.floats(0, 2e9)  # no NaN: NaN != NaN would fail the equality, not evolve
texts = st.text(alphabet="abcxyz-_019", max_size=12)  # a fixed alphabet needs no charmap
changes = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["authorized", "failed", "passkey_confirmation_sent"]),
        "version": st.integers(min_value=0, max_value=10**9),
        "updated_at": floats,
        "provider": st.none() | texts,
        "deregistered": st.booleans(),
        "in_flight": st.none() | st.builds(InFlight, texts, texts, floats, floats),
        "follow_up": st.none() | st.builds(FollowUp, floats, floats, st.integers(0, 100)),
    },
)


@given(changes)
def test_evolve_equals_dataclasses_replace(kw: dict[str, Any]) -> None:
    evolved = evolve(BASE, **kw)
    assert evolved == dataclasses.replace(BASE, **kw)
    assert type(evolved) is AccountRecord
    assert evolved is not BASE
    assert BASE.version == 2  # the original is untouched


def test_evolve_rejects_unknown_fields_and_unsuitable_classes() -> None:
    with pytest.raises(TypeError):
        evolve(BASE, no_such_field=1)

    @dataclasses.dataclass(frozen=True)
    class NotSlotted:
        x: int

    with pytest.raises(TypeError, match="slotted"):
        evolve(NotSlotted(1), x=2)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("negative")

    with pytest.raises(TypeError, match="__post_init__"):
        evolve(Checked(1), x=-1)
