"""``python -m worker dlq list|show|redrive`` (docs/operations.md, "Dead letters"). Redrive writes
only to the topics the worker and the dispatcher consume: ``dlq.source`` is as hostile as the rest
of a dead letter and must not steer a redrive into ``auth.state``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final, TextIO

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from worker.dlq.letter import (
    DELIVERY_FAILED,
    DeadLetter,
    Filter,
    show_json,
    show_text,
)
from worker.engine.catch_up import catch_up
from worker.engine.faults import REDRIVEN, SOURCE
from worker.engine.kafka import KafkaConfig, build_consumer, build_producer, partition_counts
from worker.engine.tail import assign_all
from worker.settings import Settings

__all__ = [
    "Query",
    "RedriveReport",
    "Redriver",
    "Target",
    "dlq_topic",
    "fetch",
    "list_letters",
    "plan",
    "redrive",
    "redrive_targets",
    "run",
    "scan",
    "show_letter",
    "source_topic",
]

DEFAULT_LIMIT: Final = 100
SHOW_BYTES: Final = 4096
"""What ``show`` prints of a key, header or value without ``--full``."""
BATCH_RECORDS: Final = 200
"""Records fetched per poll: the most held in memory at once."""
SENDS_IN_FLIGHT: Final = 100
PENDING_BYTES: Final = 8 * 1024 * 1024
"""A redrive waits for its acknowledgements after this many sends or bytes."""
METADATA_TIMEOUT_S: Final = 10.0
REPLAY_HINT: Final = (
    "a failed webhook delivery: replay it with POST /v1/webhook-endpoints/{endpoint_id}/replay "
    "(docs/api.md, Webhook endpoints)"
)

Visit = Callable[[DeadLetter], Awaitable[bool]]
"""Takes each record; returns False to stop the scan."""


class _Stop(Exception):
    """Raised out of a catch-up's batch handler to end it early."""


def dlq_topic(settings: Settings, name: str) -> str:
    """``auth`` and ``webhook`` name the two dead-letter topics of the settings; anything else
    is a topic name."""
    aliases = {"auth": settings.topics.dlq, "webhook": settings.topics.webhook_dlq}
    return aliases.get(name, name)


def source_topic(settings: Settings, name: str) -> str:
    """A topic by its field of ``Topics`` (``commands``: TOPIC_COMMANDS) or by name."""
    if name in type(settings.topics).model_fields:
        topic: str = getattr(settings.topics, name)
        return topic
    return name


def redrive_targets(settings: Settings) -> frozenset[str]:
    """The topics a redrive may write: the inputs of the worker and the dispatcher, the only
    topics whose records are dead-lettered."""
    t = settings.topics
    return frozenset({t.commands, t.status, t.errors, t.webhook_replays})


@dataclass(frozen=True, slots=True)
class Query:
    """Which records of which topic, and how many at most."""

    topic: str
    select: Filter = field(default_factory=Filter)
    limit: int = DEFAULT_LIMIT


@contextlib.asynccontextmanager
async def _consumer(kafka: KafkaConfig) -> AsyncIterator[AIOKafkaConsumer]:
    consumer = build_consumer(kafka, group_id=None, client_id="passkey-dlq")
    try:
        await consumer.start()
        yield consumer
    finally:
        await consumer.stop()


