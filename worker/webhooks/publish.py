"""Every write of the dispatcher: delivery states (the changelog), the delivery log the
front-end reads for ``GET .../deliveries``, and failed deliveries to the webhook DLQ.

Order of writes, so that a crash at any point loses nothing: a delivery's outcome (log entry,
DLQ copy) is acknowledged before the state that drops it from its queue; a crash in between
repeats the attempt under the same webhook-id. State records of one partition are handed to
the producer in the order they were stored (a FIFO lock per partition), so the changelog's
last record of an account is always the store's latest. Every record carries the current
span's trace context (``traceparent``/``tracestate`` headers, ``worker.tracing``).

While Kafka is unreachable every write is sent again until acknowledged (``worker.outage``);
a state record is re-sent as the store's latest record of its account, under the same lock,
so a late re-send never puts an older state after a newer one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Literal

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord
from pydantic import BaseModel, ConfigDict

from worker import tracing
from worker.faults import Fault
from worker.messages import rfc3339
from worker.outage import BrokerHealth, Sent, acknowledged, enqueue
from worker.publish import dead_letter
from worker.webhooks.delivery import Finished, Pending
from worker.webhooks.state import AccountDeliveries, DeliveryStore


class DeliveryLogEntry(BaseModel):
    """One state of one delivery on the delivery log (key: endpoint id; latest wins)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["webhook_delivery"] = "webhook_delivery"
    schema_version: Literal[1] = 1
    webhook_id: str
    endpoint_id: str
    workspace_id: str
    account_id: str
    event_type: str
    event_id: str
    version: int | None = None
    attempts: int
    state: Literal["pending", "delivered", "failed"]
    last_status: int | None = None
    last_error: str | None = None
    next_attempt_at: str | None = None
    updated_at: str
    replay: str | None = None


class Replay(BaseModel):
    """A ``POST .../replay`` request for one event and one endpoint (on the replay topic,
    key: account id, so it reaches the lane of the account like the event itself did)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["webhook_replay"] = "webhook_replay"
    schema_version: Literal[1] = 1
    replay_id: str
    endpoint_id: str
    workspace_id: str
    source: Literal["status", "errors"]
    event: str


def decode_replay(value: bytes) -> Replay:
    return Replay.model_validate_json(value)


class DeliveryPublisher:
    """The dispatcher's one producer, built at start-up."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        *,
        state_topic: str,
        log_topic: str,
        dlq_topic: str,
        health: BrokerHealth | None = None,
    ) -> None:
        self._producer = producer
        self._health = health or BrokerHealth()
        self._state_topic = state_topic
        self._log_topic = log_topic
        self._dlq_topic = dlq_topic
        self._locks: dict[int, asyncio.Lock] = {}

    async def persist(
        self, partition: int, record: AccountDeliveries, *, store: DeliveryStore
    ) -> None:
        """Store ``record`` and write it to its partition of the changelog; wait for the ack.
        The store is updated before the first await, so a caller that computed ``record``
        from the store's current one loses no concurrent change."""
        store.put(partition, record)
        await (await self.send_state(partition, record, store=store))

    async def send_state(
        self, partition: int, record: AccountDeliveries, *, store: DeliveryStore
    ) -> Awaitable[None]:
        """Hand a record already stored to the producer; returns what waits for its ack. Call
        it right after ``store.put``: the partition's FIFO lock keeps the changelog in the
        order of the puts. During an outage the wait re-sends the store's latest record of
        the account, under the same lock."""
        lock = self._locks.get(partition)
        if lock is None:
            lock = self._locks[partition] = asyncio.Lock()
        async with lock:
            sent = await self._enqueue_state(partition, record)
        return self._acked_state(sent, partition, record, store, lock)

    async def _enqueue_state(self, partition: int, record: AccountDeliveries) -> Sent:
        return await enqueue(
            self._producer,
            self._state_topic,
            record.model_dump_json().encode(),
            key=record.account_id.encode(),
            partition=partition,
            headers=tracing.kafka_headers(),
        )

    async def _acked_state(
        self,
        sent: Sent,
        partition: int,
        record: AccountDeliveries,
        store: DeliveryStore,
        lock: asyncio.Lock,
    ) -> None:
        attempt = 0
        while not await sent.acked(self._health):
            await self._health.pause(attempt)
            attempt += 1
            async with lock:
                latest = store.get(partition, record.account_id) or record
                sent = await self._enqueue_state(partition, latest)

    async def log_pending(
        self, record: AccountDeliveries, taken: list[tuple[str, Pending]], *, now: float
    ) -> None:
        entries = [
            self._entry(record, endpoint_id, d, "pending", d.next_attempt_at, now)
            for endpoint_id, d in taken
        ]
        await self._log(entries)

    async def log_retry(
        self, record: AccountDeliveries, endpoint_id: str, head: Pending, *, now: float
    ) -> None:
        entry = self._entry(record, endpoint_id, head, "pending", head.next_attempt_at, now)
        await self._log([entry])

    async def log_finished(
        self, record: AccountDeliveries, endpoint_id: str, head: Pending, finished: Finished
    ) -> None:
        done = head.model_copy(
            update={
                "attempts": finished.attempts,
                "last_status": finished.last_status,
                "last_error": finished.last_error,
            }
        )
        entry = self._entry(record, endpoint_id, done, finished.state, None, finished.finished_at)
        await self._log([entry])

    async def dead_letter(
        self, record: AccountDeliveries, endpoint_id: str, head: Pending, finished: Finished
    ) -> None:
        """The failed delivery's body, with why and where in headers."""
        headers = [
            ("webhook.id", head.webhook_id.encode()),
            ("webhook.endpoint", endpoint_id.encode()),
            ("webhook.event_type", head.event_type.encode()),
            ("webhook.attempts", str(finished.attempts).encode()),
            ("webhook.last_status", str(finished.last_status or "").encode()),
            ("webhook.last_error", (finished.last_error or "").encode()[:512]),
            *tracing.kafka_headers(),
        ]
        sent = await enqueue(
            self._producer,
            self._dlq_topic,
            head.body.encode(),
            key=record.account_id.encode(),
            headers=headers,
        )
        await acknowledged(self._producer, self._health, [sent])

    async def dead_letter_record(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        """An input record (an event, a replay) that could not be processed, to the DLQ as it
        came, with ``fault`` in its ``dlq.*`` headers; waits for the ack."""
        sent = await dead_letter(self._producer, self._dlq_topic, msg, fault)
        await acknowledged(self._producer, self._health, [sent])

    def _entry(
        self,
        record: AccountDeliveries,
        endpoint_id: str,
        delivery: Pending,
        state: Literal["pending", "delivered", "failed"],
        next_at: float | None,
        now: float,
    ) -> DeliveryLogEntry:
        return DeliveryLogEntry(
            webhook_id=delivery.webhook_id,
            endpoint_id=endpoint_id,
            workspace_id=record.workspace_id,
            account_id=record.account_id,
            event_type=delivery.event_type,
            event_id=delivery.event_id,
            version=delivery.version,
            attempts=delivery.attempts,
            state=state,
            last_status=delivery.last_status,
            last_error=delivery.last_error,
            next_attempt_at=None if next_at is None else rfc3339(next_at),
            updated_at=rfc3339(now),
            replay=delivery.replay,
        )

    async def _log(self, entries: list[DeliveryLogEntry]) -> None:
        sent = [
            await enqueue(
                self._producer,
                self._log_topic,
                e.model_dump_json().encode(),
                key=e.endpoint_id.encode(),
                headers=tracing.kafka_headers(),
            )
            for e in entries
        ]
        await acknowledged(self._producer, self._health, sent)
