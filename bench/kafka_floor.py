"""The Kafka floor of a front-end POST: the Kafka part of a confirm alone, with no HTTP, no
front-end layers and no worker, so "front-end ÷ ceiling" can be set beside "(ceiling + this)
÷ ceiling" in the same run (``bench.stack_cost``; figures: bench/README.md, "Kafka floor").

Two roles, one process each, so that only the requester's CPU is counted:

* ``python -m bench.kafka_floor echo``: a group-less consumer of every partition of
  ``floor.requests`` producing each record's value to ``floor.replies``, on the partition the
  record's ``reply-partition`` header names (the worker's rule for replies); a batch's
  records are handed to the producer together and their acknowledgements awaited together,
  so aiokafka batches them. ``--delay-ms`` holds each batch that long first (a slower
  "worker", for a floor at a lower rate).
* ``python -m bench.kafka_floor requester``: what a front-end POST does in Kafka and nothing
  else. ``--in-flight`` lanes, each in turn: register a waiter under a fresh correlation id,
  produce one ``--size``-byte record (keyed, with the ``reply-partition`` header) with the
  front-end's producer (``build_producer``), await its acknowledgement, await its reply. The
  replies are read as the front-end reads them: one group-less consumer
  (``build_consumer``, fetch wait ``KAFKA_FETCH_MAX_WAIT_MS``) assigned one partition of
  ``floor.replies``, in a ``worker.engine.tail.TopicTail`` loop like ``ReplyRouter``'s; a reply is
  matched by the id in its first bytes (no JSON: that is the front-end's, not Kafka's). Left
  out, being the front-end's own and not Kafka's: the command model and its JSON,
  ``send_retrying``'s outage bookkeeping, the per-request ``wait_for`` and spans.
  ``--client confluent`` does the same on librdkafka (confluent-kafka, a C client) instead of
  aiokafka, on topics of its own (``floor-confluent.*``): librdkafka's threads do the
  protocol and the socket I/O, one thread serves the producer's acknowledgements and one
  reads the replies, each handing results to the event loop with ``call_soon_threadsafe``.
  It asks what the same round trip costs when the Kafka client is not Python.

Both print ``floor ready`` once set up and then obey one line of stdin at a time: the echo
``resume`` / ``pause`` (answered ``floor resume`` / ``floor pause``), the requester a request
count (answered ``floor result {json}``). Between commands both consumers are paused, so they
cost the broker nothing while the other phases run. Stdin's end (the driver stopped or died),
SIGTERM, or ``--max-s`` stop either; a requester phase ends after ``--phase-timeout-s`` at the
latest, answering how many replies arrived. ``Floor`` drives both from another process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

import confluent_kafka
from aiokafka import TopicPartition

from bench.common import REPO_ROOT, base_env
from bench.load import percentile
from worker.engine.home_partition import REPLY_PARTITION, reply_partition
from worker.engine.kafka import build_consumer, build_producer, create_topics
from worker.engine.tail import TopicTail, assign_all
from worker.runtime import eventloop, logs
from worker.runtime.process import on_stop_signals, tune_gc
from worker.settings import Settings

CLIENTS: Final = ("aiokafka", "confluent")
ID_BYTES: Final = 16
"""A record's value starts with its correlation id: a counter, zero-padded to this width."""
MARK: Final = b"floor "
"""Prefix of every line the roles answer on stdout (a log line never starts with it)."""


async def stdin_lines() -> asyncio.StreamReader:
    """Stdin as a stream the loop reads without a thread (a read is cancellable)."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def topics(client: str) -> tuple[str, str]:
    """(requests, replies) of one client's floor: each client has its own, so one floor's
    records never reach the other's consumers."""
    prefix = "floor" if client == "aiokafka" else f"floor-{client}"
    return f"{prefix}.requests", f"{prefix}.replies"


def say(text: str) -> None:
    sys.stdout.buffer.write(MARK + text.encode() + b"\n")
    sys.stdout.buffer.flush()


# -- echo ----------------------------------------------------------------------------------------


