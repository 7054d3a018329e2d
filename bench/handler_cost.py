"""CPU per confirm of the floor's and the batched contender's handlers, in one process, with
Kafka and the provider answered in process (``python -m bench.handler_cost``).

``python -m bench`` measures the contenders end to end on a shared machine, where single
figures move by ±20 %. This takes the I/O out: the same synthetic fetched batches of
registrations, then of first confirms, go through ``WorkerFloor.handle`` and
``BatchedWorker.handle`` with a producer that acknowledges at once and an HTTP client that
answers 200 at once (the batched contender's provider adapter keeps its retry loop, breaker,
deadline and gate around it). What is left is each handler's own Python work per confirm,
so the difference is what the worker's decision, adapter and records cost above the floor's
(bench/README.md, "The worker's decisions in the floor's shape"). Rounds alternate between
the two and the best round of each is reported, as ``timeit`` does. Reports numbers; asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from bench.batched import BatchedWorker
from bench.floor import WorkerFloor
from bench.load import Workload
from worker.auth.provider.answer import ProviderAnswer
from worker.settings import Settings

Batch = dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]
PARTITIONS = 12
ANSWER = b'{"status":"active","auth_status":"active"}'


class Producer:
    """Acknowledges every record at once; counts the replies' HTTP statuses."""

    def __init__(self, replies_topic: str) -> None:
        self.replies_topic = replies_topic
        self.statuses: Counter[int] = Counter()
        self.records = 0

    async def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Any = None,
    ) -> asyncio.Future[None]:
        self.records += 1
        if topic == self.replies_topic:
            self.statuses[json.loads(value)["http_status"]] += 1
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class Provider:
    """Answers every request 200 with an active flow, after one loop turn; counts them."""

    is_closed = False

    def __init__(self) -> None:
        self.calls = 0

    async def request(
        self, method: str, url: str, *, headers: Mapping[str, str] | None = None
    ) -> ProviderAnswer:
        self.calls += 1
        await asyncio.sleep(0)
        return ProviderAnswer(200, ANSWER, {})


def batches(workload: Workload, size: int) -> tuple[list[Batch], list[Batch]]:
    """The workload's registrations and first confirms as fetched batches of ``size``."""
    now = time.time()
    registrations = [(key, value) for key, value, _ in workload.register_commands()]
    confirms = [workload.confirm(i, now)[1:3] for i in range(workload.registered)]
    return _chunks(registrations, size), _chunks(confirms, size)


def _chunks(commands: list[tuple[bytes, bytes]], size: int) -> list[Batch]:
    out: list[Batch] = []
    for start in range(0, len(commands), size):
        batch: Batch = {}
        for offset, (key, value) in enumerate(commands[start : start + size], start):
            tp = TopicPartition("commands", offset % PARTITIONS)
            batch.setdefault(tp, []).append(
                ConsumerRecord(
                    tp.topic, tp.partition, offset, 0, 0, key, value, None, len(key),
                    len(value), [],
                )
            )  # fmt: skip
        out.append(batch)
    return out


async def one_round(kind: str, n: int, size: int, tag: str) -> dict[str, Any]:
    """µs of CPU per first confirm through ``kind``'s handler (registrations not counted)."""
    settings = Settings(provider_urls={"simulator": "http://127.0.0.1:9"})
    registrations, confirms = batches(Workload(tag, commands=n, accounts=n, mix="fresh"), size)
    producer = Producer(settings.topics.replies)
    provider = Provider()
    contender: WorkerFloor | BatchedWorker
    if kind == "floor":
        contender = WorkerFloor(settings)
        contender.http = provider  # type: ignore[assignment]
    else:
        contender = BatchedWorker(settings)
        for adapter in contender.providers.values():
            adapter._client = provider  # type: ignore[attr-defined]
    unused = contender.producer, contender.consumer  # built, never started: closed below
    contender.producer = producer
    for batch in registrations:
        await contender.handle(batch)
    producer.statuses.clear()
    started = time.process_time()
    for batch in confirms:
        await contender.handle(batch)
    cpu = time.process_time() - started
    for client in unused:
        await client.stop()
    return {
        "us_per_confirm": cpu / n * 1e6,
        "provider_calls": provider.calls,
        "replies": dict(producer.statuses),
    }


async def measure(n: int, size: int, rounds: int) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for r in range(rounds):
        for kind in ("floor", "batched"):
            got = await one_round(kind, n, size, f"h{r}{kind[0]}")
            if kind not in best or got["us_per_confirm"] < best[kind]["us_per_confirm"]:
                best[kind] = got
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--confirms", type=int, default=4000, help="first confirms per round")
    p.add_argument("--batch", type=int, default=100, help="records per fetched batch")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each; the best is kept")
    a = p.parse_args(argv)
    best = asyncio.run(measure(a.confirms, a.batch, a.rounds))
    for kind, got in best.items():
        print(
            f"{kind:8} {got['us_per_confirm']:8.1f} µs/confirm  provider calls "
            f"{got['provider_calls']}  replies {got['replies']}"
        )
    ratio = best["batched"]["us_per_confirm"] / best["floor"]["us_per_confirm"]
    print(f"batched ÷ floor {ratio:.2f} (best of {a.rounds} rounds of {a.confirms:,} each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
