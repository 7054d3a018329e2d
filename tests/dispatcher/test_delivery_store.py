"""The dispatcher's delivery-state store without a broker: pair records, old-form account
records split and merged on restore, and the timers of deferred pairs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.contract.delivery_log import webhook_id
from worker.dispatcher.delivery import DeliveryState, Pending, enqueue, state_key
from worker.dispatcher.delivery_store import AccountDeliveries, DeliveryStore, decode_state, merge

NOW = 1_800_000_000.0


def pending(event: str, endpoint: str = "ep_1", *, at: float = NOW) -> Pending:
    return Pending(
        webhook_id=webhook_id(event, endpoint),
        event_type="account.auth_status_changed",
        event_id=event,
        body=f'{{"e":"{event}"}}',
        occurred_at="2026-11-23T00:00:00.000Z",
        enqueued_at=at,
        next_attempt_at=at,
    )


def pair(endpoint: str, *events: str, workspace: str = "ws_a", at: float = NOW) -> DeliveryState:
    state = DeliveryState(endpoint_id=endpoint, account_id="acc_1", workspace_id=workspace)
    for event in events:
        state = enqueue(state, pending(event, endpoint, at=at))[0]
    return state


def old_form(workspace: str, **queues: tuple[str, ...]) -> AccountDeliveries:
    return AccountDeliveries(
        account_id="acc_1",
        workspace_id=workspace,
        endpoints={ep: pair(ep, *events, workspace=workspace) for ep, events in queues.items()},
    )


def test_both_forms_decode_and_anything_else_is_refused() -> None:
    state = pair("ep_1", "ev_1")
    assert decode_state(state.model_dump_json().encode()) == ("ep_1/acc_1", state)
    legacy = old_form("ws_a", ep_1=("ev_1",))
    assert decode_state(legacy.model_dump_json().encode()) == ("acc_1", legacy)
    for junk in (b"{}", b'{"type":"account_state"}', b"not json"):
        with pytest.raises(ValidationError):
            decode_state(junk)


def test_an_old_form_record_is_split_into_pairs_owned_by_each_endpoints_workspace() -> None:
    owners = {"ep_a1": "ws_a", "ep_b1": "ws_b"}
    store = DeliveryStore(workspace_of=owners.get)
    # the old form took its workspace from the account's first event: here ws_b's error event
    legacy = old_form("ws_b", ep_a1=("ev_1", "ev_2"), ep_b1=("ev_err",), ep_gone=("ev_3",))
    store.load(3, {"acc_1": legacy})
    a1 = store.pair(3, "ep_a1/acc_1")
    assert a1 is not None and a1.workspace_id == "ws_a", "the endpoint's own workspace"
    assert [p.event_id for p in a1.queue] == ["ev_1", "ev_2"]
    b1 = store.pair(3, "ep_b1/acc_1")
    assert b1 is not None and b1.workspace_id == "ws_b"
    gone = store.pair(3, "ep_gone/acc_1")
    assert gone is not None and gone.workspace_id == "ws_b", "unknown endpoint: label kept"
    assert store.legacy(3, "acc_1") == legacy and len(store) == 3
    due = {store.pop_due(NOW, retry_at=NOW + 1) for _ in range(5)} - {None}
    assert due == {("acc_1", 3), ("ep_a1/acc_1", 3), ("ep_b1/acc_1", 3), ("ep_gone/acc_1", 3)}
    store.forget_legacy(3, "acc_1")
    assert store.legacy(3, "acc_1") is None and len(store) == 3
    assert "acc_1" not in store.timers.live


def test_a_pair_record_written_since_wins_and_keeps_what_only_the_old_form_had() -> None:
    store = DeliveryStore()
    # the pair was migrated (ev_1 delivered since, ev_2 waiting) and then an old process
    # wrote the account record again with ev_1 and an event of its own, ev_9
    newer = enqueue(pair("ep_1", "ev_1", "ev_2"), pending("ev_x"))[0]
    newer = newer.model_copy(update={"queue": newer.queue[1:]})  # ev_1 delivered
    legacy = old_form("ws_a", ep_1=("ev_1", "ev_9"))
    store.load(0, {"ep_1/acc_1": newer, "acc_1": legacy})
    merged = store.pair(0, "ep_1/acc_1")
    assert merged is not None
    assert [p.event_id for p in merged.queue] == ["ev_2", "ev_x", "ev_9"]
    assert merged == merge(newer, legacy.endpoints["ep_1"])
    assert set(merged.seen) >= {pending("ev_9").webhook_id, pending("ev_1").webhook_id}


def test_a_deferred_pair_keeps_its_later_time_until_woken() -> None:
    store = DeliveryStore()
    key = state_key("ep_1", "acc_1")
    store.put(0, pair("ep_1", "ev_1"))
    assert store.timers.live[key][0] == NOW
    store.defer(0, key, NOW + 30)
    grown = enqueue(store.pair(0, key) or pair("ep_1"), pending("ev_2"))[0]
    store.put(0, grown)
    assert store.timers.live[key][0] == NOW + 30, "a new event does not bring it back early"
    assert store.wake(0, key, NOW + 5)
    assert store.timers.live[key][0] == NOW + 5
    store.undefer(key)  # an attempt ended: the next write follows the head again
    store.put(0, grown)
    assert store.timers.live[key][0] == NOW
    assert not store.wake(0, "ep_2/acc_1", NOW), "nothing held: nothing to wake"
    store.put(0, grown.model_copy(update={"queue": ()}))
    assert key not in store.timers.live
    assert not store.wake(0, key, NOW), "an empty queue has nothing to attempt"
    store.defer(1, key, NOW)  # another partition: ignored
    assert key not in store.timers.live


def test_dropping_a_partition_forgets_its_pairs_old_records_and_deferrals() -> None:
    store = DeliveryStore()
    store.load(0, {"ep_1/acc_1": pair("ep_1", "ev_1"), "acc_1": old_form("ws_a", ep_2=("e",))})
    store.defer(0, "ep_1/acc_1", NOW + 100)
    store.drop(0)
    assert len(store) == 0 and store.timers.live == {}
    store.put(0, pair("ep_1", "ev_1"))
    assert store.timers.live["ep_1/acc_1"][0] == NOW, "no deferral survives the drop"


def test_a_claimed_pair_is_armed_once_on_release_at_the_state_it_was_left_in() -> None:
    store = DeliveryStore()
    key = state_key("ep_1", "acc_1")
    state = pair("ep_1", "ev_1", "ev_2")
    store.put(0, state)
    store.claim(key)
    assert key not in store.timers.live, "its lane works on it: the sweep must not bring it"
    head = state.queue[0]
    retried = head.model_copy(update={"attempts": 1, "next_attempt_at": NOW + 5})
    store.put(0, state.model_copy(update={"queue": (retried, *state.queue[1:])}))
    assert key not in store.timers.live, "writes meanwhile arm nothing"
    assert store.pop_due(NOW + 10, retry_at=NOW + 11) is None
    store.release(0, key)
    assert store.timers.live[key][0] == NOW + 5, "the retry's own time"
    assert store.pop_due(NOW + 4.9, retry_at=NOW + 6) is None
    assert store.pop_due(NOW + 5, retry_at=NOW + 6) == (key, 0)


def test_a_deferral_or_wake_while_claimed_holds_at_release() -> None:
    store = DeliveryStore()
    key = state_key("ep_1", "acc_1")
    store.put(0, pair("ep_1", "ev_1"))
    store.claim(key)
    store.defer(0, key, NOW + 30)  # its endpoint had no room (or paused it)
    assert key not in store.timers.live
    store.release(0, key)
    assert store.timers.live[key][0] == NOW + 30, "the later of the head's time and the deferral"
    store.claim(key)
    assert store.wake(0, key, NOW + 2), "a claimed pair with a head can be woken"
    assert key not in store.timers.live
    store.release(0, key)
    assert store.timers.live[key][0] == NOW + 2


def test_a_claimed_pair_that_went_idle_or_was_dropped_is_not_armed() -> None:
    store = DeliveryStore()
    key = state_key("ep_1", "acc_1")
    state = pair("ep_1", "ev_1")
    store.put(0, state)
    store.claim(key)
    store.put(0, state.model_copy(update={"queue": ()}))  # delivered: idle, dropped
    store.release(0, key)
    assert key not in store.timers.live and not store.claimed(key)
    store.put(1, pair("ep_1", "ev_2"))
    store.claim(key)
    store.drop(1)  # revoked while its lane ran
    assert not store.claimed(key)
    store.release(1, key)
    assert key not in store.timers.live
