"""The rule every replica applies to ``api.idempotency`` (``IdempotencyKeys._apply``), record by
record without a broker: the first claim of a key holds it, a later one loses until the holder
expired by the later record's own time; an answer wins over a claim (compaction may have
removed that answer's claim record); a new key is admitted by the one admission rule (a
workspace's share, the process's cap, a reserve for workspaces holding none), on counts every
replica shares because the view changes only in the topic's order; a key is kept in well under
1 KiB; the view is bounded and swept; a forged or undecodable record changes nothing."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import tracemalloc
import uuid
from dataclasses import dataclass
from typing import Any

from worker.api import idempotency
from worker.api.idempotency import (
    FULL,
    GIVEN_UP,
    MAX_STALE,
    Held,
    IdempotencyKeys,
    IdempotencyRecord,
    StoredAnswer,
    fingerprint,
)
from worker.runtime.admission import Share

PRINT = fingerprint("acc_1", b"")
KEY_HASH = "a" * 64


@dataclass
class Msg:
    key: bytes | None
    value: bytes | None


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes | None]] = []

    async def send_and_wait(self, topic: str, value: bytes | None, **kw: Any) -> None:
        self.sent.append((kw["key"], value))

    async def send(self, topic: str, value: bytes | None, **kw: Any) -> Any:
        self.sent.append((kw["key"], value))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def view(per_workspace: int = 10, now: float = 1000.0, keys_max: int = 1000) -> IdempotencyKeys:
    clock = [now]
    keys = IdempotencyKeys(
        None,
        "t",
        Producer(),
        replica_id="api_me",
        per_workspace=per_workspace,
        keys_max=keys_max,
        claim_ttl_s=10.0,
        ttl_s=100.0,
        clock=lambda: clock[0],
    )
    keys.clock = clock  # type: ignore[attr-defined]
    return keys


def record(
    claim: str,
    at: float,
    *,
    answered: bool = False,
    ws: str = "ws_a",
    key: str = KEY_HASH,
    body: str = '{"request_id":"r"}',
) -> IdempotencyRecord:
    return IdempotencyRecord(
        workspace_id=ws,
        key_sha256=key,
        claim_id=claim,
        replica_id="api_other",
        fingerprint=PRINT,
        at=at,
        answer=StoredAnswer(status=200, body=body) if answered else None,
    )


def feed(keys: IdempotencyKeys, *records: IdempotencyRecord) -> None:
    keys.handle([Msg(r.record_key, r.model_dump_json().encode()) for r in records])


def holder(keys: IdempotencyKeys, ws: str = "ws_a", key: str = KEY_HASH) -> str | None:
    held = keys._slots.get(ws, {}).get(bytes.fromhex(key))
    return None if held is None else held.claim_id


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()


def test_the_first_claim_holds_and_a_later_one_loses() -> None:
    keys = view()
    feed(keys, record("c1", 1000), record("c2", 1001), record("c1", 1000, answered=True))
    assert holder(keys) == "c1"
    feed(keys, record("c2", 1002, answered=True))  # a loser's answer never replaces one
    assert holder(keys) == "c1"


def test_an_abandoned_claim_or_an_expired_answer_gives_way_by_the_next_records_time() -> None:
    keys = view()
    feed(keys, record("c1", 1000), record("c2", 1005))
    assert holder(keys) == "c1"  # 5 s: still within the claim's time
    feed(keys, record("c3", 1011))
    assert holder(keys) == "c3"  # 11 s > 10 s: abandoned
    feed(keys, record("c3", 1011, answered=True), record("c4", 1100))
    assert holder(keys) == "c3"  # 89 s: the answer holds
    feed(keys, record("c5", 1112))
    assert holder(keys) == "c5"  # 101 s > 100 s: expired


def test_an_answer_wins_over_a_claim_whose_own_claim_record_was_compacted_away() -> None:
    keys = view()
    # After compaction the loser's claim (offset 11) comes first, then the winner's answer
    # (offset 12, its claim at 10 compacted away): every replica ends on the answer.
    feed(keys, record("loser", 1001), record("winner", 1000, answered=True))
    assert holder(keys) == "winner"


def test_a_workspace_holds_at_most_its_quota_others_their_own() -> None:
    keys = view(per_workspace=3)
    outcomes = [keys._apply(record(f"c{i}", 1000, key=f"{i:064x}")) for i in range(10)]
    assert sum(o is FULL for o in outcomes) == 7
    assert keys.held("ws_a") == 3
    feed(keys, record("b", 1000, ws="ws_b"))
    assert keys.held("ws_b") == 1


def test_tombstones_forged_and_undecodable_records() -> None:
    keys = view()
    one = record("c1", 1000)
    feed(keys, one)
    keys.handle([Msg(b"ws_a/" + KEY_HASH.encode() + b"/other", None)])  # not the holder's
    assert holder(keys) == "c1"
    forged = record("c2", 1000, ws="ws_b")
    keys.handle(
        [
            Msg(b"ws_a/x/c2", forged.model_dump_json().encode()),  # key and value disagree
            Msg(forged.record_key, b"{not json"),
            Msg(forged.record_key, b'{"type":"api_idempotency","schema_version":1}'),
            Msg(b"\xff", None),
        ]
    )
    assert keys.undecodable == 3 and keys.held("ws_b") == 0
    keys.handle([Msg(one.record_key, None)])
    assert holder(keys) is None and keys.held("ws_a") == 0


async def test_the_sweep_drops_expired_keys_and_tombstones_them_and_the_lost_claims() -> None:
    """The sweep writes the tombstones; the view drops the keys when it reads them back, in
    the topic's order, as every replica does (so their counts never part)."""
    keys = view()
    feed(keys, record("old", 1000, answered=True), record("lost", 1001))
    feed(keys, record("new", 1050, answered=True, key="b" * 64))
    keys.clock[0] = 1101  # type: ignore[attr-defined]
    await keys.sweep()
    tombstoned = {k for k, v in keys.producer.sent if v is None}
    assert tombstoned == {record("old", 0).record_key, record("lost", 0).record_key}
    assert keys.held("ws_a") == 2 and keys.in_use == 2  # still counted until read back
    assert keys.holder("ws_a", "never-sent") is None
    keys.handle([Msg(k, None) for k in sorted(tombstoned)])
    assert holder(keys) is None and holder(keys, key="b" * 64) == "new"
    assert keys.held("ws_a") == 1 and keys.in_use == 1


