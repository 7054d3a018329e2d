"""Micro-benchmark of the pure decision and of the state record's memory (issue 2).

``python -m bench.decision``: the cost of one ``passkey_confirm`` decision through the
shared machine (decide + settle), and the bytes per account record for 100,000 records built
the way a restore builds them (decoded from their JSON). Reports numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from datetime import UTC, datetime

from worker.flow import Policy, decide, settle_confirm
from worker.messages import AccountRecord, PasskeyConfirm, decode_record, encode_record

POLICY = Policy(providers=frozenset({"simulator"}))


def _record(i: int, now: float) -> AccountRecord:
    return AccountRecord(
        account_id=f"acc_{i:08d}",
        workspace_id=f"ws_{i % 50:03d}",
        status="passkey_confirmation",
        auth_status="passkey_confirmation",
        version=2,
        updated_at=now,
        provider="simulator",
        provider_account_ref=f"ref-{i:08d}",
    )


def decision_cost(n: int, repeat: int = 7) -> tuple[float, float]:
    """µs per decision of (decide → intent) and of (decide + settle_confirm → reply and
    event): the best of ``repeat`` rounds of ``n`` decisions each, as ``timeit`` reports, so
    a noisy neighbour or a collection in one round does not decide the figure."""
    now = time.time()
    records = [_record(i, now) for i in range(1000)]
    cmds = [
        PasskeyConfirm(
            command_id=f"cmd-{i}",
            request_id=f"req-{i}",
            workspace_id=records[i % 1000].workspace_id,
            account_id=records[i % 1000].account_id,
            issued_at=datetime.fromtimestamp(now, UTC),
        )
        for i in range(n)
    ]

    def intent_round() -> float:
        t0 = time.perf_counter()
        for i, cmd in enumerate(cmds):
            decide(records[i % 1000], cmd, now=now, policy=POLICY)
        return (time.perf_counter() - t0) / n * 1e6

    def full_round() -> float:
        t0 = time.perf_counter()
        for i, cmd in enumerate(cmds):
            d = decide(records[i % 1000], cmd, now=now, policy=POLICY)
            assert d.record is not None
            settle_confirm(
                d.record,
                ("passkey_confirmation_sent", "passkey_confirmation_sent"),
                now=now,
                policy=POLICY,
            )
        return (time.perf_counter() - t0) / n * 1e6

    return min(intent_round() for _ in range(repeat)), min(full_round() for _ in range(repeat))


def record_bytes(n: int, *, with_outcome: bool) -> float:
    """Traced bytes per record for ``n`` records decoded from JSON, held in a dict."""
    now = time.time()
    blobs = []
    for i in range(n):
        rec = _record(i, now)
        if with_outcome:
            d = decide(
                rec,
                PasskeyConfirm(
                    command_id=f"0b8f4c1e-7d2a-4f51-9e3b-{i:012d}",
                    request_id=f"req_{i:032d}",
                    workspace_id=rec.workspace_id,
                    account_id=rec.account_id,
                    issued_at=datetime.fromtimestamp(now, UTC),
                ),
                now=now,
                policy=POLICY,
            )
            assert d.record is not None
            rec = (
                settle_confirm(
                    d.record,
                    ("passkey_confirmation_sent", "passkey_confirmation_sent"),
                    now=now,
                    policy=POLICY,
                ).record
                or rec
            )
        blobs.append(encode_record(rec))
    gc.collect()
    tracemalloc.start()
    store = {}
    for blob in blobs:
        record = decode_record(blob)
        store[record.account_id] = record
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return current / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--decisions", type=int, default=20_000, help="per round")
    parser.add_argument("--repeat", type=int, default=7, help="rounds; the best is reported")
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    decide_us, full_us = decision_cost(args.decisions, args.repeat)
    print(
        f"decide (intent)            {decide_us:8.2f} µs/decision"
        f"  (best of {args.repeat} x {args.decisions})"
    )
    print(f"decide + settle (reply+ev) {full_us:8.2f} µs/decision")
    bare = record_bytes(args.records, with_outcome=False)
    print(f"account record, no history {bare:8.0f} B/record  ({args.records} records)")
    one = record_bytes(args.records, with_outcome=True)
    print(f"account record, 1 outcome  {one:8.0f} B/record")


if __name__ == "__main__":
    main()
