"""Riding out a Kafka outage: each process's ``BrokerHealth`` knows when the cluster is
unreachable, writes are re-sent until acknowledged (safe: every record carries deterministic
ids), and past ``KAFKA_OUTAGE_TOLERANCE_S`` the process exits (docs/operations.md, "Kafka
outages")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiokafka.client import ConnectionGroup
from aiokafka.errors import (
    CorruptRecordException,
    InvalidMessageError,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from aiokafka.protocol.metadata import MetadataRequest
from prometheus_client import CollectorRegistry, Gauge

from worker.engine.faults import ProcessFault, RecordRejected
from worker.runtime.logs import get_logger

log = get_logger(__name__)

#: How often the monitor asks the cluster, and how long an answer may take.
PROBE_INTERVAL_S: Final = 2.0
PROBE_TIMEOUT_S: Final = 3.0
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
#: Pause before re-sending after a failed produce: doubling from the first to the last.
RESEND_BACKOFF_S: Final = (0.1, 1.0)

Probe = Callable[[], Awaitable[object]]


def is_outage(exc: BaseException) -> bool:
    """A Kafka error that a reachable, working cluster would not give: retried, never fatal.

    aiokafka flags these ``retriable`` (connection lost, node not ready, request timed out,
    leader not available or moved, coordinator moving); ``KafkaTimeoutError`` (a batch that
    could not be queued in time) is not flagged but means the same here.
    """
    return isinstance(exc, KafkaTimeoutError) or (
        isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))
    )


class BrokerOutageExceeded(ProcessFault):
    """The cluster has been unreachable for longer than the tolerance: the process ends."""


class BrokerHealth:
    """When the current outage began (``None``: the cluster answers), for one process."""

    def __init__(
        self,
        tolerance_s: float = 300.0,
        *,
        name: str = "process",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tolerance_s = tolerance_s
        self.name = name
        self._clock = clock
        self.outage_started: float | None = None
        self.outages = 0

    # -- what happened -------------------------------------------------------------------------

    def failed(self, error: BaseException | str, *, source: str = "produce") -> None:
        """A request failed for an outage reason: the outage begins now unless it already
        had."""
        if self.outage_started is None:
            self.outage_started = self._clock()
            self.outages += 1
            log.warning(
                "kafka_unreachable",
                process=self.name,
                source=source,
                error=error if isinstance(error, str) else repr(error),
                tolerance_s=self.tolerance_s,
            )

    def succeeded(self) -> None:
        """Any answer from the cluster ends the outage."""
        started = self.outage_started
        if started is not None:
            self.outage_started = None
            log.info(
                "kafka_reachable_again",
                process=self.name,
                outage_s=round(self._clock() - started, 3),
            )

    # -- what it means -------------------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        return self.outage_started is None

    def outage_seconds(self) -> float:
        """How long the current outage has lasted (0 while the cluster answers)."""
        started = self.outage_started
        return 0.0 if started is None else max(0.0, self._clock() - started)

    @property
    def exceeded(self) -> bool:
        return self.outage_started is not None and self.outage_seconds() >= self.tolerance_s

    def check(self) -> None:
        """Raise ``BrokerOutageExceeded`` (logged once, ``kafka_outage_exceeded``) past the
        tolerance."""
        if self.exceeded:
            outage_s = round(self.outage_seconds(), 1)
            log.error(
                "kafka_outage_exceeded",
                process=self.name,
                outage_s=outage_s,
                tolerance_s=self.tolerance_s,
                detail="Kafka unreachable for longer than KAFKA_OUTAGE_TOLERANCE_S; exiting so "
                "the orchestrator restarts the process",
            )
            raise BrokerOutageExceeded(
                f"Kafka unreachable for {outage_s} s (tolerance {self.tolerance_s:g} s)"
            )

    def export(self, registry: CollectorRegistry, prefix: str) -> None:
        """``<prefix>kafka_outage_seconds`` and ``<prefix>kafka_broker_reachable``, computed
        at scrape time."""
        Gauge(
            f"{prefix}kafka_outage_seconds",
            "Seconds the current Kafka outage has lasted (0: the cluster answers)",
            registry=registry,
        ).set_function(self.outage_seconds)
        Gauge(
            f"{prefix}kafka_broker_reachable",
            "1 while the Kafka cluster answers, 0 during an outage",
            registry=registry,
        ).set_function(lambda: 1.0 if self.reachable else 0.0)

    async def pause(self, attempt: int) -> None:
        """The wait before the ``attempt``-th re-send (0-based)."""
        low, high = RESEND_BACKOFF_S
        await asyncio.sleep(min(high, low * 2**attempt))

    # -- the probe -----------------------------------------------------------------------------

    async def monitor(self, probe: Probe, *, interval_s: float = PROBE_INTERVAL_S) -> None:
        """Probe the cluster every ``interval_s`` until cancelled; raises
        ``BrokerOutageExceeded`` once an outage outlasts the tolerance."""
        while True:
            try:
                await asyncio.wait_for(probe(), timeout=PROBE_TIMEOUT_S)
            except (KafkaError, TimeoutError, OSError) as exc:
                reason = (
                    "no answer within the probe timeout" if isinstance(exc, TimeoutError) else exc
                )
                self.failed(reason, source="probe")
            else:
                self.succeeded()
            self.check()
            await asyncio.sleep(interval_s)


def metadata_probe(client: Any, topic: str) -> Probe:
    """A metadata request for one topic through ``client`` (a started producer's
    ``AIOKafkaClient``), on the coordination connection group: a connection of its own, so
    the probe never queues behind produce requests and never breaks their connection."""
    request = MetadataRequest([topic], allow_auto_topic_creation=False)

    async def probe() -> None:
        node = client.get_random_node()
        if node is None:
            raise KafkaConnectionError("no broker known")
        await client.send(node, request, group=ConnectionGroup.COORDINATION)

    return probe


# -- producing through an outage -------------------------------------------------------------


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
        except _REJECTED as exc:
            raise RecordRejected("rejected", f"{type(exc).__name__} from {self.topic}") from exc
        except KafkaError as exc:
            if not is_outage(exc):
                raise
            health.failed(exc)
            return False
        health.succeeded()
        return True

    async def again(self, producer: Any) -> Sent:
        """Hand the same record to the producer once more."""
        return await enqueue(
            producer,
            self.topic,
            self.value,
            key=self.key,
            partition=self.partition,
            headers=self.headers,
            timestamp_ms=self.timestamp_ms,
        )


async def enqueue(
    producer: Any,
    topic: str,
    value: bytes | None,
    *,
    key: bytes | None,
    partition: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    timestamp_ms: int | None = None,
) -> Sent:
    """Hand one record to the producer (which keeps the order of hand-overs per partition)
    without waiting for the broker. A record over ``MAX_RECORD_BYTES``, or one the producer
    refuses as malformed, raises ``RecordRejected``: it fails its unit of work, never the
    process."""
    size = record_size(value, key, headers)
    if size > MAX_RECORD_BYTES:
        raise RecordRejected(
            "too_large", f"a record of {size} bytes for {topic}, limit {MAX_RECORD_BYTES}"
        )
    try:
        # A create time only where the record keeps one (a forward): the producer stamps others.
        stamp = {} if timestamp_ms is None else {"timestamp_ms": timestamp_ms}
        future = await producer.send(
            topic, value, key=key, partition=partition, headers=headers, **stamp
        )
    except _REJECTED as exc:
        raise RecordRejected("rejected", f"{type(exc).__name__} from {topic}") from exc
    except KafkaError as exc:
        if not is_outage(exc):
            raise
        return Sent(None, topic, value, key, partition, headers, exc, timestamp_ms)
    return Sent(future, topic, value, key, partition, headers, None, timestamp_ms)


def record_size(
    value: bytes | None, key: bytes | None, headers: Sequence[tuple[str, bytes]] | None
) -> int:
    """What a record weighs against ``MAX_RECORD_BYTES``."""
    extra = sum(len(k) + len(v) for k, v in headers) if headers else 0
    return len(value or b"") + len(key or b"") + extra


async def send_retrying(
    producer: Any,
    health: BrokerHealth,
    topic: str,
    value: bytes | None,
    *,
    key: bytes | None,
    partition: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    timestamp_ms: int | None = None,
) -> None:
    """Send one record and wait for its acknowledgement, sending it again after every outage
    error for as long as it takes: the process's ``monitor`` ends the process past the
    tolerance, and a caller with a deadline of its own bounds this with a time-out."""
    sent = await enqueue(
        producer,
        topic,
        value,
        key=key,
        partition=partition,
        headers=headers,
        timestamp_ms=timestamp_ms,
    )
    await _until_acked(producer, health, sent)


async def _until_acked(producer: Any, health: BrokerHealth, sent: Sent) -> None:
    """Wait for ``sent``, handing it over again after each outage error, with a pause."""
    attempt = 0
    while not await sent.acked(health):
        await health.pause(attempt)
        attempt += 1
        sent = await sent.again(producer)


async def acknowledged(producer: Any, health: BrokerHealth, sent: Sequence[Sent]) -> None:
    """Wait until every record of ``sent`` is acknowledged, re-sending those that failed for
    an outage reason (``send_retrying``).

    The acks are awaited one after another, not gathered: a unit's records mostly go out in
    one produce request, so the first wait is usually the only one that suspends, where a
    ``gather`` costs a future, a callback per record and a loop turn of its own (the worker
    waits twice per confirm).

    A record refused for itself (``RecordRejected``) does not stop the others: each is waited
    for (re-sent through outages), then the first error is raised, a refusal last."""
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