def test_the_stale_list_is_bounded() -> None:
    keys = view()
    feed(keys, record("holder", 1000))
    feed(keys, *(record(f"l{i}", 1000) for i in range(MAX_STALE + 50)))
    assert len(keys._stale) == MAX_STALE


def test_a_new_key_is_admitted_by_the_shared_rule_the_process_cap_included() -> None:
    """``Share.admits(held, in_use)`` with the workspace's keys and all keys: past the
    reserve only a workspace holding none gets a key, past the cap none; a key given back
    (its tombstone read) makes room again."""
    keys = view(per_workspace=4, keys_max=4)
    assert (keys.share.capacity, keys.share.per_owner, keys.share.reserve) == (4, 4, 1)
    outcomes = [keys._apply(record(f"a{i}", 1000, key=f"{i:064x}")) for i in range(4)]
    assert [o is FULL for o in outcomes] == [False, False, False, True]  # below its quota
    assert keys.held("ws_a") == 3 and not keys.admits("ws_a")
    assert keys._apply(record("b0", 1000, ws="ws_b")) is not FULL  # from the reserve
    assert keys._apply(record("b1", 1000, ws="ws_b", key="b" * 64)) is FULL  # the cap
    assert keys._apply(record("c0", 1000, ws="ws_c")) is FULL
    assert keys.in_use == 4
    keys.handle([Msg(record("a0", 0, key=f"{0:064x}").record_key, None)])
    assert keys.in_use == 3 and keys._apply(record("c0", 1000, ws="ws_c")) is not FULL
    # An answer is held whatever the counts: its claim was admitted where it was decided.
    keys._apply(record("d0", 1000, ws="ws_d", answered=True))
    assert keys.held("ws_d") == 1 and keys.in_use == 5
    assert Share.capped(100_000, 10_000).reserve == 25_000
    assert Share.capped(1, 10).per_owner == 1


