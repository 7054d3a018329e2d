"""The benchmark's contenders that are not ``python -m worker run`` itself, one per process so
that each one's CPU time and peak RSS can be read from ``/proc`` alone.

``python -m bench.proc {ceiling,floor,batched,baseline,worker-inproc}``; configuration comes
from the environment exactly as for ``python -m worker run`` (``KAFKA_*``, ``TOPIC_*``,
``PROVIDER_URLS``, ``SIMULATOR_LATENCY_MS``, ``WORKER_GC_THRESHOLD`` ...): every contender
process gets the garbage-collector threshold ``python -m worker run`` sets for itself, so the
comparison is between designs, not GC settings. SIGTERM/SIGINT stop the process cleanly.

* ``ceiling``: a pass-through consumer (consumer group, manual commit) that decodes nothing and
  calls nothing; for every command it produces the records named in the command's
  ``bench-out`` header (the record count and topics the worker produces for that command), the
  command's own bytes as value. Upper bound for the Kafka I/O alone.
* ``floor``: the worker's floor (``bench.floor``): the same provider call per first confirm
  through the worker's own HTTP client, the same output records (the worker's state record),
  per fetched batch the states then one ack wait, the replies and events then one more; each
  account in order across batches; commits at the worker's cadence; no decision table,
  retries or instrumentation.
* ``batched``: the worker's own decision, adapter and records in the floor's shape
  (``bench.batched``): what the contract's work costs when a fetched batch is the unit of work.
* ``baseline``: the partition-ordered loop a plain aiokafka service would be: per partition, one
  record at a time, in order (partitions concurrent): decode, decide (the worker's own pure
  decision), call the provider through the HTTP adapter, produce the outputs, await their acks;
  commit every 200 ms. No write-ahead intent (one produce round-trip fewer than the worker).
* ``worker-inproc``: the real worker (``run_worker``) with the HTTP adapter on the simulator's
  in-process transport (same latency, no sockets), to separate worker cost from HTTP cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from bench.batched import run_batched
from bench.floor import run_floor
from devstack.settings import DevSettings
from devstack.simulator import ProviderSimulator, in_process_provider
from worker.auth.app import policy_from, run_worker
from worker.auth.flow import decide, settle_confirm
from worker.auth.provider import (
    ProviderAuthState,
    ProviderError,
    ProviderRegistry,
    build_http_client,
    build_registry,
)
from worker.auth.publish import Publisher
from worker.contract.messages import AccountRecord, DecodeFailure, decode_command
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.runtime import eventloop, logs
from worker.runtime.process import on_stop_signals, tune_gc
from worker.settings import Settings
from worker.startup import RootOptions

#: Header on every benchmark command naming the output roles the worker produces for it,
#: comma-separated (``state``, ``replies``, ``status``); the ceiling produces exactly those.
OUTPUTS_HEADER = "bench-out"
COMMIT_INTERVAL_S = 0.2
QUEUE_HIGH = 1000  # per-partition backlog at which the baseline pauses fetching that partition


def _group_consumer(settings: Settings) -> AIOKafkaConsumer:
    return build_consumer(
        settings.kafka_config(),
        settings.topics.commands,
        group_id=settings.kafka_consumer_group,
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=settings.kafka_heartbeat_interval_ms,
    )


async def _batches(
    consumer: AIOKafkaConsumer, settings: Settings, stop: asyncio.Event
) -> AsyncIterator[dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]]:
    """Fetched batches until ``stop``; prints ``assigned N`` once the group gave us
    partitions (the orchestrator waits on that line)."""
    announced = False
    while not stop.is_set():
        batch = await consumer.getmany(timeout_ms=100, max_records=settings.kafka_max_poll_records)
        if not announced and consumer.assignment():
            print(f"assigned {len(consumer.assignment())}", flush=True)
            announced = True
        yield batch


async def run_ceiling(settings: Settings, stop: asyncio.Event) -> None:
    topics = settings.topics
    roles = {"state": topics.state, "replies": topics.replies, "status": topics.status}
    producer = build_producer(settings.kafka_config())
    consumer = _group_consumer(settings)
    await producer.start()
    await consumer.start()
    try:
        async for batch in _batches(consumer, settings, stop):
            futures: list[asyncio.Future[Any]] = []
            offsets: dict[TopicPartition, int] = {}
            for tp, records in batch.items():
                for msg in records:
                    wanted = b"replies"
                    for key, value in msg.headers:
                        if key == OUTPUTS_HEADER:
                            wanted = value
                    for role in wanted.decode().split(","):
                        partition = msg.partition if role == "state" else None
                        futures.append(
                            await producer.send(
                                roles[role], msg.value, key=msg.key, partition=partition
                            )
                        )
                offsets[tp] = records[-1].offset + 1
            if futures:
                await asyncio.gather(*futures)
            if offsets:
                await consumer.commit(offsets)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        await producer.stop()


async def run_baseline(settings: Settings, stop: asyncio.Event) -> None:
    topics = settings.topics
    producer = build_producer(settings.kafka_config())
    consumer = _group_consumer(settings)
    http = build_http_client(settings)
    providers = build_registry(settings, http)
    publisher = Publisher(producer, topics)
    policy = policy_from(settings, set(providers))
    state: dict[str, AccountRecord] = {}
    queues: dict[TopicPartition, asyncio.Queue[Any]] = {}
    done: dict[TopicPartition, int] = {}
    paused: set[TopicPartition] = set()
    workers: list[asyncio.Task[None]] = []

    async def apply(msg: Any) -> None:
        command = decode_command(msg.key, msg.value)
        if isinstance(command, DecodeFailure):
            return  # the benchmark sends none; a real service would dead-letter it
        record = state.get(command.account_id)
        decision = decide(record, command, now=time.time(), policy=policy)
        if decision.call is not None and decision.record is not None:
            intent = decision.record
            adapter = providers[intent.provider or ""]
            deadline = time.monotonic() + policy.command_deadline_s
            result: ProviderAuthState | Any
            try:
                answer = await adapter.confirm_passkey(
                    intent.provider_account_ref or "",
                    idempotency_key=command.command_id,
                    deadline=deadline,
                )
                result = answer
            except ProviderError as exc:
                result = exc.error
            decision = settle_confirm(intent, result, now=time.time(), policy=policy)
            record = intent
        changed = decision.record is not None and decision.record is not record
        await publisher.publish(msg.partition, decision, state_changed=changed)
        if changed and decision.record is not None:
            state[decision.record.account_id] = decision.record

    async def partition_loop(tp: TopicPartition, queue: asyncio.Queue[Any]) -> None:
        while True:
            msg = await queue.get()
            await apply(msg)
            done[tp] = msg.offset + 1

    async def committer() -> None:
        committed: dict[TopicPartition, int] = {}
        while True:
            await asyncio.sleep(COMMIT_INTERVAL_S)
            offsets = {tp: o for tp, o in done.items() if committed.get(tp) != o}
            if offsets:
                with contextlib.suppress(Exception):
                    await consumer.commit(offsets)
                    committed.update(offsets)

    await producer.start()
    await consumer.start()
    workers.append(asyncio.create_task(committer()))
    try:
        async for batch in _batches(consumer, settings, stop):
            for tp, records in batch.items():
                queue = queues.get(tp)
                if queue is None:
                    queue = queues[tp] = asyncio.Queue()
                    workers.append(asyncio.create_task(partition_loop(tp, queue)))
                for msg in records:
                    queue.put_nowait(msg)
            for tp, queue in queues.items():
                if tp not in paused and queue.qsize() >= QUEUE_HIGH:
                    consumer.pause(tp)
                    paused.add(tp)
                elif tp in paused and queue.qsize() < QUEUE_HIGH // 2:
                    consumer.resume(tp)
                    paused.discard(tp)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        with contextlib.suppress(Exception):
            await consumer.stop()
        await producer.stop()
        await providers.aclose()
        await http.aclose()


async def run_worker_inproc(settings: Settings, stop: asyncio.Event) -> None:
    provider = in_process_provider(
        ProviderSimulator.from_settings(DevSettings()), settings=settings
    )
    await run_worker(
        settings,
        RootOptions(stop=stop, install_signals=False),
        providers=ProviderRegistry([provider]),
    )


CONTENDERS: dict[str, Callable[[Settings, asyncio.Event], Awaitable[None]]] = {
    "ceiling": run_ceiling,
    "floor": run_floor,
    "batched": run_batched,
    "baseline": run_baseline,
    "worker-inproc": run_worker_inproc,
}


async def _main(name: str, settings: Settings) -> None:
    stop = asyncio.Event()
    with on_stop_signals(stop.set):
        await ensure_topics(settings.kafka_config(), settings.topic_plan())
        await CONTENDERS[name](settings, stop)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CONTENDERS:
        print(f"usage: python -m bench.proc {{{','.join(CONTENDERS)}}}", file=sys.stderr)
        return 2
    settings = Settings()
    logs.configure(settings.log_level, settings.log_format)
    tune_gc(settings.worker_gc_threshold)  # as `python -m worker run` does
    eventloop.run(_main(argv[0], settings), settings.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
