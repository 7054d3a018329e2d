"""Each optimisation the product keeps (``worker.engine.key_hash``,
``worker.contract.compact_ids``, ``worker.contract.shared_timestamps``), against its plain
equivalent, in one process.

``python -m bench.speedups``: µs per call of the remembered key hash against aiokafka's
``murmur2`` and of compacting + expanding an id, then the state store's bytes per account
(``bench.memory``'s records, decoded as a restore decodes them) as kept, with string ids,
and without shared timestamps. Reports numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import timeit
import tracemalloc
from collections.abc import Callable
from dataclasses import replace

from aiokafka.partitioner import murmur2
from pydantic import TypeAdapter

from bench.memory import record_values, sample_record
from worker.auth.store import StateStore
from worker.contract.compact_ids import compact_id, expand_id
from worker.contract.messages import AccountRecord, decode_record, encode_record
from worker.engine.key_hash import key_hash

_plain_decode = TypeAdapter(AccountRecord).validate_json  # no context: no shared timestamps


def _fresh(value: str) -> str:
    return (value + " ")[:-1]  # a new str object, as a decode makes


def _with_str_ids(value: bytes) -> AccountRecord:
    """What a record would hold with its outcome ids as plain strings."""
    record = decode_record(value)
    recent = tuple(
        replace(
            o,
            cid=None if o.cid is None else _fresh(expand_id(o.cid)),
            rid=None if o.rid is None else _fresh(expand_id(o.rid)),
        )
        for o in record.recent
    )
    return replace(record, recent=recent)


def per_call_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def bytes_per_account(
    decode: Callable[[bytes], AccountRecord], accounts: int, *, settled: bool
) -> float:
    template = encode_record(sample_record(1, settled=settled))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store = StateStore()
        for first in range(0, accounts, 20_000):
            for value in record_values(template, first, min(accounts, first + 20_000)):
                store.put(0, decode(value))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del store
    gc.collect()
    return held / accounts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100_000, help="per timing round")
    parser.add_argument("--repeat", type=int, default=7, help="rounds; the best is reported")
    parser.add_argument("--accounts", type=int, default=100_000, help="for bytes per account")
    args = parser.parse_args()
    n, r = args.calls, args.repeat
    key = b"acc-000000000001"
    command_id = "9b2f7c1e-4d3a-4e8b-9a51-000000000001"
    print(f"key hash      murmur2 {per_call_us(lambda: murmur2(key), n, r):6.3f} µs/call")
    print(f"              key_hash {per_call_us(lambda: key_hash(key), n, r):6.3f} µs/call")
    compacted = per_call_us(lambda: expand_id(compact_id(command_id)), n, r)
    print(f"compact ids   compact + expand {compacted:6.3f} µs/id")
    variants: dict[str, Callable[[bytes], AccountRecord]] = {
        "kept": decode_record,
        "str ids": _with_str_ids,
        "no shared timestamps": _plain_decode,
    }
    for kind, settled in (("in flow", False), ("settled", True)):
        for name, decode in variants.items():
            held = bytes_per_account(decode, args.accounts, settled=settled)
            print(f"{kind:8s} {name:22s} {held:8.1f} B/account ({args.accounts:,} accounts)")


if __name__ == "__main__":
    main()
