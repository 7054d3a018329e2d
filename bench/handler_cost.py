"""CPU per confirm of three handlers, in one process, with Kafka and the provider answered in
process (``python -m bench.handler_cost``): the floor's, the batched contender's, and the
worker's own ``Executor``.

``python -m bench`` measures the contenders end to end on a shared machine, where single
figures move by ±20 %. This takes the I/O out: the same synthetic fetched batches of
registrations, then of first confirms, go through ``WorkerFloor.handle``,
``BatchedWorker.handle`` and, for ``executor``, each partition's records of a batch through
the worker's ``Executor.handle_batch`` as one unit of work, as the consume loop hands them
over (a record it lets go then through ``Executor.handle``, as its lane would), but without
the loop: no lanes, pressure or watermarks. The producer acknowledges in the
next loop turn; the HTTP client answers 200 after one loop turn (the provider adapters keep
their retry loop, breaker, deadline and gate around it). What is left is each handler's own
Python work per confirm: batched - floor is what the worker's decision, adapter and records
cost above the floor's; executor - batched what its own handling adds (instrumentation,
tracing, the unit's rounds of publication and ack waits, the store); bench/README.md,
"The worker's decisions in the floor's shape". Rounds alternate and the best round of each
is reported, as ``timeit`` does. Reports numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from collections import Counter
from collections.abc import Awaitable, Mapping
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from bench.batched import BatchedWorker
from bench.floor import WorkerFloor
from bench.floor_loop import Batch
from bench.load import Workload
from worker.auth.app import policy_from
from worker.auth.execute import Executor
from worker.auth.metrics import WorkerMetrics
from worker.auth.provider import build_registry
from worker.auth.provider.answer import ProviderAnswer
from worker.auth.publish import Publisher
from worker.auth.store import StateStore
from worker.engine.home_partition import Router, home_partition
from worker.runtime import logs
from worker.runtime.process import tune_gc
from worker.settings import Settings

PARTITIONS = 12
KINDS = ("floor", "batched", "executor")
ANSWER = b'{"status":"active","auth_status":"active"}'


class Producer:
    """Acknowledges every record in the next loop turn; keeps the replies, read after the
    timed phase (``statuses``) so that checking them is no handler's cost."""

    def __init__(self, replies_topic: str) -> None:
        self.replies_topic = replies_topic
        self.replies: list[bytes] = []

    def statuses(self) -> dict[int, int]:
        return dict(Counter(json.loads(value)["http_status"] for value in self.replies))

    async def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Any = None,
    ) -> asyncio.Future[None]:
        if topic == self.replies_topic:
            self.replies.append(value)
        loop = asyncio.get_running_loop()
        acked = loop.create_future()
        loop.call_soon(acked.set_result, None)  # as an ack would: after the sender awaits it
        return acked


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


def batches(workload: Workload, size: int, topic: str) -> tuple[list[Batch], list[Batch]]:
    """The workload's registrations and first confirms as fetched batches of ``size`` of
    ``topic``, each record on its key's home partition."""
    now = time.time()
    registrations = [(key, value) for key, value, _ in workload.register_commands()]
    confirms = [workload.confirm(i, now)[1:3] for i in range(workload.registered)]
    return _chunks(registrations, size, topic), _chunks(confirms, size, topic)


def _chunks(commands: list[tuple[bytes, bytes]], size: int, topic: str) -> list[Batch]:
    out: list[Batch] = []
    stamp = int(time.time() * 1000)
    for start in range(0, len(commands), size):
        batch: Batch = {}
        for offset, (key, value) in enumerate(commands[start : start + size], start):
            tp = TopicPartition(topic, home_partition(key, PARTITIONS))
            batch.setdefault(tp, []).append(
                ConsumerRecord(
                    tp.topic, tp.partition, offset, stamp, 0, key, value,
                    None, len(key), len(value), [],
                )
            )  # fmt: skip
        out.append(batch)
    return out


class WorkerHandler:
    """The worker's ``Executor`` built as ``worker.auth.app`` builds it (store, publisher,
    adapters with their metric hooks, policy, router, metrics), driven per fetched batch
    as the consume loop drives it."""

    def __init__(self, settings: Settings, producer: Producer, provider: Provider) -> None:
        metrics = WorkerMetrics(CollectorRegistry())
        providers = build_registry(
            settings, provider, on_call=metrics.provider_call, on_retry=metrics.provider_retry
        )
        store = StateStore()
        topic = settings.topics.commands
        for partition in range(PARTITIONS):
            store.handed_over(topic, partition, 0)  # nothing inherited: no re-drives
        self.executor = Executor(
            store=store,
            publisher=Publisher(producer, settings.topics),
            providers=providers,
            policy=policy_from(settings, set(providers)),
            metrics=metrics,
            router=Router(topic, partitions_for_topic=lambda _: None, fallback=PARTITIONS),
        )

    async def handle(self, batch: Batch) -> None:
        """Each partition's records as the consume loop hands them over: one unit of work
        (``Executor.handle_batch``; every key in these batches is distinct, as the loop's
        units are), a record it lets go unfinished then through ``handle`` as its lane runs
        it."""
        lanes: list[Awaitable[None]] = []

        def release(msgs: list[ConsumerRecord[bytes, bytes]], finished: bool) -> None:
            if not finished:
                lanes.extend(self.executor.handle(msg) for msg in msgs)

        await asyncio.gather(
            *(self.executor.handle_batch(msgs, release) for msgs in batch.values())
        )
        await asyncio.gather(*lanes)


async def one_round(kind: str, n: int, size: int, tag: str) -> dict[str, Any]:
    """µs of CPU per first confirm through ``kind``'s handler (registrations not counted)."""
    settings = Settings(provider_urls={"simulator": "http://127.0.0.1:9"})
    workload = Workload(tag, commands=n, accounts=n, mix="fresh")
    registrations, confirms = batches(workload, size, settings.topics.commands)
    producer = Producer(settings.topics.replies)
    provider = Provider()
    contender: WorkerFloor | BatchedWorker | WorkerHandler
    unused: tuple[Any, ...] = ()
    if kind == "executor":
        contender = WorkerHandler(settings, producer, provider)
    else:
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
    producer.replies.clear()
    gc.collect()  # the earlier rounds' garbage is not this round's cost
    started = time.process_time()
    for batch in confirms:
        await contender.handle(batch)
    cpu = time.process_time() - started
    for client in unused:
        await client.stop()
    return {
        "us_per_confirm": cpu / n * 1e6,
        "provider_calls": provider.calls,
        "replies": producer.statuses(),
    }


async def measure(n: int, size: int, rounds: int) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for r in range(rounds):
        for kind in KINDS:
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
    logs.configure("WARNING")  # as python -m bench runs the worker
    tune_gc(Settings().worker_gc_threshold)  # as python -m worker run and bench.proc do
    best = asyncio.run(measure(a.confirms, a.batch, a.rounds))
    for kind, got in best.items():
        print(
            f"{kind:8} {got['us_per_confirm']:8.1f} µs/confirm  provider calls "
            f"{got['provider_calls']}  replies {got['replies']}"
        )
    cpu = {kind: got["us_per_confirm"] for kind, got in best.items()}
    print(
        f"batched ÷ floor {cpu['batched'] / cpu['floor']:.2f}, executor ÷ batched "
        f"{cpu['executor'] / cpu['batched']:.2f}, executor ÷ floor "
        f"{cpu['executor'] / cpu['floor']:.2f} (best of {a.rounds} rounds of "
        f"{a.confirms:,} each)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