async def _assign(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """Every partition of ``topic``, assigned; a topic the cluster does not have is an error
    at once rather than after the metadata wait (a mistyped ``--topic``)."""
    if topic not in await consumer.topics():
        raise LookupError(f"the cluster has no topic {topic[:249]!r}")
    return await assign_all(consumer, topic, timeout_s=METADATA_TIMEOUT_S)


async def scan(consumer: AIOKafkaConsumer, topic: str, visit: Visit) -> None:
    """Hand every record of ``topic`` to ``visit``, partition by partition, each from its
    beginning to its high-water mark (``catch_up``), until ``visit`` returns False."""
    tps = await _assign(consumer, topic)

    async def on_batch(_: TopicPartition, records: list[Any]) -> None:
        for record in records:
            if not await visit(DeadLetter.of(record)):
                raise _Stop

    for tp in tps:
        try:
            await catch_up(consumer, [tp], on_batch, max_records=BATCH_RECORDS)
        except _Stop:
            return


async def fetch(
    consumer: AIOKafkaConsumer, topic: str, partition: int, offset: int
) -> DeadLetter | None:
    """The record at ``partition:offset`` of ``topic``, or None when there is none (past the
    end, removed by retention, or a partition the topic does not have)."""
    tps = await _assign(consumer, topic)
    tp = TopicPartition(topic, partition)
    if tp not in tps:
        return None
    consumer.assign([tp])
    consumer.seek(tp, offset)
    found: list[DeadLetter] = []

    def on_batch(_: TopicPartition, records: list[Any]) -> None:
        for record in records:
            if record.offset >= offset:
                if record.offset == offset:
                    found.append(DeadLetter.of(record))
                raise _Stop

    with contextlib.suppress(_Stop):
        await catch_up(consumer, [tp], on_batch, max_records=50, assign=False)
    return found[0] if found else None


async def _selected(
    kafka: KafkaConfig, query: Query, take: Callable[[DeadLetter], Awaitable[None]]
) -> tuple[int, int, bool]:
    """Scan ``query.topic`` and pass the selected records to ``take``, up to the limit.
    Returns (read, selected, more): ``more`` when a record past the limit was selected too."""
    read = selected = 0
    more = False

    async def visit(letter: DeadLetter) -> bool:
        nonlocal read, selected, more
        read += 1
        if not query.select(letter):
            return True
        if selected == query.limit:
            more = True
            return False
        selected += 1
        await take(letter)
        return True

    async with _consumer(kafka) as consumer:
        await scan(consumer, query.topic, visit)
    return read, selected, more


def _summary(query: Query, counts: tuple[int, int, bool], verb: str) -> str:
    """The closing line of ``list`` and ``redrive``: records read, selected, and the limit."""
    read, selected, more = counts
    note = f"; stopped at --limit {query.limit}, more records match" if more else ""
    return f"{selected} of {read} records of {query.topic} {verb}{note}"


async def list_letters(
    settings: Settings, query: Query, *, as_json: bool, out: TextIO, err: TextIO
) -> int:
    """``dlq list``: one line (or JSON object) per selected record; a summary on ``err``."""
    if not as_json:
        print("at\ttime\treason\tkey\tsource\texception\tdetail", file=out)

    async def take(letter: DeadLetter) -> None:
        line = json.dumps(letter.summary()) if as_json else letter.line()
        print(line, file=out)

    counts = await _selected(settings.kafka_config(), query, take)
    print(_summary(query, counts, "listed"), file=err)
    return 0


async def show_letter(
    settings: Settings,
    topic: str,
    at: tuple[int, int],
    *,
    full: bool,
    as_json: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    """``dlq show``: every header and the value of one record; 1 when there is none."""
    async with _consumer(settings.kafka_config()) as consumer:
        letter = await fetch(consumer, topic, *at)
    if letter is None:
        print(f"no record at {at[0]}:{at[1]} of {topic}", file=err)
        return 1
    limit = None if full else SHOW_BYTES
    if as_json:
        print(json.dumps(show_json(letter, limit=limit)), file=out)
    else:
        print(show_text(letter, limit=limit), file=out)
    return 0


# --- redrive --------------------------------------------------------------------------------


@dataclass
class RedriveReport:
    """Counts of one redrive: sent by target topic, skipped and failed by why."""

    redriven: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)

    def lines(self, *, dry_run: bool) -> list[str]:
        verb = "would redrive" if dry_run else "redriven"
        rows = [f"{verb} {sum(self.redriven.values())}"]
        rows += [f"  to {topic}: {n}" for topic, n in sorted(self.redriven.items())]
        rows.append(f"skipped {sum(self.skipped.values())}")
        rows += [f"  {why}: {n}" for why, n in sorted(self.skipped.items())]
        if self.failed:
            rows.append(f"failed {sum(self.failed.values())}")
            rows += [f"  {why}: {n}" for why, n in sorted(self.failed.items())]
        return rows


@dataclass(frozen=True, slots=True)
class Target:
    """Where a dead letter goes back to: its source topic, and the source partition when the
    topic has it (None: the producer places it by key)."""

    topic: str
    partition: int | None

    def __str__(self) -> str:
        return f"{self.topic}:{'keyed' if self.partition is None else self.partition}"


def plan(letter: DeadLetter, partitions: Mapping[str, int]) -> Target | str:
    """The target of ``letter``, or why it is skipped. A truncated letter is never redriven: it
    is not the original record, and its source would read it as that."""
    if letter.truncated:
        return f"truncated ({','.join(letter.truncated)}): not the original record, not redriven"
    source = letter.source
    if source is None:
        if letter.header(SOURCE) is not None:
            return "dlq.source is not <topic>:<partition>:<offset>"
        if letter.reason == DELIVERY_FAILED:
            return REPLAY_HINT
        return "no dlq.source header"
    count = partitions.get(source.topic)
    if count is None:
        return f"dlq.source names {source.topic[:80]}, not a topic the worker or dispatcher reads"
    return Target(source.topic, source.partition if source.partition < count else None)


@dataclass(eq=False)
class Redriver:
    """Sends dead letters back (or, dry, only says where), counting every outcome."""

    producer: AIOKafkaProducer | None
    partitions: Mapping[str, int]
    _: KW_ONLY
    out: TextIO
    report: RedriveReport = field(default_factory=RedriveReport, init=False)

    def __post_init__(self) -> None:
        self._pending: list[tuple[str, Target, asyncio.Future[Any]]] = []
        self._pending_bytes = 0

    async def __call__(self, letter: DeadLetter) -> None:
        target = plan(letter, self.partitions)
        if isinstance(target, str):
            self.report.skipped[target] += 1
            print(f"skipped\t{letter.at}\t{target}", file=self.out)
            return
        if self.producer is None:
            self.report.redriven[target.topic] += 1
            print(f"would redrive\t{letter.at}\t-> {target}", file=self.out)
            return
        headers = [*letter.original_headers(), (REDRIVEN, str(letter.position).encode())]
        try:
            sent = await self.producer.send(
                target.topic,
                letter.value,
                key=letter.key,
                partition=target.partition,
                headers=headers,
            )
        except KafkaError as exc:
            self._failed(letter.at, exc)
            return
        self._pending.append((letter.at, target, sent))
        self._pending_bytes += len(letter.value or b"") + len(letter.key or b"")
        if len(self._pending) >= SENDS_IN_FLIGHT or self._pending_bytes >= PENDING_BYTES:
            await self.flush()

    async def flush(self) -> None:
        """Wait for the acknowledgement of every send so far."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        for at, target, sent in pending:
            try:
                metadata = await sent
            except KafkaError as exc:
                self._failed(at, exc)
                continue
            self.report.redriven[target.topic] += 1
            where = f"{target.topic}:{metadata.partition}:{metadata.offset}"
            print(f"redriven\t{at}\t-> {where}", file=self.out)

    def _failed(self, at: str, exc: KafkaError) -> None:
        self.report.failed[type(exc).__name__] += 1
        print(f"failed\t{at}\t{type(exc).__name__}", file=self.out)


async def redrive(
    settings: Settings, query: Query, *, dry_run: bool, out: TextIO, err: TextIO
) -> int:
    """``dlq redrive``: 0 when every selected record was sent or skipped, 1 when a send
    failed. A dry run writes nothing and opens no producer."""
    kafka = settings.kafka_config()
    partitions = await partition_counts(kafka, sorted(redrive_targets(settings)))
    producer = None if dry_run else build_producer(kafka, client_id="passkey-dlq")
    redriver = Redriver(producer, partitions, out=out)
    try:
        if producer is not None:
            await producer.start()
        counts = await _selected(kafka, query, redriver)
    finally:
        # what was sent is printed even when the scan failed half-way
        with contextlib.suppress(KafkaError):
            await redriver.flush()
        if producer is not None:
            await producer.stop()
    report = redriver.report
    for row in report.lines(dry_run=dry_run):
        print(row, file=err)
    print(_summary(query, counts, "selected"), file=err)
    if counts[2] and not dry_run:  # more records matched than the limit
        print(
            "a second run with the same filters sends these again: narrow it with --since",
            file=err,
        )
    return 1 if report.failed else 0


async def run(action: Awaitable[int], topic: str, err: TextIO) -> int:
    """Run the ``action`` of one ``dlq`` subcommand; a broker that cannot be reached or a topic
    that does not exist is a one-line error and exit status 1, not a traceback."""
    try:
        return await action
    except (KafkaError, OSError, LookupError, RuntimeError) as exc:
        message = str(exc).splitlines()[0][:300] if str(exc) else ""
        print(f"dlq: {topic}: {type(exc).__name__}: {message}", file=err)
        return 1
