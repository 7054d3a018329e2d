"""Cost of one follow-up timer sweep with many accounts in flow (bench/README.md, hot spot #8).

Usage::

    .venv/bin/python bench/timer_sweep.py --accounts 100000

Fills a ``StateStore`` with accounts in flow whose polls fall due over 200 s, then times the
worker's sweep (``StateStore.pop_due`` until nothing is due, one 250 ms interval's worth of due
timers) against the full scan of every account in flow that the sweep did before the timer
heap. Bounded by ``--accounts``; prints measured times only.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from worker.messages import AccountRecord, FollowUp
from worker.store import StateStore

INTERVAL_S = 0.25


def in_flow(account_id: str, poll_at: float) -> AccountRecord:
    return AccountRecord(
        account_id=account_id,
        workspace_id="ws_bench",
        status="passkey_confirmation_sent",
        auth_status="pending",
        version=2,
        updated_at=0.0,
        follow_up=FollowUp(deadline_at=poll_at + 300.0, next_poll_at=poll_at),
    )


def scan(store: StateStore, now: float, active: set[int]) -> int:
    """The sweep before the heap: look at every account in flow."""
    due = 0
    for account_id, timer in list(store.following.items()):
        partition = timer[2]
        if partition not in active:
            continue
        record = store.get(partition, account_id)
        fu = record.follow_up if record is not None else None
        if fu is not None and (fu.next_poll_at <= now or fu.deadline_at <= now):
            due += 1
    return due


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=12)
    args = parser.parse_args()
    store = StateStore()
    start = 1_000.0
    spread = 200.0
    for i in range(args.accounts):
        store.put(i % args.partitions, in_flow(f"acc-{i}", start + 1 + spread * i / args.accounts))
    active = set(range(args.partitions))

    best = min(_timed(lambda: scan(store, start + 0.5, active))[1] for _ in range(5))
    print(f"scan of {args.accounts:,} accounts in flow: {best * 1e3:.2f} ms per sweep")

    now = start + 1 + INTERVAL_S
    due, seconds = _timed(lambda: _drain(store, now))
    per = seconds / due * 1e6 if due else float("nan")
    print(f"heap: {seconds * 1e3:.3f} ms per sweep for {due} due timers ({per:.2f} us each)")
    _, idle = _timed(lambda: _drain(store, now))
    print(f"heap, nothing due: {idle * 1e6:.1f} us per sweep")


def _drain(store: StateStore, now: float) -> int:
    due = 0
    while store.pop_due(now, retry_at=now + INTERVAL_S) is not None:
        due += 1
    return due


def _timed(fn: Callable[[], int]) -> tuple[int, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


if __name__ == "__main__":
    main()
