"""``python -m bench.broker_fetch``: what one fetch costs the embedded broker, and how often a
tailing consumer fetches (figures: bench/README.md, "What a fetch costs the embedded broker").

1. **Per fetch.** Topic ``fetch-a`` holds one batch a partition; ``--history`` single-record
   batches are then spread over the ``--partitions`` partitions of ``fetch-b``. Before and after,
   the broker's CPU (``/proc``) per data-bearing fetch (the partition's last record, read again
   by seeking back, ``--fetches`` times) is measured on the first, middle and last partition of
   ``fetch-b`` and on the first of ``fetch-a``: whether the cost follows the partition, its
   place in the topic, the topic or the whole store.
2. **Per wait.** One group-less consumer tails every partition of ``fetch-b`` while ``--rate``
   records a second are produced over them, ``--window-s`` for each of ``--waits`` (the
   consumer's ``fetch_max_wait_ms``): the fetch requests it sent a second, counted at the
   client, and the broker's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.conn import AIOKafkaConnection

from bench.load import proc_cpu_s
from devstack.broker import EmbeddedBroker
from worker.engine.kafka import KafkaConfig, build_consumer, build_producer, create_topics
from worker.runtime import eventloop
from worker.settings import Settings

SMALL, BIG = "fetch-a", "fetch-b"
REQUESTS: Counter[str] = Counter()


def count_requests() -> None:
    """Count every request this process's Kafka clients send, by type (the bench's own
    process only: a wrapper of the connection's ``send``)."""
    send = AIOKafkaConnection.send

    def counted(self: AIOKafkaConnection, request: Any, *args: Any, **kwargs: Any) -> Any:
        REQUESTS[type(request).__name__] += 1
        return send(self, request, *args, **kwargs)

    AIOKafkaConnection.send = counted


async def fill(producer: AIOKafkaProducer, topic: str, count: int, partitions: int) -> None:
    """``count`` acknowledged single-record batches over the partitions, 32 in flight."""
    numbers = iter(range(count))

    async def lane() -> None:
        for n in numbers:
            await (await producer.send(topic, b"v" * 300, partition=n % partitions))

    await asyncio.gather(*(lane() for _ in range(32)))


async def per_fetch_ms(
    pid: int, consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int, fetches: int
) -> float:
    """The broker's CPU per fetch that returns the record at ``offset`` of ``tp``."""
    cpu = proc_cpu_s(pid)
    for _ in range(fetches):
        consumer.seek(tp, offset)
        await consumer.getmany(tp, timeout_ms=2000)
    return (proc_cpu_s(pid) - cpu) / fetches * 1e3


async def fetch_costs(
    kafka: KafkaConfig, pid: int, partitions: int, history: int, fetches: int
) -> dict[str, float]:
    consumer = build_consumer(kafka, fetch_max_wait_ms=10)
    places = sorted({0, partitions // 2, partitions - 1})
    tps = [TopicPartition(SMALL, 0), *(TopicPartition(BIG, p) for p in places)]
    consumer.assign(tps)
    await consumer.start()
    try:
        last = history // partitions - 1
        costs = {f"{SMALL}[0]": await per_fetch_ms(pid, consumer, tps[0], 0, fetches)}
        for tp in tps[1:]:
            costs[f"{BIG}[{tp.partition}]"] = await per_fetch_ms(pid, consumer, tp, last, fetches)
        return costs
    finally:
        await consumer.stop()


async def tail_window(
    kafka: KafkaConfig,
    pid: int,
    producer: AIOKafkaProducer,
    partitions: int,
    rate: float,
    wait_ms: int,
    window_s: float,
) -> dict[str, Any]:
    stop = asyncio.Event()

    async def produce() -> None:
        n, start = 0, time.monotonic()
        while not stop.is_set():
            pause = start + n / rate - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            await producer.send(BIG, b"v" * 300, partition=n % partitions)
            n += 1

    consumer = build_consumer(kafka, fetch_max_wait_ms=wait_ms)
    tps = [TopicPartition(BIG, p) for p in range(partitions)]
    consumer.assign(tps)
    await consumer.start()
    await consumer.seek_to_end(*tps)
    producing = asyncio.create_task(produce())
    try:
        await asyncio.sleep(2)
        REQUESTS.clear()
        cpu, start, records = proc_cpu_s(pid), time.monotonic(), 0
        while time.monotonic() - start < window_s:
            batch = await consumer.getmany(timeout_ms=100)
            records += sum(map(len, batch.values()))
        elapsed = time.monotonic() - start
        return {
            "wait_ms": wait_ms,
            "fetches_per_s": round(REQUESTS["FetchRequest"] / elapsed, 1),
            "broker_cores": round((proc_cpu_s(pid) - cpu) / elapsed, 3),
            "records_per_s": round(records / elapsed),
        }
    finally:
        stop.set()
        await producing
        await consumer.stop()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    count_requests()
    result: dict[str, Any] = {"history": args.history, "partitions": args.partitions}
    with EmbeddedBroker() as broker:
        kafka = Settings(kafka_bootstrap_servers=broker.bootstrap).kafka_config()
        await create_topics(
            kafka, {SMALL: args.partitions, BIG: args.partitions}, replication_factor=1
        )
        producer = build_producer(kafka)
        await producer.start()
        try:
            await fill(producer, SMALL, args.partitions, args.partitions)
            await fill(producer, BIG, args.partitions, args.partitions)
            result["ms_per_fetch_before"] = await fetch_costs(
                kafka, broker.pid, args.partitions, args.partitions, args.fetches
            )
            await fill(producer, BIG, args.history - args.partitions, args.partitions)
            result["ms_per_fetch_after"] = await fetch_costs(
                kafka, broker.pid, args.partitions, args.history, args.fetches
            )
            result["tails"] = [
                await tail_window(
                    kafka, broker.pid, producer, args.partitions, args.rate, w, args.window_s
                )
                for w in args.waits
            ]
        finally:
            await producer.stop()
    return result


def report(result: dict[str, Any]) -> str:
    lines = [
        f"broker CPU per data-bearing fetch (ms), {BIG} holding {result['partitions']} batches "
        f"-> {result['history']:,} over {result['partitions']} partitions:"
    ]
    for place, before in result["ms_per_fetch_before"].items():
        lines.append(f"  {place}: {before:.3f} -> {result['ms_per_fetch_after'][place]:.3f}")
    lines.append(f"a tail of every partition of {BIG}:")
    for t in result["tails"]:
        lines.append(
            f"  wait {t['wait_ms']} ms: {t['fetches_per_s']} fetches/s, broker "
            f"{t['broker_cores']} cores, {t['records_per_s']} records/s read"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.broker_fetch", description=__doc__)
    parser.add_argument("--partitions", type=int, default=48)
    parser.add_argument("--history", type=int, default=150_000, help="batches in fetch-b")
    parser.add_argument("--fetches", type=int, default=300, help="fetches per place")
    parser.add_argument("--rate", type=float, default=150, help="records/s while tailing")
    parser.add_argument(
        "--waits", type=lambda s: [int(w) for w in s.split(",") if w], default=[1000, 10_000]
    )
    parser.add_argument("--window-s", type=float, default=20)
    args = parser.parse_args(argv)
    result = eventloop.run(measure(args), "uvloop")
    print(json.dumps(result), flush=True)
    print(report(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
