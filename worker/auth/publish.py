"""Every write of the worker, acknowledged before the offset may be committed (a crash
replays; deterministic ids make the duplicates droppable), the state record on the command's
own partition number, re-sent through a Kafka outage (docs/architecture.md, "At-least-once
delivery and the dedup window"). The outputs of the commands that finish in one loop turn are
handed over together, states first, so their acknowledgement waits are shared
(docs/architecture.md, "Outputs sent per loop turn")."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord
from pydantic import BaseModel

from worker.auth.flow import Decision
from worker.contract.messages import AccountRecord, AuthError, Reply, encode_record
from worker.contract.topics import Topics
from worker.engine.dead_letter import dead_letter
from worker.engine.faults import Fault
from worker.engine.home_partition import FORWARDED_FROM
from worker.engine.outage import (
    BrokerHealth,
    Sent,
    acknowledged,
    enqueue,
    send_retrying,
)
from worker.runtime import tracing

#: One record to hand over: topic, key, value, partition (``None``: keyed) and headers.
_Record = tuple[str, bytes, bytes, int | None, list[tuple[str, bytes]]]


@dataclass(slots=True)
class _Outputs:
    """One ``publish`` call's records in their order: ``first`` handed over in the turn's
    first round, ``then`` only once every record of that round is acknowledged; ``done``
    is what the caller waits on (cancelled: the caller is gone, nothing more is sent)."""

    first: list[_Record]
    then: list[_Record]
    done: asyncio.Future[None]
    sent: list[Sent] = field(default_factory=list)

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


class Publisher:
    """All writes of the worker go through here; one producer, built in main."""

    def __init__(
        self, producer: AIOKafkaProducer, topics: Topics, health: BrokerHealth | None = None
    ) -> None:
        self._producer = producer
        self._topics = topics
        self._reply_partitions: frozenset[int] | None = None
        self.health = health or BrokerHealth()
        #: The outputs of this loop turn's ``publish`` calls, sent by one task in the next
        #: turn: at most one per command in flight (``WORKER_MAX_IN_FLIGHT``).
        self._turn: list[_Outputs] | None = None
        #: Turns being sent (the loop keeps only weak references to tasks).
        self._sending: set[asyncio.Task[None]] = set()

    async def _send(
        self,
        topic: str,
        key: str,
        value: bytes,
        *,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Sent:
        return await enqueue(
            self._producer,
            topic,
            value,
            key=key.encode(),
            partition=partition,
            headers=tracing.kafka_headers() if headers is None else headers,
        )

    async def _model(self, topic: str, key: str, model: BaseModel) -> Sent:
        return await self._send(topic, key, model.model_dump_json(exclude_none=False).encode())

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
        """Send the record (if it changed) and, once it is acknowledged, every other output;
        returns when all are acknowledged.

        The record first: a caller that was answered can read its write back from any
        front-end replica as soon as that replica's view has read this far (read-your-writes;
        docs/architecture.md, "Guarantees"), never find the reply ahead of the state. The
        records are handed over with those of every command that published in the same loop
        turn: the states of all first, one wait for their acks, then the rest, one wait.
        """
        headers = tracing.kafka_headers()
        state: list[_Record] = []
        if state_changed and decision.record is not None:
            record = decision.record
            state.append(
                (
                    self._topics.state,
                    record.account_id.encode(),
                    encode_record(record),
                    partition,
                    headers,
                )
            )
        rest: list[_Record] = []
        if decision.reply is not None:
            reply = decision.reply
            body = reply.model_dump_json(exclude_none=True).encode()
            target = await self._reply_partition(reply_to)
            rest.append((self._topics.replies, reply.account_id.encode(), body, target, headers))
        events = (
            (self._topics.status, decision.status_event),
            (self._topics.errors, decision.error_event),
        )
        for topic, event in events:
            if event is not None:
                body = event.model_dump_json(exclude_none=False).encode()
                rest.append((topic, event.account_id.encode(), body, None, headers))
        if not state and not rest:
            return
        # Only a reply needs its state acknowledged first; events go with the state.
        ordered = bool(state) and decision.reply is not None
        outputs = _Outputs(
            state if ordered else state + rest,
            rest if ordered else [],
            asyncio.get_running_loop().create_future(),
        )
        if self._turn is None:
            self._turn = []
            # A context of its own: the turn is no one command's (its log lines, its spans).
            task = asyncio.create_task(self._send_turn(), context=contextvars.Context())
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        self._turn.append(outputs)
        await outputs.done

    async def _send_turn(self) -> None:
        """Send the outputs gathered in the last loop turn (module docstring). A record that
        cannot be sent fails its own caller only."""
        turn, self._turn = self._turn or [], None
        try:
            await self._round(turn, first=True)
            await self._round([o for o in turn if o.then], first=False)
            for outputs in turn:
                if not outputs.done.done():
                    outputs.done.set_result(None)
        except asyncio.CancelledError:
            for outputs in turn:
                outputs.done.cancel()
            raise
        except Exception as exc:  # not a record's own failure: every caller's
            for outputs in turn:
                outputs.fail(exc)

    async def _round(self, turn: list[_Outputs], *, first: bool) -> None:
        """Hand over each caller's records of this round, then wait for all their acks."""
        live: list[_Outputs] = []
        for outputs in turn:
            outputs.sent = []
            if outputs.done.done():  # its caller was cancelled: nothing more is sent
                continue
            try:
                for topic, key, value, partition, headers in (
                    outputs.first if first else outputs.then
                ):
                    outputs.sent.append(
                        await enqueue(
                            self._producer,
                            topic,
                            value,
                            key=key,
                            partition=partition,
                            headers=headers,
                        )
                    )
            except Exception as exc:
                outputs.fail(exc)
            else:
                live.append(outputs)
        sent = [s for o in live for s in o.sent]
        futures = [s.future for s in sent if s.future is not None]
        if not sent:
            return
        if len(futures) == len(sent):
            results = await asyncio.gather(*futures, return_exceptions=True)
            if not any(isinstance(r, BaseException) for r in results):
                self.health.succeeded()
                return
        # Some failed: each caller's records re-sent or their error raised to it alone.
        await asyncio.gather(*(self._acked(o) for o in live))

    async def _acked(self, outputs: _Outputs) -> None:
        try:
            await acknowledged(self._producer, self.health, outputs.sent)
        except Exception as exc:
            outputs.fail(exc)

    async def _reply_partition(self, wanted: int | None) -> int | None:
        """``wanted`` when auth.replies has that partition; otherwise ``None`` (keyed): a
        sender's stale or bad header must not fail the command."""
        if wanted is None:
            return None
        if self._reply_partitions is None:
            self._reply_partitions = frozenset(
                await self._producer.partitions_for(self._topics.replies)
            )
        if wanted in self._reply_partitions:
            return wanted
        return None

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
            futures.append(
                await self._model(self._topics.errors, error_event.account_id, error_event)
            )
        if reply is not None:
            body = reply.model_dump_json(exclude_none=True).encode()
            target = await self._reply_partition(reply_to)
            futures.append(
                await self._send(self._topics.replies, reply.account_id, body, partition=target)
            )
        await acknowledged(self._producer, self.health, futures)
