"""Micro-benchmark of the pure decision: what the flow itself costs per command, without Kafka.

``python -m bench.decision``: the cost of one ``passkey_confirm`` decision through the
shared machine (decide → intent; decide + settle → reply and event). The state record's
memory is ``bench.memory``'s. Reports numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from worker.auth.flow import Policy, decide, settle_confirm
from worker.auth.provider.base import ProviderAuthState
from worker.contract.messages import AccountRecord, PasskeyConfirm

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
                ProviderAuthState("passkey_confirmation_sent", "passkey_confirmation_sent"),
                now=now,
                policy=POLICY,
            )
        return (time.perf_counter() - t0) / n * 1e6

    return min(intent_round() for _ in range(repeat)), min(full_round() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--decisions", type=int, default=20_000, help="per round")
    parser.add_argument("--repeat", type=int, default=7, help="rounds; the best is reported")
    args = parser.parse_args()
    decide_us, full_us = decision_cost(args.decisions, args.repeat)
    print(
        f"decide (intent)            {decide_us:8.2f} µs/decision"
        f"  (best of {args.repeat} x {args.decisions})"
    )
    print(f"decide + settle (reply+ev) {full_us:8.2f} µs/decision")


if __name__ == "__main__":
    main()
