"""Every write of the worker, acknowledged before the offset may be committed (docs/architecture.md,
"At-least-once delivery and the dedup window")."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from worker.auth.flow import Decision
from worker.contract.messages import AccountRecord, AuthError, Reply, encode_record
from worker.contract.topics import Topics
from worker.engine.broker_health import BrokerHealth
from worker.engine.dead_letter import dead_letter
from worker.engine.faults import Fault
from worker.engine.home_partition import FORWARDED_FROM
from worker.engine.writes import Sent, acknowledged, enqueue, send_retrying
from worker.runtime import tracing


@dataclass(slots=True)
class Output:
    """What one decision publishes: its record when ``state_changed``, its reply (to partition
    ``reply_to`` of auth.replies when it has it) and events, with trace ``headers`` (``None``:
    the current context's)."""

    decision: Decision
    state_changed: bool
    reply_to: int | None = None
    headers: list[tuple[str, bytes]] | None = None


class Publisher:
    """All writes of the worker; one producer, built by the composition root."""

    def __init__(
        self, producer: AIOKafkaProducer, topics: Topics, health: BrokerHealth | None = None
    ) -> None:
        self._producer = producer
        self._topics = topics
        self._reply_partitions: frozenset[int] | None = None
        self.health = health or BrokerHealth()

    def _send(
        self,
        topic: str,
        key: str,
        value: bytes,
        *,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Awaitable[Sent]:
        """``enqueue``'s own coroutine, not one around it: a frame fewer per record."""
        return enqueue(
            self._producer,
            topic,
            value,
            key=key.encode(),
            partition=partition,
            headers=tracing.kafka_headers() if headers is None else headers,
        )

    async def persist(self, partition: int, record: AccountRecord) -> None:
        """Write one state record and wait for the ack (an intent left unsettled)."""
        await send_retrying(
            self._producer,
            self.health,
            self._topics.state,
            encode_record(record),
            key=record.account_id.encode(),
            partition=partition,
            headers=tracing.kafka_headers(),
        )

    async def publish(
        self,
        partition: int,
        decision: Decision,
        *,
        state_changed: bool,
        reply_to: int | None = None,
    ) -> None:
        """One decision's outputs (``publish_all``)."""
        await self.publish_all(partition, [Output(decision, state_changed, reply_to)])

    async def publish_all(self, partition: int, outputs: Sequence[Output]) -> None:
        """The changed records of ``outputs`` acknowledged first, under one wait, then every
        reply and event under one more: an answered caller never finds the reply ahead of the
        state (read-your-writes; docs/architecture.md). With no reply, one wait for all."""
        futures: list[Sent] = []
        state = self._topics.state
        for out in outputs:
            if out.headers is None:
                out.headers = tracing.kafka_headers()  # the last answer reused: cheap again
            if out.state_changed and (record := out.decision.record) is not None:
                futures.append(
                    await self._send(
                        state,
                        record.account_id,
                        encode_record(record),
                        partition=partition,
                        headers=out.headers,
                    )
                )
        if futures and any(out.decision.reply is not None for out in outputs):
            await acknowledged(self._producer, self.health, futures)
            futures = []
        for out in outputs:
            decision, headers = out.decision, out.headers
            if decision.reply is not None:
                futures.append(await self._reply(decision.reply, out.reply_to, headers))
            for topic, event in (
                (self._topics.status, decision.status_event),
                (self._topics.errors, decision.error_event),
            ):
                if event is not None:
                    body = event.model_dump_json().encode()
                    futures.append(await self._send(topic, event.account_id, body, headers=headers))
        await acknowledged(self._producer, self.health, futures)

    async def answer(self, answers: Sequence[tuple[Decision, int | None]]) -> None:
        """Queries' replies (each to its ``reply-partition``), all handed over before one
        acknowledgement wait: a slot's time-outs leave together (docs/architecture.md,
        "Long-polls")."""
        headers = tracing.kafka_headers()
        sent = [await self._reply(d.reply, to, headers) for d, to in answers if d.reply]
        await acknowledged(self._producer, self.health, sent)

    async def _reply(
        self, reply: Reply, wanted: int | None, headers: list[tuple[str, bytes]] | None = None
    ) -> Sent:
        """``reply`` to partition ``wanted`` when auth.replies has it; otherwise keyed: a
        sender's stale or bad header must not fail the command."""
        if wanted is not None and self._reply_partitions is None:
            self._reply_partitions = frozenset(
                await self._producer.partitions_for(self._topics.replies)
            )
        target = wanted if wanted in (self._reply_partitions or ()) else None
        body = reply.model_dump_json(exclude_none=True).encode()
        return await self._send(
            self._topics.replies, reply.account_id, body, partition=target, headers=headers
        )

    async def forward(self, msg: ConsumerRecord[bytes, bytes], partition: int) -> None:
        """Re-produce a command unchanged to ``partition`` of its own topic, with a header
        naming the original, and wait for the ack: the forward is the record's only output."""
        headers = [
            *msg.headers,
            (FORWARDED_FROM, f"{msg.topic}:{msg.partition}:{msg.offset}".encode()),
        ]
        await send_retrying(
            self._producer,
            self.health,
            msg.topic,
            msg.value,
            key=msg.key,
            partition=partition,
            headers=headers,
            timestamp_ms=msg.timestamp if msg.timestamp_type == 0 else None,
        )

    async def dead_letter(
        self,
        msg: ConsumerRecord[bytes, bytes],
        fault: Fault,
        *,
        error_event: AuthError | None,
        reply: Reply | None = None,
        reply_to: int | None = None,
    ) -> None:
        """The original record to the DLQ (its key, value and headers, then the fault's
        ``dlq.*`` headers), plus the error event and the waiting caller's reply when the
        record's ids could be read; returns once all are acknowledged."""
        futures = [await dead_letter(self._producer, self._topics.dlq, msg, fault)]
        if error_event is not None:
            body = error_event.model_dump_json().encode()
            futures.append(await self._send(self._topics.errors, error_event.account_id, body))
        if reply is not None:
            futures.append(await self._reply(reply, reply_to))
        await acknowledged(self._producer, self.health, futures)