def test_a_claim_given_up_stays_counted_so_every_replica_refuses_the_same_claims() -> None:
    """The replica whose request gave its claim up lets a retry claim again at once, but
    counts the claim until its tombstone is read, like the replica that only read it: a
    claim at the cap meanwhile is refused on both, and a replica reading it all back after a
    restart ends with the same keys."""
    mine, other = view(per_workspace=2, keys_max=2), view(per_workspace=2, keys_max=2)
    given_up = record("a1", 1000)
    feed(mine, given_up)
    feed(other, given_up)
    mine.forget(given_up)
    assert mine.in_use == other.in_use == 1
    assert mine._slots["ws_a"][bytes.fromhex(KEY_HASH)].status == GIVEN_UP
    assert mine.holder("ws_a", "any") is None and mine.given_up == 1
    log = [record("b1", 1001, ws="ws_b"), record("c1", 1002, ws="ws_c")]
    assert [mine._apply(r) is FULL for r in log] == [False, True]
    assert [other._apply(r) is FULL for r in log] == [False, True]
    tombstone = Msg(given_up.record_key, None)
    mine.handle([tombstone])
    other.handle([tombstone])
    restarted = view(per_workspace=2, keys_max=2)
    feed(restarted, given_up, *log)
    restarted.handle([tombstone])
    for replica in (mine, other, restarted):
        assert replica.in_use == 1 and replica.held("ws_b") == 1 and replica.held("ws_c") == 0
    assert mine.given_up == 0


def _answer(i: int) -> str:
    return json.dumps(
        {
            "request_id": f"req_{uuid.uuid4().hex}",
            "data": {
                "account_id": f"acc_{i:08d}",
                "status": "passkey_confirmation_sent",
                "auth_status": "passkey_confirmation_sent",
            },
        },
        separators=(",", ":"),
    )


def test_a_key_costs_well_under_1_kib_in_the_view() -> None:
    """Every replica holds every workspace's keys: a few thousand answered keys, read as at
    start, cost under 1 KiB each (the answers, deflated, byte for byte on replay)."""
    n = 3000
    keys = view(per_workspace=n, keys_max=n)
    answers = {i: _answer(i) for i in range(n)}
    msgs = []
    for i, body in answers.items():
        one = record(
            f"idm_{uuid.uuid4().hex}",
            1000,
            answered=True,
            ws=f"ws_{i % 50}",
            key=key_hash(f"k{i}"),
            body=body,
        )
        msgs.append(Msg(one.record_key, one.model_dump_json().encode()))
    gc.collect()
    tracemalloc.start(4)  # frames enough to see what the view had a library allocate
    try:
        for start in range(0, n, 500):
            keys.handle(msgs[start : start + 500])
        msgs.clear()
        gc.collect()
        ours = tracemalloc.Filter(True, idempotency.__file__, all_frames=True)
        traces = tracemalloc.take_snapshot().filter_traces([ours]).traces
        per_key = sum(trace.size for trace in traces) / n
    finally:
        tracemalloc.stop()
    assert keys.in_use == n
    assert per_key < 1024, per_key
    for i in (0, n // 2, n - 1):
        held = keys.holder(f"ws_{i % 50}", f"k{i}")
        assert held is not None and held.deflated
        assert held.answer_body() == answers[i].encode()


def test_an_answer_that_does_not_deflate_is_kept_as_is() -> None:
    noise = os.urandom(1500).hex()  # 3,000 characters deflate cannot shrink much
    for body in ('{"a":1}', json.dumps({"noise": noise}), json.dumps({"x": "y" * 3000})):
        held = Held.of(record("c", 1000, answered=True, body=body))
        assert held.answer_body() == body.encode()
        assert len(held.body) <= len(body)
    assert not Held.of(record("c", 1000, answered=True, body='{"a":1}')).deflated
