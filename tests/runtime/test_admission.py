"""The one admission rule (``worker.runtime.admission``): shares, the reserve kept for owners
that hold none, time charged to the owner, immediate refusals with a ``Retry-After``, and the
owners it remembers bounded."""

from __future__ import annotations

import pytest

from worker.runtime.admission import Admission, NoRoom, Share, TimeCharge


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_owner_holds_at_most_its_share_and_the_rest_stay_served() -> None:
    pool = Admission("conns", Share(capacity=8, per_owner=3, reserve=2))
    held = [pool.take("ws_a") for _ in range(3)]
    with pytest.raises(NoRoom) as refused:
        pool.take("ws_a")
    assert refused.value.reason == "share" and refused.value.retry_after_s >= 1
    held += [pool.take("ws_b") for _ in range(3)]
    # Six of eight in use: ws_c holds none, so it takes its first slot from the reserve...
    held.append(pool.take("ws_c"))
    # ...but not a second one: that would leave fewer than the reserve for newcomers.
    with pytest.raises(NoRoom):
        pool.take("ws_c")
    held.append(pool.take("ws_d"))
    with pytest.raises(NoRoom) as full:
        pool.take("ws_e")
    assert full.value.reason == "full"
    for slot in held:
        slot.release()
    assert pool.in_use == 0 and pool.owners == 0


def test_owners_at_their_share_leave_a_quarter_to_everyone_else() -> None:
    share = Share.split(256, owners=4)
    pool = Admission("conns", share)
    hogs = [pool.take(f"ws_{i}") for i in range(4) for _ in range(share.per_owner)]
    assert all(pool.held(f"ws_{i}") == share.per_owner for i in range(4))
    newcomers = [pool.take(f"new_{i}") for i in range(share.capacity - len(hogs))]
    assert len(newcomers) >= 64
    for slot in hogs + newcomers:
        slot.release()


def test_a_slot_released_twice_is_given_back_once() -> None:
    pool = Admission("reads", Share(capacity=2, per_owner=1))
    slot = pool.take("ws_a")
    slot.release()
    slot.release()
    assert pool.in_use == 0
    with pool.take("ws_a"), pool.take("ws_b"):
        assert pool.in_use == 2
    assert pool.in_use == 0


def test_time_held_is_charged_to_the_owner_who_held_it() -> None:
    clock = Clock()
    pool = Admission(
        "reads",
        Share(capacity=4, per_owner=1),
        time=TimeCharge(rate=0.25, burst_s=10.0),
        clock=clock,
    )
    # Four workspaces loop on 5 s reads: each has 10 s saved, then runs into debt.
    for _ in range(3):
        slots = [pool.take(f"ws_{i}") for i in range(4)]
        clock.now += 5.0
        for slot in slots:
            slot.release()
    with pytest.raises(NoRoom) as refused:
        pool.take("ws_0")
    assert refused.value.reason == "time"
    # 5 s of debt, less the 3.75 s already repaid, at 0.25 a second: 5 s to wait... or so.
    assert 1 <= refused.value.retry_after_s <= 20
    # The loopers are out; a fifth workspace finds every slot free.
    assert pool.take("ws_new").owner == "ws_new"
    clock.now += 60.0
    assert pool.take("ws_0").owner == "ws_0"


def test_the_owners_remembered_are_bounded_and_debts_are_forgotten_oldest_first() -> None:
    clock = Clock()
    pool = Admission(
        "scans",
        Share(capacity=4, per_owner=1),
        time=TimeCharge(rate=0.01, burst_s=1.0),
        max_owners=100,
        clock=clock,
    )
    for i in range(1000):
        slot = pool.take(f"ws_{i}")
        clock.now += 2.0
        slot.release()
    assert pool.owners <= 100
    held = pool.take("ws_1000")
    assert pool.owners <= 100
    held.release()


@pytest.mark.parametrize(
    ("capacity", "per_owner", "reserve"), [(0, 1, 0), (4, 0, 0), (4, 5, 0), (4, 1, 4), (4, 1, -1)]
)
def test_impossible_shares_are_refused_at_start_up(
    capacity: int, per_owner: int, reserve: int
) -> None:
    with pytest.raises(ValueError, match="must be"):
        Share(capacity=capacity, per_owner=per_owner, reserve=reserve)


@pytest.mark.parametrize(
    ("capacity", "per_owner", "expected"),
    [
        (16, 2, (2, 4)),
        (100_000, 10_000, (10_000, 25_000)),
        (4, 4, (4, 1)),
        (2, 5, (2, 1)),
        (1, 10, (1, 0)),
    ],
)
def test_a_capped_share_keeps_a_quarter_for_owners_holding_none(
    capacity: int, per_owner: int, expected: tuple[int, int]
) -> None:
    share = Share.capped(capacity, per_owner)
    assert (share.per_owner, share.reserve) == expected
    assert Share.split(capacity, owners=4).reserve == share.reserve


def test_an_owners_room_is_what_admits_grants_one_after_another() -> None:
    """``Share.room``: the slots one owner may still take, counted as ``admits`` grants them in
    turn (the first of an owner holding none may be the reserve's), for every small case."""
    for capacity, per_owner, reserve in ((1, 1, 0), (4, 2, 1), (10, 3, 2), (40, 15, 10)):
        share = Share(capacity=capacity, per_owner=per_owner, reserve=reserve)
        for in_use in range(capacity + 1):
            for held in range(min(in_use, per_owner + 1) + 1):
                granted = 0
                while share.admits(held + granted, in_use + granted):
                    granted += 1
                assert share.room(held, in_use) == granted, (share, held, in_use)
