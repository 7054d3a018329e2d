"""The write path: every record handed to the producer is re-sent until acknowledged through an
outage (safe: every record carries deterministic ids), and a record refused for itself fails
its own unit of work, never the process (docs/operations.md, "Kafka outages")."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Required, TypedDict, Unpack

from aiokafka.errors import (
    CorruptRecordException,
    InvalidMessageError,
    InvalidTimestampError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)

from worker.engine.broker_health import BrokerHealth, is_outage
from worker.engine.faults import RecordRejected

#: The largest record (value, key and headers) any process writes: below the producer's
#: ``max_request_size`` (aiokafka's default, 1 MiB) with room for the batch's framing. Checked
#: before producing, so no caller, and no tenant, can make a write fail at the broker.
MAX_RECORD_BYTES: Final = 1_000_000
#: Errors that say the record itself is wrong: sending it again fails again. The broker's
#: answer for a record over the topic's ``max.message.bytes`` is ``MessageSizeTooLargeError``
#: (aiokafka fails the batch's futures with it), as is the producer's own refusal.
_REJECTED: Final = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidMessageError,
    InvalidTimestampError,
)


@dataclass(slots=True)
class Sent:
    """One record handed to the producer: its delivery future (``None`` when the hand-over
    itself failed for an outage reason) and what it takes to send it again."""

    future: asyncio.Future[Any] | None
    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None = None
    headers: list[tuple[str, bytes]] | None = None
    error: BaseException | None = None
    timestamp_ms: int | None = None

    async def acked(self, health: BrokerHealth) -> bool:
        """Wait for the broker: ``True`` once acknowledged, ``False`` after an outage error
        (recorded in ``health``): hand it over ``again``. A refusal of the record itself is
        ``RecordRejected`` (a dead letter's answers False instead and is sent again in its
        minimal form, ``worker.engine.dead_letter.LetterSent``); any other error is raised."""
        if self.future is None:
            health.failed(self.error or "send failed")
            return False
        try:
            await self.future
        except KafkaError as exc:
            health.failed(_outage(exc, self.topic))
            return False
        health.succeeded()
        return True

    async def again(self, producer: Any) -> Sent:
        """Hand the same record to the producer once more."""
        options = RecordOptions(
            key=self.key,
            partition=self.partition,
            headers=self.headers,
            timestamp_ms=self.timestamp_ms,
        )
        return await enqueue(producer, self.topic, self.value, **options)


class RecordOptions(TypedDict, total=False):
    """A record's key (required), partition (unset: the producer's by key), headers and create
    time (only where the record keeps one, a forward: the producer stamps others)."""

    key: Required[bytes | None]
    partition: int | None
    headers: list[tuple[str, bytes]] | None
    timestamp_ms: int | None


async def enqueue(
    producer: Any, topic: str, value: bytes | None, **options: Unpack[RecordOptions]
) -> Sent:
    """Hand one record to the producer (which keeps the order of hand-overs per partition)
    without waiting for the broker. A record over ``MAX_RECORD_BYTES``, or one the producer
    refuses as malformed, raises ``RecordRejected``: it fails its unit of work, never the
    process."""
    key, headers = options["key"], options.get("headers")
    partition, stamp = options.get("partition"), options.get("timestamp_ms")
    size = record_size(value, key, headers)
    if size > MAX_RECORD_BYTES:
        raise RecordRejected(
            "too_large", f"a record of {size} bytes for {topic}, limit {MAX_RECORD_BYTES}"
        )
    stamped = {} if stamp is None else {"timestamp_ms": stamp}
    try:
        future = await producer.send(
            topic, value, key=key, partition=partition, headers=headers, **stamped
        )
    except KafkaError as exc:
        return Sent(None, topic, value, key, partition, headers, _outage(exc, topic), stamp)
    return Sent(future, topic, value, key, partition, headers, None, stamp)


def _outage(exc: KafkaError, topic: str) -> KafkaError:
    """``exc`` when it is an outage error (the record is sent again); a refusal of the record
    itself raises ``RecordRejected``, any other error is raised as it is. Not a coroutine
    around the send: one frame fewer on every record's path."""
    if isinstance(exc, _REJECTED):
        raise RecordRejected("rejected", f"{type(exc).__name__} from {topic}") from exc
    if not is_outage(exc):
        raise exc
    return exc


def record_size(
    value: bytes | None, key: bytes | None, headers: Sequence[tuple[str, bytes]] | None
) -> int:
    """What a record weighs against ``MAX_RECORD_BYTES`` (a loop: cheaper than a generator)."""
    size = len(value or b"") + len(key or b"")
    for name, header in headers or ():
        size += len(name) + len(header)
    return size


async def send_retrying(
    producer: Any,
    health: BrokerHealth,
    topic: str,
    value: bytes | None,
    **options: Unpack[RecordOptions],
) -> None:
    """Send one record and wait for its acknowledgement, sending it again after every outage
    error for as long as it takes: the process's ``monitor`` ends the process past the
    tolerance, and a caller with a deadline of its own bounds this with a time-out."""
    await _until_acked(producer, health, await enqueue(producer, topic, value, **options))


async def _until_acked(producer: Any, health: BrokerHealth, sent: Sent) -> None:
    """Wait for ``sent``, handing it over again after each outage error, with a pause."""
    attempt = 0
    while not await sent.acked(health):
        await health.pause(attempt)
        attempt += 1
        sent = await sent.again(producer)


async def acknowledged(producer: Any, health: BrokerHealth, sent: Sequence[Sent]) -> None:
    """Wait until every record of ``sent`` is acknowledged, re-sending those that failed for
    an outage reason. Awaited one by one, not gathered: a unit's records mostly share one
    produce request, so only the first wait suspends. A record refused for itself does not
    stop the others; the first error is raised once all are done, a refusal last."""
    if not sent:
        return
    failed = False
    for s in sent:
        if s.future is None:
            failed = True
            continue
        try:
            await s.future
        except Exception:  # examined below, record by record, once all were waited for
            failed = True
    if not failed:
        health.succeeded()
        return
    retry: list[Sent] = []
    refusals: list[BaseException] = []
    for s in sent:
        try:
            if not await s.acked(health):
                retry.append(s)
        except RecordRejected as exc:
            refusals.append(exc)
    # Handed over again at once, in their order; pauses only between later attempts.
    again = []
    for s in retry:
        try:
            again.append(await s.again(producer))
        except RecordRejected as exc:
            refusals.append(exc)
    ends = await asyncio.gather(
        *(_until_acked(producer, health, s) for s in again), return_exceptions=True
    )
    failures = [e for e in ends if isinstance(e, BaseException)]
    # Anything but a refusal (a process fault) first: it must not hide behind a refusal.
    errors = [*(e for e in failures if not isinstance(e, RecordRejected)), *refusals, *failures]
    if errors:
        raise errors[0]
