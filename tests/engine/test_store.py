"""The state store's follow-up timer queue: it finds exactly the accounts a full scan of the
records would find, in due order, and forgets settled, deregistered and dropped accounts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.auth.store import StateStore
from worker.contract.messages import AccountRecord, FollowUp


def record(
    account_id: str, *, poll: float | None, deadline: float = 1e9, deregistered: bool = False
) -> AccountRecord:
    """An account record; ``poll=None`` means no follow-up (settled or never confirmed)."""
    return AccountRecord(
        account_id=account_id,
        workspace_id="ws_a",
        status="passkey_confirmation_sent" if poll is not None else "authorized",
        auth_status="pending" if poll is not None else "authorized",
        version=1,
        updated_at=0.0,
        deregistered=deregistered,
        follow_up=FollowUp(deadline_at=deadline, next_poll_at=poll) if poll is not None else None,
    )


def drain(store: StateStore, now: float, retry_at: float) -> list[tuple[str, int]]:
    out = []
    while (due := store.pop_due(now, retry_at=retry_at)) is not None:
        out.append(due)
    return out


def test_due_accounts_come_out_in_due_order_and_only_when_due() -> None:
    store = StateStore()
    store.put(0, record("c", poll=30.0))
    store.put(1, record("a", poll=10.0))
    store.put(0, record("b", poll=20.0))
    store.put(1, record("d", poll=500.0, deadline=15.0))  # the deadline comes first
    assert drain(store, 5.0, retry_at=100.0) == []
    assert drain(store, 25.0, retry_at=100.0) == [("a", 1), ("d", 1), ("b", 0)]
    assert drain(store, 30.0, retry_at=100.0) == [("c", 0)]


def test_a_popped_timer_comes_back_at_retry_at_unless_the_record_moves_on() -> None:
    store = StateStore()
    store.put(0, record("a", poll=10.0))
    store.put(0, record("b", poll=10.0))
    assert drain(store, 10.0, retry_at=11.0) == [("a", 0), ("b", 0)]
    assert drain(store, 10.5, retry_at=12.0) == []
    store.put(0, record("b", poll=50.0))  # b's follow-up step stored a new record
    assert drain(store, 11.0, retry_at=12.0) == [("a", 0)]  # a's step changed nothing
    assert drain(store, 49.0, retry_at=60.0) == [("a", 0)]
    assert ("b", 0) in drain(store, 50.0, retry_at=70.0)


def test_settled_deregistered_and_dropped_accounts_never_come_out() -> None:
    store = StateStore()
    store.put(0, record("settles", poll=10.0))
    store.put(0, record("deregistered", poll=10.0))
    store.put(1, record("dropped", poll=10.0))
    store.put(0, record("stays", poll=10.0))
    store.put(0, record("settles", poll=None))
    store.put(0, record("deregistered", poll=10.0, deregistered=True))
    store.drop(1)
    assert drain(store, 100.0, retry_at=200.0) == [("stays", 0)]
    assert set(store.following) == {"stays"}


def test_a_restored_partition_replaces_the_timers_of_the_old_one() -> None:
    store = StateStore()
    store.put(0, record("old", poll=10.0))
    store.load(0, {"new": record("new", poll=20.0)})
    assert drain(store, 100.0, retry_at=200.0) == [("new", 0)]


def test_dropping_many_partitions_compacts_the_queue() -> None:
    store = StateStore()
    for i in range(5000):
        store.put(i % 4, record(f"acc-{i}", poll=float(i)))
    for partition in (1, 2, 3):
        store.drop(partition)
    assert len(store.following) == 1250
    assert len(store._timers) <= 2 * 1250 + 1024
    assert [a for a, _ in drain(store, 1e6, retry_at=2e6)] == [
        f"acc-{i}" for i in range(0, 5000, 4)
    ]


ACCOUNTS = [f"acc-{i}" for i in range(6)]
operation = st.one_of(
    st.tuples(
        st.just("put"),
        st.sampled_from(ACCOUNTS),
        st.sampled_from([0, 1]),
        st.one_of(st.none(), st.integers(0, 40).map(float)),
        st.booleans(),
    ),
    st.tuples(st.just("drop"), st.sampled_from([0, 1])),
    st.tuples(st.just("sweep"), st.integers(0, 40).map(float), st.integers(1, 10).map(float)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=60))
def test_the_queue_agrees_with_a_scan_of_the_records(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    """Model: each account in flow is due at min(poll, deadline) or, once handed out and not
    stored again, at the retry time; a sweep hands out exactly the due ones of a full scan."""
    store = StateStore()
    model: dict[str, tuple[int, float]] = {}  # account -> (partition, due)
    home: dict[str, int] = {}  # account -> the partition of its record
    for op in ops:
        if op[0] == "put":
            _, account, partition, poll, deregistered = op
            if home.setdefault(account, partition) != partition:
                continue  # an account's key maps it to one partition
            store.put(partition, record(account, poll=poll, deregistered=deregistered))
            if poll is None or deregistered:
                model.pop(account, None)
            else:
                model[account] = (partition, poll)
        elif op[0] == "drop":
            store.drop(op[1])
            model = {a: v for a, v in model.items() if v[0] != op[1]}
            home = {a: p for a, p in home.items() if p != op[1]}
        else:
            _, now, wait = op
            expected = sorted(
                ((due, a, p) for a, (p, due) in model.items() if due <= now),
            )
            got = drain(store, now, retry_at=now + wait)
            assert sorted(got) == sorted((a, p) for _, a, p in expected)
            dues = [model[a][1] for a, _ in got]
            assert dues == sorted(dues), "handed out in due order"
            for a, p in got:
                model[a] = (p, now + wait)
        assert set(store.following) == set(model)


def test_what_lies_below_a_partitions_end_at_assignment_is_inherited() -> None:
    store = StateStore()
    assert store.tracks_handover
    assert store.inherited("cmds", 0, 0)  # not known: the careful answer
    store.handed_over("cmds", 0, 5)
    store.handed_over("cmds", 1, 2)
    assert [store.inherited("cmds", 0, o) for o in (0, 4, 5, 6)] == [True, True, False, False]
    assert not store.inherited("cmds", 1, 2) and store.inherited("other", 0, 6)
    store.drop(0)
    assert store.inherited("cmds", 0, 6) and not store.inherited("cmds", 1, 2)