async def echo(settings: Settings, stop: asyncio.Event, delay_s: float, client: str) -> None:
    """The echo is aiokafka for every requester's client: it stands in for the worker."""
    requests, replies = topics(client)
    # Partitioned as auth.commands and auth.replies: a request spreads like a command and a
    # reply lands like one.
    await create_topics(
        settings.kafka_config(),
        {requests: settings.commands_partitions, replies: settings.other_partitions},
        replication_factor=settings.kafka_replication_factor,
    )
    producer = build_producer(settings.kafka_config())
    consumer = build_consumer(settings.kafka_config())
    held: set[asyncio.Task[None]] = set()

    async def answer(records: list[Any]) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        acks = []
        for msg in records:
            wanted = reply_partition(msg.headers)
            partition = 0 if wanted is None else wanted
            acks.append(await producer.send(replies, msg.value, partition=partition))
        await asyncio.gather(*acks)

    await producer.start()
    await consumer.start()
    try:
        tps = await assign_all(consumer, requests)
        consumer.pause(*tps)
        say("ready")

        async def obey() -> None:
            control = await stdin_lines()
            while line := (await control.readline()).strip():
                if line == b"resume":
                    consumer.resume(*tps)
                elif line == b"pause":
                    consumer.pause(*tps)
                say(line.decode())
            stop.set()

        control = asyncio.create_task(obey())
        while not stop.is_set() and not control.done():
            batch = await consumer.getmany(
                timeout_ms=100, max_records=settings.kafka_max_poll_records
            )
            records = [msg for part in batch.values() for msg in part]
            if not records:
                continue
            if delay_s > 0:
                task = asyncio.create_task(answer(records))
                held.add(task)
                task.add_done_callback(held.discard)
            else:
                await answer(records)
        control.cancel()
        await asyncio.gather(control, *held, return_exceptions=True)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        await producer.stop()


# -- requester -----------------------------------------------------------------------------------


class FloorReplies(TopicTail):
    """The requester's reply consumer: the front-end's reply loop (``TopicTail``, one
    partition, ``ReplyRouter``'s defaults), matching a reply by the id its value starts with."""

    def __init__(self, consumer: Any, topic: str, partition: int) -> None:
        super().__init__(consumer, topic, name="floor-replies", only=self._pick)
        self.wanted = partition
        self.waiters: dict[bytes, asyncio.Future[None]] = {}

    def _pick(self, partitions: list[int]) -> list[int]:
        if self.wanted not in partitions:
            raise ValueError(f"{self.topic} has partitions {partitions[0]}..{partitions[-1]}")
        return [self.wanted]

    def handle(self, records: list[Any]) -> None:
        if self.waiters:
            answer(self.waiters, [msg.value for msg in records])


