"""State store memory per account and restore rate of one partition (benchmark part 4).

Memory: account records are built the way a restore builds them (``decode_record`` of their
JSON, then ``StateStore.put``) under ``tracemalloc``; bytes per account = traced memory still
held afterwards / accounts (records, their strings and floats, the store's dicts and its
follow-up index). Records are built through the real flow functions:

* ``in-flow``: after a register and one confirm (``passkey_confirmation_sent``, follow-up
  timers running, so also in the follow-up index; two dedup outcomes);
* ``settled``: the same account after the provider reported ``authorized`` (no timers; the
  state most accounts of a long-running store are in);
* ``full window``: in-flow with the dedup window full (8 outcomes, the default window).

Restore: N such records (distinct accounts) are produced to partition 0 of a fresh auth.state
topic, then ``restore_partitions`` reads them back with the worker's own restore consumer.

``python -m bench.memory`` runs the memory part alone (``--help`` for the knobs), one JSON
line per measurement; ``python -m bench`` runs both as part of the whole benchmark.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import TopicPartition

from worker.auth.flow import Policy, decide, observe, settle_confirm
from worker.auth.provider.base import ProviderAuthState
from worker.auth.store import StateStore
from worker.contract.messages import (
    AccountRecord,
    PasskeyConfirm,
    RegisterAccount,
    decode_record,
    encode_record,
)
from worker.engine.kafka import build_consumer, build_producer
from worker.engine.store import restore_partitions
from worker.settings import Settings

TOKEN = "000000000000"  # 12 digits, replaced by the account number in every id of a record
SENT = ProviderAuthState("passkey_confirmation_sent", "passkey_confirmation_sent")


def sample_record(
    confirms: int = 1, *, settled: bool = False, dedup_window: int = 8
) -> AccountRecord:
    """The record of an account after registration and ``confirms`` confirm commands (the
    first one confirmed at the provider, later ones answered "already sent"), and with
    ``settled`` after the provider reported ``authorized``. Ids have the front-end's forms
    (a UUID command id, a ``req_`` + 32 hex digits request id) and contain ``TOKEN``."""
    policy = Policy(providers=frozenset({"simulator"}), dedup_window=dedup_window)
    now = time.time()
    account = f"acc-{TOKEN}"
    register = RegisterAccount(
        command_id=f"5d0c6a34-0b7e-4a0f-9a51-{TOKEN}",
        workspace_id="ws_bench",
        account_id=account,
        provider="simulator",
        provider_account_ref=f"ref-{TOKEN}",
        status="passkey_confirmation",
    )
    record = decide(None, register, now=now, policy=policy).record
    if record is None:
        raise RuntimeError("register must create the record")
    for n in range(confirms):
        cid = f"9b2f7c1e-4d3a-4e8b-{n:04d}-{TOKEN}"
        cmd = PasskeyConfirm(
            command_id=cid,
            request_id=f"req_{cid.replace('-', '')}",  # the front-end's form
            workspace_id="ws_bench",
            account_id=account,
            issued_at=datetime.fromtimestamp(now, UTC),
        )
        decision = decide(record, cmd, now=now, policy=policy)
        if decision.call is not None and decision.record is not None:
            decision = settle_confirm(decision.record, SENT, now=now, policy=policy)
        if decision.record is None:
            raise RuntimeError("a confirm must change the record")
        record = decision.record
    if settled:
        done = observe(record, "authorized", "authorized", command_id=None, now=now, policy=policy)
        if done.record is None:
            raise RuntimeError("authorized must change a confirmed record")
        record = done.record
    return record


def record_values(template: bytes, start: int, stop: int) -> list[bytes]:
    """The template's JSON with the token replaced by each account number."""
    token = TOKEN.encode()
    return [template.replace(token, b"%012d" % i) for i in range(start, stop)]


@dataclass(frozen=True, slots=True)
class MemoryResult:
    kind: str
    accounts: int
    confirms: int
    bytes_per_account: float
    json_bytes: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "record": self.kind,
            "accounts": self.accounts,
            "dedup_outcomes": self.confirms + 1,
            "bytes_per_account": round(self.bytes_per_account, 1),
            "record_json_bytes": self.json_bytes,
            "seconds": round(self.seconds, 2),
        }


def store_memory(
    accounts: int, *, confirms: int = 1, settled: bool = False, chunk: int = 20_000
) -> MemoryResult:
    """Bytes per account of a StateStore holding ``accounts`` restored records."""
    template = encode_record(sample_record(confirms, settled=settled))
    kind = "settled" if settled else ("in-flow" if confirms == 1 else "full window")
    gc.collect()
    started = time.perf_counter()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store = StateStore()
        for first in range(0, accounts, chunk):
            values = record_values(template, first, min(accounts, first + chunk))
            for value in values:
                record = decode_record(value)
                store.put(0, record)
            del values
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    seconds = time.perf_counter() - started
    if len(store) != accounts:
        raise RuntimeError(f"expected {accounts} distinct accounts, store has {len(store)}")
    del store
    gc.collect()
    return MemoryResult(kind, accounts, confirms, held / accounts, len(template), seconds)


@dataclass(frozen=True, slots=True)
class RestoreResult:
    records: int
    seconds: float
    produce_seconds: float
    accounts: int

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "accounts": self.accounts,
            "seconds": round(self.seconds, 3),
            "records_per_s": round(self.rate),
            "produce_seconds": round(self.produce_seconds, 3),
        }


async def restore_rate(settings: Settings, records: int) -> RestoreResult:
    """Produce ``records`` state records to partition 0 of ``settings.topics.state`` (which
    must exist), then time ``restore_partitions`` over that partition."""
    template = encode_record(sample_record(1))
    topic = settings.topics.state
    producer = build_producer(settings.kafka_config())
    await producer.start()
    started = time.perf_counter()
    try:
        for first in range(0, records, 5000):
            batch = record_values(template, first, min(records, first + 5000))
            futures = [
                await producer.send(topic, value, key=b"acc-%012d" % (first + i), partition=0)
                for i, value in enumerate(batch)
            ]
            for fut in futures:
                await fut
    finally:
        await producer.stop()
    produced = time.perf_counter() - started
    consumer = build_consumer(settings.kafka_config(), enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        restored = await restore_partitions(consumer, [tp], decode=StateStore.decode)
    finally:
        await consumer.stop()
    latest, stats = restored[0]
    return RestoreResult(stats.records, stats.seconds, produced, len(latest))


KINDS = {"in-flow": (1, False), "settled": (1, True), "full-window": (7, False)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--accounts", default="1000000", help="comma-separated store sizes (1000000)"
    )
    parser.add_argument(
        "--records",
        default="in-flow,settled,full-window",
        help=f"comma-separated record kinds, of {', '.join(KINDS)} (all)",
    )
    args = parser.parse_args()
    for n in (int(a) for a in args.accounts.split(",")):
        for kind in args.records.split(","):
            confirms, settled = KINDS[kind]
            result = store_memory(n, confirms=confirms, settled=settled)
            print(json.dumps(result.as_dict()), flush=True)


if __name__ == "__main__":
    main()
