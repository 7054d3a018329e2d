"""The rule every replica applies to ``api.idempotency`` (``IdempotencyKeys._apply``), record by
record without a broker: the first claim of a key holds it, a later one loses until the holder
expired by the later record's own time; an answer wins over a claim (compaction may have
removed that answer's claim record); a workspace holds at most its quota; the view is bounded
and swept; a forged or undecodable record changes nothing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from worker.api.idempotency import (
    FULL,
    MAX_STALE,
    IdempotencyKeys,
    IdempotencyRecord,
    StoredAnswer,
    fingerprint,
)

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


def view(per_workspace: int = 10, now: float = 1000.0) -> IdempotencyKeys:
    clock = [now]
    keys = IdempotencyKeys(
        None,
        "t",
        Producer(),
        replica_id="api_me",
        per_workspace=per_workspace,
        claim_ttl_s=10.0,
        ttl_s=100.0,
        clock=lambda: clock[0],
    )
    keys.clock = clock  # type: ignore[attr-defined]
    return keys


def record(
    claim: str, at: float, *, answered: bool = False, ws: str = "ws_a", key: str = KEY_HASH
) -> IdempotencyRecord:
    return IdempotencyRecord(
        workspace_id=ws,
        key_sha256=key,
        claim_id=claim,
        replica_id="api_other",
        fingerprint=PRINT,
        at=at,
        answer=StoredAnswer(status=200, body='{"request_id":"r"}') if answered else None,
    )


def feed(keys: IdempotencyKeys, *records: IdempotencyRecord) -> None:
    keys.handle([Msg(r.record_key, r.model_dump_json().encode()) for r in records])


def holder(keys: IdempotencyKeys, ws: str = "ws_a", key: str = KEY_HASH) -> str | None:
    held = keys._slots.get((ws, key))
    return None if held is None else held.claim_id


def test_the_first_claim_holds_and_a_later_one_loses() -> None:
    keys = view()
    feed(keys, record("c1", 1000), record("c2", 1001), record("c1", 1000, answered=True))
    assert holder(keys) == "c1"
    feed(keys, record("c2", 1002, answered=True))  # a loser's answer never replaces one
    assert keys._slots[("ws_a", KEY_HASH)].claim_id == "c1"


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
    keys = view()
    feed(keys, record("old", 1000, answered=True), record("lost", 1001))
    feed(keys, record("new", 1050, answered=True, key="b" * 64))
    keys.clock[0] = 1101  # type: ignore[attr-defined]
    await keys.sweep()
    assert holder(keys) is None and holder(keys, key="b" * 64) == "new"
    tombstoned = {k for k, v in keys._producer.sent if v is None}
    assert tombstoned == {record("old", 0).record_key, record("lost", 0).record_key}


def test_the_stale_list_is_bounded() -> None:
    keys = view()
    feed(keys, record("holder", 1000))
    feed(keys, *(record(f"l{i}", 1000) for i in range(MAX_STALE + 50)))
    assert len(keys._stale) == MAX_STALE