def answer(waiters: dict[bytes, asyncio.Future[None]], values: list[bytes | None]) -> None:
    """Wake the waiter of each reply, matched by the id its value starts with."""
    for value in values:
        if value is None:
            continue
        waiter = waiters.pop(value[:ID_BYTES], None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


Send = Callable[[bytes, bytes, list[tuple[str, bytes]]], Awaitable[None]]
"""Produce (value, key, headers) to the requests topic and wait for the acknowledgement."""


class ConfluentProducer:
    """A librdkafka producer for an asyncio caller: ``send`` returns a future of the
    acknowledgement, which a poll thread hands to the loop (``call_soon_threadsafe``).
    Configured as ``build_producer``: acks=all, ``linger_ms`` 2 unless told, no idempotence
    on the embedded broker; murmur2, as aiokafka partitions."""

    def __init__(
        self, settings: Settings, loop: asyncio.AbstractEventLoop, *, linger_ms: float = 2
    ) -> None:
        self.loop = loop
        self.producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": settings.bootstrap,
                "acks": "all",
                "linger.ms": linger_ms,
                "enable.idempotence": settings.kafka_idempotent_producer,
                "partitioner": "murmur2_random",
            }
        )
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._acks, name="confluent-acks", daemon=True)
        self.thread.start()

    def send(
        self, topic: str, value: bytes, key: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> Awaitable[None]:
        done: asyncio.Future[None] = self.loop.create_future()
        call = self.loop.call_soon_threadsafe

        def acked(err: Any, _msg: Any) -> None:
            call(_settle, done, err)

        wire: list[tuple[str, str | bytes | None]] = list(headers or ())
        self.producer.produce(topic, value, key, headers=wire, on_delivery=acked)
        return done

    def _acks(self) -> None:
        while not self.closing.is_set():
            self.producer.poll(0.05)

    def close(self) -> None:
        self.closing.set()
        self.thread.join(5)
        self.producer.flush(5)


class ConfluentSide:
    """The requester's Kafka on librdkafka: a ``ConfluentProducer`` and a consumer of the one
    reply partition read by a thread of its own (what is there at each wake-up, one
    ``call_soon_threadsafe`` per batch). Outside a phase the consumer is paused, as the
    aiokafka side's is."""

    def __init__(self, settings: Settings, partition: int, loop: asyncio.AbstractEventLoop):
        self.requests, replies = topics("confluent")
        self.loop = loop
        self.waiters: dict[bytes, asyncio.Future[None]] = {}
        self.producer = ConfluentProducer(settings, loop)
        # A group id is required by the client's configuration; assign() never joins it.
        self.consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": settings.bootstrap,
                "group.id": "floor-confluent",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": settings.kafka_fetch_max_wait_ms,
            }
        )
        self.tp = confluent_kafka.TopicPartition(replies, partition)
        _, high = self.consumer.get_watermark_offsets(self.tp, timeout=30)
        self.consumer.assign([confluent_kafka.TopicPartition(replies, partition, high)])
        self.consumer.pause([self.tp])
        self.active = threading.Event()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._replies, name="floor-replies", daemon=True)
        self.thread.start()

    def send(self, value: bytes, key: bytes, headers: list[tuple[str, bytes]]) -> Awaitable[None]:
        return self.producer.send(self.requests, value, key, headers)

    def _replies(self) -> None:
        paused = True
        while not self.closing.is_set():
            if self.active.is_set() == paused:
                (self.consumer.resume if paused else self.consumer.pause)([self.tp])
                paused = not paused
            if paused:
                self.active.wait(0.05)
                continue
            # consume(n, timeout) waits for n records or the timeout: wait for the first
            # record only, then take what else is already there.
            first = self.consumer.poll(0.05)
            if first is None:
                continue
            batch = [first, *self.consumer.consume(1000, 0)]
            values = [m.value() for m in batch if m.error() is None]
            if values:
                self.loop.call_soon_threadsafe(answer, self.waiters, values)

    def close(self) -> None:
        self.closing.set()
        self.thread.join(5)
        self.consumer.close()
        self.producer.close()


def _settle(done: asyncio.Future[None], err: Any) -> None:
    if done.done():
        return
    if err is None:
        done.set_result(None)
    else:
        done.set_exception(RuntimeError(f"not acknowledged: {err}"))


@dataclass
class Requester:
    send: Send
    waiters: dict[bytes, asyncio.Future[None]]
    reply_partition: int
    in_flight: int
    size: int
    timeout_s: float
    numbers: itertools.count[int]

    async def run(self, n: int) -> dict[str, Any]:
        """``n`` requests over ``in_flight`` lanes (closed loop), within ``timeout_s``."""
        loop = asyncio.get_running_loop()
        waiters = self.waiters
        headers = [(REPLY_PARTITION, b"%d" % self.reply_partition)]
        filler = b"x" * max(0, self.size - ID_BYTES)
        latencies: list[float] = []
        left = iter(range(n))

        async def lane() -> None:
            for _ in left:
                number = next(self.numbers)
                cid = b"%0*d" % (ID_BYTES, number)
                waiter: asyncio.Future[None] = loop.create_future()
                waiters[cid] = waiter
                started = time.perf_counter()
                try:
                    await self.send(cid + filler, b"acc_floor_%d" % number, headers)
                    await waiter
                finally:
                    waiters.pop(cid, None)
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout_s):
                await asyncio.gather(*(lane() for _ in range(self.in_flight)))
        elapsed = time.perf_counter() - started
        ms = [x * 1000 for x in latencies]
        return {
            "requests": n,
            "answered": len(latencies),
            "seconds": elapsed,
            "rate": len(latencies) / elapsed,
            "p50_ms": percentile(ms, 50),
            "p99_ms": percentile(ms, 99),
        }


