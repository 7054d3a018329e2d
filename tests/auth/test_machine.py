"""The shared machine's shape: every status, the one documented transition, no automatic
ones, and which provider progress the ends accept."""

from __future__ import annotations

from worker.auth.machine import (
    AUTHORIZED,
    CHALLENGE,
    FAILED,
    MACHINE,
    SENT,
    STATUSES,
    next_status,
)


def test_machine_is_shared_and_has_every_named_status() -> None:
    assert MACHINE.models == []
    assert set(MACHINE.states) == set(STATUSES)
    assert len(STATUSES) == 10


def test_seed_transition_and_no_auto_transitions() -> None:
    assert next_status("confirm_passkey", CHALLENGE) == SENT
    for status in STATUSES:
        if status != CHALLENGE:
            assert next_status("confirm_passkey", status) is None
    assert not any(name.startswith("to_") for name in MACHINE.events)


def test_terminal_statuses_accept_no_provider_progress_except_retry_after_failure() -> None:
    assert next_status("observe_pending_auth", AUTHORIZED) is None
    assert next_status("observe_failed", AUTHORIZED) is None
    assert next_status("observe_pending_auth", FAILED) == "pending_auth"
    assert next_status(f"observe_{AUTHORIZED}", SENT) == AUTHORIZED
    assert next_status("expire", SENT) == FAILED
