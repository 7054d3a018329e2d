"""The confirm decision table (docs/architecture.md), row by row, against the pure decision
(the machine's shape: ``test_machine.py``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from worker.auth.flow import Policy, decide, expire, is_owner, observe, settle_confirm
from worker.auth.machine import (
    AUTHORIZED,
    CHALLENGE,
    FAILED,
    PRE_CHALLENGE,
    SENT,
)
from worker.auth.provider.base import ProviderAuthState
from worker.contract.catalogue import ServiceError
from worker.contract.messages import (
    AccountRecord,
    DeregisterAccount,
    InFlight,
    ObserveAuthState,
    PasskeyConfirm,
    RegisterAccount,
)

NOW = 1_800_000_000.0
POLICY = Policy(providers=frozenset({"simulator"}))


def record(status: str = CHALLENGE, **kw: object) -> AccountRecord:
    base = AccountRecord(
        account_id="acc_1",
        workspace_id="ws_a",
        status=status,
        auth_status=status,
        version=3,
        updated_at=NOW - 10,
        provider="simulator",
        provider_account_ref="ref-1",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def confirm(command_id: str = "cmd-1", workspace: str = "ws_a", **kw: object) -> PasskeyConfirm:
    fields: dict[str, object] = {
        "command_id": command_id,
        "request_id": f"req-{command_id}",
        "workspace_id": workspace,
        "account_id": "acc_1",
        "issued_at": datetime.fromtimestamp(NOW, UTC),
    }
    fields.update(kw)
    return PasskeyConfirm.model_validate(fields)


def assert_error(rec: AccountRecord | None, code: str, http: int, numeric: int) -> None:
    d = decide(rec, confirm(), now=NOW, policy=POLICY)
    assert d.verdict == "error"
    assert d.call is None
    assert d.reply is not None and d.reply.http_status == http
    assert d.reply.body.error is not None
    assert (d.reply.body.error.code, d.reply.body.error.numeric_code) == (code, numeric)
    assert d.reply.body.data is None
    assert d.reply.body.request_id == "req-cmd-1"
    assert d.error_event is not None
    assert d.error_event.error == d.reply.body.error
    assert d.error_event.http_status == http
    assert d.status_event is None
    if d.record is not None and rec is not None:
        assert (d.record.status, d.record.version) == (rec.status, rec.version)


# --- the decision table -----------------------------------------------------------------------


def test_unknown_account_is_404() -> None:
    assert_error(None, "not_found", 404, 10001)


def test_deregistered_account_is_404() -> None:
    assert_error(record(deregistered=True), "not_found", 404, 10001)


def test_foreign_workspace_is_404_and_untouched() -> None:
    rec = record(workspace_id="ws_other")
    d = decide(rec, confirm(), now=NOW, policy=POLICY)
    assert d.reply is not None and d.reply.http_status == 404
    assert d.record is None  # the other workspace's record is not even rewritten


def test_foreign_workspace_cannot_replay_the_owner_reply() -> None:
    rec = record()
    first = decide(rec, confirm(), now=NOW, policy=POLICY)
    assert first.record is not None and first.call == "confirm_passkey"
    done = settle_confirm(first.record, ProviderAuthState(SENT, SENT), now=NOW, policy=POLICY)
    assert done.record is not None
    forged = decide(done.record, confirm(workspace="ws_b"), now=NOW, policy=POLICY)
    assert forged.reply is not None and forged.reply.http_status == 404


@pytest.mark.parametrize(
    "owner_state",
    [
        {},
        {"status": SENT},
        {"status": AUTHORIZED},
        {"deregistered": True},
        {"provider": None},
        {"in_flight": InFlight(command_id="cmd-1", request_id="r", started_at=NOW, deadline=NOW)},
        {"in_flight": InFlight(command_id="other", request_id="r", started_at=NOW, deadline=NOW)},
    ],
)
def test_a_foreign_confirm_is_exactly_a_confirm_on_an_unknown_id(
    owner_state: dict[str, object],
) -> None:
    """Whatever the owner's account looks like (in flight, settled, with the very command id
    in its dedup window), another workspace gets the decision it would get for an id that
    does not exist: the same reply, the same error event, and no write."""
    owned = replace(record(), **owner_state)  # type: ignore[arg-type]
    seen = settle_confirm(
        decide(record(), confirm(), now=NOW - 5, policy=POLICY).record or owned,
        ProviderAuthState(SENT, SENT),
        now=NOW - 4,
        policy=POLICY,
    ).record
    assert seen is not None and seen.recent, "cmd-1 is in the owner's dedup window"
    for owners in (owned, replace(seen, **owner_state)):  # type: ignore[arg-type]
        assert not is_owner(owners, confirm(workspace="ws_b"))
        foreign = decide(owners, confirm(workspace="ws_b"), now=NOW, policy=POLICY)
        unknown = decide(None, confirm(workspace="ws_b"), now=NOW, policy=POLICY)
        assert foreign == unknown
        assert foreign.record is None and foreign.call is None
        assert foreign.error_event is not None and foreign.error_event.workspace_id == "ws_b"


def test_a_foreign_deregister_is_ignored_like_an_unknown_one() -> None:
    foreign = DeregisterAccount(command_id="d1", workspace_id="ws_b", account_id="acc_1")
    assert decide(record(), foreign, now=NOW, policy=POLICY) == decide(
        None, foreign, now=NOW, policy=POLICY
    )
    assert decide(record(), foreign, now=NOW, policy=POLICY).error_event is None


def test_the_owner_and_the_system_own_an_account() -> None:
    assert is_owner(record(), confirm())
    assert not is_owner(record(), confirm(workspace="ws_b"))
    observation = ObserveAuthState(
        command_id="o1", account_id="acc_1", status=SENT, auth_status=SENT
    )
    assert is_owner(record(), observation), "the provider's observation names no workspace"


def test_challenge_calls_provider_with_write_ahead_intent() -> None:
    d = decide(record(), confirm(), now=NOW, policy=POLICY)
    assert d.call == "confirm_passkey"
    assert d.record is not None and d.record.in_flight is not None
    assert d.record.in_flight.command_id == "cmd-1"
    assert d.record.version == 3  # the intent is bookkeeping, not a state change
    assert d.reply is None and d.status_event is None


def test_provider_success_is_200_and_sent() -> None:
    intent = decide(record(), confirm(), now=NOW, policy=POLICY).record
    assert intent is not None
    d = settle_confirm(intent, ProviderAuthState(SENT, SENT), now=NOW + 1, policy=POLICY)
    assert d.reply is not None and d.reply.http_status == 200
    assert d.reply.body.data is not None
    assert d.reply.body.data.model_dump() == {
        "account_id": "acc_1",
        "status": SENT,
        "auth_status": SENT,
    }
    assert d.record is not None
    assert (d.record.status, d.record.version, d.record.in_flight) == (SENT, 4, None)
    assert d.record.follow_up is not None
    assert d.status_event is not None
    assert (d.status_event.previous_status, d.status_event.status) == (CHALLENGE, SENT)
    assert d.status_event.version == 4
    assert d.status_event.request_id == "req-cmd-1"


def test_same_command_id_replays_original_reply_without_provider_call() -> None:
    intent = decide(record(), confirm(), now=NOW, policy=POLICY).record
    assert intent is not None
    done = settle_confirm(intent, ProviderAuthState(SENT, SENT), now=NOW + 1, policy=POLICY)
    assert done.record is not None
    again = decide(done.record, confirm(), now=NOW + 50, policy=POLICY)
    assert again.verdict == "duplicate"
    assert again.call is None
    assert again.record is None
    assert again.reply == done.reply
    assert again.status_event == done.status_event


def test_replayed_error_is_identical() -> None:
    rec = record(status="pending")
    first = decide(rec, confirm(), now=NOW, policy=POLICY)
    assert first.record is not None
    second = decide(first.record, confirm(), now=NOW + 9, policy=POLICY)
    assert second.verdict == "duplicate"
    assert second.reply == first.reply
    assert second.error_event == first.error_event


def test_already_sent_is_200_current_without_provider_call() -> None:
    d = decide(record(status=SENT), confirm(), now=NOW, policy=POLICY)
    assert d.call is None and d.verdict == "ok"
    assert d.reply is not None and d.reply.http_status == 200
    assert d.reply.body.data is not None and d.reply.body.data.status == SENT
    assert d.status_event is None
    assert d.record is not None and d.record.version == 3


def test_authorized_is_409_already_authorized() -> None:
    assert_error(record(status=AUTHORIZED), "account_already_authorized", 409, 20016)


@pytest.mark.parametrize("status", [*PRE_CHALLENGE, FAILED])
def test_before_challenge_or_failed_is_409_not_ready(status: str) -> None:
    assert_error(record(status=status), "provider_not_ready", 409, 30009)


def test_no_binding_is_409() -> None:
    assert_error(record(provider=None), "account_binding_not_found", 409, 30006)
    assert_error(record(provider_account_ref=None), "account_binding_not_found", 409, 30006)


def test_unregistered_adapter_is_502() -> None:
    assert_error(record(provider="nowhere"), "provider_adapter_not_found", 502, 30004)


@pytest.mark.parametrize(
    ("error", "http", "numeric"),
    [
        (ServiceError.of("unsupported_by_provider"), 501, 30003),
        (ServiceError.of("provider_account_mismatch"), 409, 20017),
        (ServiceError.of("provider_invalid_request"), 400, 30001),
        (ServiceError.of("provider_unavailable"), 502, 30002),
        (ServiceError.of("provider_unavailable").refine(30010), 502, 30010),
        (ServiceError.of("run_auth_action_failed"), 500, 20010),
    ],
)
def test_provider_failures_are_catalogued(error: ServiceError, http: int, numeric: int) -> None:
    intent = decide(record(), confirm(), now=NOW, policy=POLICY).record
    assert intent is not None
    d = settle_confirm(intent, error, now=NOW + 1, policy=POLICY)
    assert d.verdict == "error"
    assert d.reply is not None and d.reply.http_status == http
    assert d.reply.body.error is not None
    assert (d.reply.body.error.code, d.reply.body.error.numeric_code) == (error.code, numeric)
    assert d.record is not None
    assert (d.record.status, d.record.in_flight, d.record.version) == (CHALLENGE, None, 3)
    assert d.error_event is not None and d.error_event.error.numeric_code == numeric


def test_replayed_in_flight_command_is_redriven() -> None:
    intent = decide(record(), confirm(), now=NOW, policy=POLICY).record
    d = decide(intent, confirm(), now=NOW + 2, policy=POLICY)
    assert d.call == "redrive_confirm"


def test_expired_command_deadline_is_500_without_provider_call() -> None:
    past = datetime.fromtimestamp(NOW - 1, UTC)
    d = decide(record(), confirm(deadline=past), now=NOW, policy=POLICY)
    assert d.call is None
    assert d.reply is not None and d.reply.http_status == 500


# --- follow-up, registration, observation ---------------------------------------------------


def sent_record() -> AccountRecord:
    intent = decide(record(), confirm(), now=NOW, policy=POLICY).record
    assert intent is not None
    done = settle_confirm(intent, ProviderAuthState(SENT, SENT), now=NOW, policy=POLICY).record
    assert done is not None
    return done


def test_follow_up_to_authorized() -> None:
    d = observe(sent_record(), AUTHORIZED, AUTHORIZED, command_id=None, now=NOW + 3, policy=POLICY)
    assert d.record is not None and d.record.status == AUTHORIZED
    assert d.record.follow_up is None
    assert d.status_event is not None and d.status_event.version == 5
    assert d.reply is None


def test_stale_observation_is_ignored() -> None:
    d = observe(
        record(status=AUTHORIZED), "pending", "pending", command_id="x", now=NOW, policy=POLICY
    )
    assert d.verdict == "ignored" and d.record is None and d.status_event is None


def test_deadline_expires_flow_to_failed() -> None:
    rec = sent_record()
    assert rec.follow_up is not None
    early = expire(rec, now=NOW + 1, policy=POLICY)
    assert early.verdict == "ignored"
    late = expire(rec, now=rec.follow_up.deadline_at, policy=POLICY)
    assert late.record is not None and late.record.status == FAILED
    assert late.status_event is not None and late.status_event.status == FAILED


def test_register_then_observe_challenge() -> None:
    reg = RegisterAccount(
        command_id="r1",
        workspace_id="ws_a",
        account_id="acc_1",
        provider="simulator",
        provider_account_ref="ref",
        status="pending_auth",
    )
    d = decide(None, reg, now=NOW, policy=POLICY)
    assert d.record is not None and d.record.version == 1
    assert d.status_event is not None and d.status_event.previous_status is None
    obs = ObserveAuthState(
        command_id="o1", account_id="acc_1", status=CHALLENGE, auth_status=CHALLENGE
    )
    d2 = decide(d.record, obs, now=NOW + 1, policy=POLICY)
    assert d2.record is not None and d2.record.status == CHALLENGE and d2.record.version == 2
    replayed = decide(d2.record, obs, now=NOW + 2, policy=POLICY)
    assert replayed.verdict == "duplicate" and replayed.status_event == d2.status_event


def test_register_unknown_status_is_invalid_request() -> None:
    reg = RegisterAccount(
        command_id="r1", workspace_id="ws_a", account_id="acc_1", status="mystery"
    )
    d = decide(None, reg, now=NOW, policy=POLICY)
    assert d.error_event is not None and d.error_event.error.code == "invalid_request"
    assert d.record is None


def test_register_cannot_take_over_another_workspaces_account() -> None:
    reg = RegisterAccount(
        command_id="r9", workspace_id="ws_evil", account_id="acc_1", status=CHALLENGE
    )
    d = decide(record(), reg, now=NOW, policy=POLICY)
    assert d.record is None
    assert d.error_event is not None


def test_deregister_keeps_dedup_window_and_hides_account() -> None:
    dereg = DeregisterAccount(command_id="d1", workspace_id="ws_a", account_id="acc_1")
    d = decide(record(), dereg, now=NOW, policy=POLICY)
    assert d.record is not None and d.record.deregistered
    after = decide(d.record, confirm(command_id="c2"), now=NOW + 1, policy=POLICY)
    assert after.reply is not None and after.reply.http_status == 404
    foreign = DeregisterAccount(command_id="d2", workspace_id="ws_b", account_id="acc_1")
    assert decide(record(), foreign, now=NOW, policy=POLICY).record is None
