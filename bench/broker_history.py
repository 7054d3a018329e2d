"""Does the embedded broker's cost per record grow with a partition's history?
(figures: bench/README.md, "The embedded broker slows with history").

On a fresh embedded broker, for each of ``--topics`` fresh topics in turn: ``--lanes`` lanes
produce keyed 300-byte records one acknowledged record at a time (small batches, as a
stack's outputs are), while one group-less consumer tails the topic (fetch wait 20 ms, as
the dev stack's worker; ``--no-tail``: none), ``--steps`` windows of ``--records`` records
each. Each window prints the broker's CPU (``/proc``) per record. The consumer never
commits: commits are not what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from bench.load import proc_cpu_s
from devstack.broker import EmbeddedBroker
from devstack.settings import EMBEDDED_FETCH_MAX_WAIT_MS, EMBEDDED_OFFSET_GAP_HOLD_S
from worker.engine.kafka import build_consumer, build_producer, create_topics
from worker.runtime import eventloop
from worker.settings import Settings


async def one_topic(
    settings: Settings,
    pid: int,
    topic: str,
    steps: int,
    records: int,
    lanes: int,
    tail_on: bool = True,
) -> list[dict[str, Any]]:
    producer = build_producer(settings.kafka_config())
    tail = build_consumer(settings.kafka_config(), topic)  # group-less, from the earliest offset
    await producer.start()
    await tail.start()

    async def drain() -> None:
        while tail_on:
            await tail.getmany(timeout_ms=100)

    draining = asyncio.create_task(drain())
    windows = []
    sent = 0
    try:
        for _ in range(steps):
            numbers = iter(range(sent, sent + records))

            async def lane(numbers: Iterator[int]) -> None:
                for n in numbers:
                    await (await producer.send(topic, b"v" * 300, key=b"acc_%d" % n))

            cpu, started = proc_cpu_s(pid), time.perf_counter()
            await asyncio.gather(*(lane(numbers) for _ in range(lanes)))
            wall = time.perf_counter() - started
            sent += records
            window = {
                "topic": topic,
                "tail": tail_on,
                "history": sent,
                "broker_us_per_record": (proc_cpu_s(pid) - cpu) / records * 1e6,
                "rate": records / wall,
            }
            windows.append(window)
            print(json.dumps(window), flush=True)
    finally:
        draining.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await draining
        await tail.stop()
        await producer.stop()
    return windows


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    windows: list[dict[str, Any]] = []
    with EmbeddedBroker() as broker:
        settings = Settings(
            kafka_bootstrap_servers=broker.bootstrap,
            kafka_fetch_max_wait_ms=EMBEDDED_FETCH_MAX_WAIT_MS,
            kafka_offset_gap_hold_s=EMBEDDED_OFFSET_GAP_HOLD_S,
        )
        names = [f"history-{i}" for i in range(args.topics)]
        await create_topics(
            settings.kafka_config(),
            dict.fromkeys(names, args.partitions),
            replication_factor=settings.kafka_replication_factor,
        )
        for name in names:
            windows += await one_topic(
                settings, broker.pid, name, args.steps, args.records, args.lanes, not args.no_tail
            )
    return windows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.broker_history", description=__doc__)
    parser.add_argument("--topics", type=int, default=2, help="fresh topics, one after another")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--steps", type=int, default=6, help="windows per topic")
    parser.add_argument("--records", type=int, default=3000, help="records per window")
    parser.add_argument("--lanes", type=int, default=20, help="produces in flight")
    parser.add_argument(
        "--no-tail", action="store_true", help="no tailing consumer: the produces' own cost"
    )
    args = parser.parse_args(argv)
    for w in eventloop.run(measure(args), "uvloop"):
        print(
            f"{w['topic']}: {w['history']:>7,} records in: broker "
            f"{w['broker_us_per_record']:,.0f} µs/record, {w['rate']:,.0f} records/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