async def requester(settings: Settings, stop: asyncio.Event, args: argparse.Namespace) -> None:
    if args.client == "confluent":
        await confluent_requester(settings, stop, args)
        return
    requests, reply_topic = topics("aiokafka")
    producer = build_producer(settings.kafka_config())
    replies = FloorReplies(build_consumer(settings.kafka_config()), reply_topic, args.partition)

    async def send(value: bytes, key: bytes, headers: list[tuple[str, bytes]]) -> None:
        await (await producer.send(requests, value, key=key, headers=headers))

    await producer.start()
    try:
        await replies.start()
        if not await replies.wait_caught_up(args.phase_timeout_s):
            raise RuntimeError(f"{reply_topic} not caught up in {args.phase_timeout_s}s")
        tps: list[TopicPartition] = list(replies.partitions)
        replies.consumer.pause(*tps)
        run = Requester(send, replies.waiters, args.partition, *_lanes(args))
        await _obey(
            stop,
            run,
            lambda: replies.consumer.resume(*tps),
            lambda: replies.consumer.pause(*tps),
        )
    finally:
        with contextlib.suppress(Exception):
            await replies.stop()
        await producer.stop()


async def confluent_requester(
    settings: Settings, stop: asyncio.Event, args: argparse.Namespace
) -> None:
    side = await asyncio.to_thread(
        ConfluentSide, settings, args.partition, asyncio.get_running_loop()
    )
    try:
        run = Requester(side.send, side.waiters, args.partition, *_lanes(args))
        await _obey(stop, run, side.active.set, side.active.clear)
    finally:
        await asyncio.to_thread(side.close)


def _lanes(args: argparse.Namespace) -> tuple[int, int, float, itertools.count[int]]:
    return args.in_flight, args.size, args.phase_timeout_s, itertools.count()


async def _obey(
    stop: asyncio.Event,
    run: Requester,
    resume: Callable[[], None],
    pause: Callable[[], None],
) -> None:
    """Say ready, then run one phase per request count read from stdin, the reply consumer
    resumed only during a phase."""
    say("ready")
    control = await stdin_lines()
    while not stop.is_set() and (line := (await control.readline()).strip()):
        resume()
        result = await run.run(int(line))
        pause()
        say("result " + json.dumps(result))


# -- the driver ----------------------------------------------------------------------------------


class Floor:
    """Starts both roles against ``bootstrap`` and drives them from another process
    (``bench.stack_cost``): ``run(n)`` is one phase; ``pids`` for ``CpuWindow``."""

    def __init__(
        self,
        echo: asyncio.subprocess.Process,
        requester: asyncio.subprocess.Process,
        phase_timeout_s: float,
    ) -> None:
        self.echo = echo
        self.requester = requester
        self.phase_timeout_s = phase_timeout_s

    @property
    def pids(self) -> dict[str, int]:
        return {"requester": self.requester.pid, "echo": self.echo.pid}

    @classmethod
    async def start(
        cls,
        bootstrap: str,
        *,
        echo_fetch_wait_ms: int,
        reply_fetch_wait_ms: int,
        in_flight: int,
        size: int = 400,
        delay_ms: float = 0.0,
        timeout_s: float = 60.0,
        max_s: float = 3600.0,
        client: str = "aiokafka",
    ) -> Floor:
        """``echo_fetch_wait_ms``: the worker's fetch wait; ``reply_fetch_wait_ms``: the
        front-end's reply consumer's; both as the stack under test gives them. ``client``:
        the requester's Kafka client (the echo is aiokafka either way)."""
        env = base_env() | {"KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        limit = ("--max-s", str(max_s), "--client", client)
        echo = await _spawn(
            env | {"KAFKA_FETCH_MAX_WAIT_MS": str(echo_fetch_wait_ms)},
            "echo",
            *limit,
            "--delay-ms",
            str(delay_ms),
        )
        try:
            await _expect(echo, "ready", timeout_s)
            req = await _spawn(
                env | {"KAFKA_FETCH_MAX_WAIT_MS": str(reply_fetch_wait_ms)},
                "requester",
                *limit,
                *("--in-flight", str(in_flight), "--size", str(size)),
                *("--phase-timeout-s", str(timeout_s)),
            )
        except BaseException:
            await _stop(echo)
            raise
        floor = cls(echo, req, timeout_s)
        try:
            await _expect(req, "ready", timeout_s)
        except BaseException:
            await floor.stop()
            raise
        return floor

    async def resume_echo(self) -> None:
        await _tell(self.echo, "resume")

    async def pause_echo(self) -> None:
        await _tell(self.echo, "pause")

    async def run(self, n: int) -> dict[str, Any]:
        """One phase of ``n`` requests (the echo resumed by the caller); raises unless every
        request was answered."""
        assert self.requester.stdin is not None
        self.requester.stdin.write(b"%d\n" % n)
        answer = await _expect(self.requester, "result", self.phase_timeout_s + 30)
        result: dict[str, Any] = json.loads(answer)
        if result["answered"] != n:
            raise RuntimeError(f"Kafka floor: {result['answered']} of {n} requests answered")
        return result

    async def stop(self) -> None:
        await asyncio.gather(_stop(self.requester), _stop(self.echo))


async def _spawn(env: dict[str, str], *argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.kafka_floor",
        *argv,
        cwd=REPO_ROOT,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def _expect(proc: asyncio.subprocess.Process, word: str, timeout_s: float) -> str:
    """The rest of ``proc``'s next ``floor <word>`` line; other lines (logs) are skipped."""
    assert proc.stdout is not None
    prefix = MARK + word.encode()
    async with asyncio.timeout(timeout_s):
        while line := await proc.stdout.readline():
            if line.startswith(prefix):
                return line[len(prefix) :].decode().strip()
    raise RuntimeError(f"bench.kafka_floor exited ({await proc.wait()}) before {word!r}")


async def _tell(proc: asyncio.subprocess.Process, word: str, timeout_s: float = 10.0) -> None:
    assert proc.stdin is not None
    proc.stdin.write(word.encode() + b"\n")
    await _expect(proc, word, timeout_s)


async def _stop(proc: asyncio.subprocess.Process, grace_s: float = 30.0) -> None:
    """Close its stdin (the role stops by itself), SIGKILL after ``grace_s``."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()


# -- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_floor", description=__doc__)
    parser.add_argument("role", choices=("echo", "requester"))
    parser.add_argument("--max-s", type=float, default=3600.0, help="lifetime limit")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="echo: hold each batch")
    parser.add_argument("--in-flight", type=int, default=50, help="requester: lanes")
    parser.add_argument("--size", type=int, default=400, help="requester: record bytes")
    parser.add_argument("--partition", type=int, default=0, help="requester: reply partition")
    parser.add_argument(
        "--client", choices=CLIENTS, default="aiokafka", help="the requester's Kafka client"
    )
    parser.add_argument("--phase-timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    settings = Settings()
    logs.configure(settings.log_level, settings.log_format)
    tune_gc(settings.worker_gc_threshold)  # as `python -m worker api` does

    async def role(stop: asyncio.Event) -> None:
        if args.role == "echo":
            await echo(settings, stop, args.delay_ms / 1000, args.client)
        else:
            await requester(settings, stop, args)

    eventloop.run(_bounded(role, args.max_s), settings.event_loop)
    return 0


async def _bounded(
    role: Callable[[asyncio.Event], Coroutine[Any, Any, None]], max_s: float
) -> None:
    """``role`` until it ends, SIGTERM/SIGINT, or ``max_s``."""
    stop = asyncio.Event()
    with on_stop_signals(stop.set):
        task = asyncio.create_task(role(stop))
        stopper = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({task, stopper}, timeout=max_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


if __name__ == "__main__":
    raise SystemExit(main())
