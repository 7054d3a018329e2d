"""Every write of the dispatcher (delivery states, the delivery log, the webhook DLQ), ordered
so a crash at any point loses nothing: an outcome is acknowledged before the state that drops
it (docs/architecture.md, "Webhook fan-out")."""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from worker.contract.delivery_log import (
    LOG_BATCH_BYTES,
    LOG_BATCH_MAX,
    LOG_UNACKED_MAX,
    AttemptRecord,
    DeliveryLogBatch,
    DeliveryLogEntry,
)
from worker.contract.messages import rfc3339
from worker.dispatcher.delivery import DeliveryState, Finished, Pending
from worker.dispatcher.delivery_store import DeliveryStore
from worker.dispatcher.holds import EventHold
from worker.engine.broker_health import BrokerHealth
from worker.engine.compacted_view import Chores
from worker.engine.dead_letter import DeadLetterLost, dead_letter, hand_over
from worker.engine.faults import Fault, is_process_fault
from worker.engine.writes import Sent, acknowledged, enqueue
from worker.runtime import tracing
from worker.runtime.logs import get_logger

log = get_logger(__name__)


@dataclass(slots=True, eq=False)
class _LogBatch:
    """Entries of one endpoint waiting for their window to close, a future per writer that
    waits on them (a writer that is cancelled cancels its own wait, not the others'), and the
    event holds its successes' entries release once it is acknowledged (``log_success``)."""

    headers: list[tuple[str, bytes]]
    entries: list[DeliveryLogEntry] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    holds: list[EventHold] = field(default_factory=list)
    bytes: int = 0
    closed: bool = False

    def settle(self, exc: BaseException | None) -> None:
        """Release the holds once written; tell each writer still waiting how the batch's
        write ended. A failure is marked retrieved at once: a writer that stopped looking is
        not reported at collection."""
        if exc is None:
            for hold in self.holds:
                hold.done()
        for waiter in self.waiters:
            if waiter.done():
                continue  # its writer was cancelled
            if exc is None:
                waiter.set_result(None)
            elif isinstance(exc, asyncio.CancelledError):
                waiter.cancel()
            else:
                waiter.set_exception(exc)
                waiter.exception()


def _size(entry: DeliveryLogEntry) -> int:
    """About the bytes ``entry`` takes in a record: its body and excerpt, and the rest."""
    excerpt = entry.attempt.response_excerpt if entry.attempt is not None else None
    return len(entry.body or "") + 2 * len(excerpt or "") + 1024


async def _all(waits: list[asyncio.Future[None]]) -> None:
    await asyncio.gather(*waits)


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
        on_state: Callable[[int], None] | None = None,
        log_flush_s: float = 0.0,
    ) -> None:
        """``on_state`` is told the size in bytes of every state record written;
        ``log_flush_s`` is the delivery log's window (0: one record per entry)."""
        self._producer = producer
        self._health = health or BrokerHealth()
        self._state_topic = state_topic
        self._log_topic = log_topic
        self._dlq_topic = dlq_topic
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._on_state = on_state
        self._log_flush_s = log_flush_s
        self._log_open: dict[str, _LogBatch] = {}
        self._log_lock = asyncio.Lock()
        self._log_sends = Chores("delivery-log")
        self._unacked = 0
        """Successes' entries not yet acknowledged, that no writer waits for."""
        self._fault: BaseException | None = None
        """A process fault a log write nobody waited for met: raised by the next one."""

    async def send_states(
        self, partition: int, keys: Sequence[str], *, store: DeliveryStore
    ) -> Awaitable[None]:
        """Hand the store's latest state of each pair in ``keys`` to the producer (a
        tombstone for a pair that went idle, ``DeliveryStore.stale``); returns what waits for
        the acks. Call it after ``store.put``. During an outage the wait re-sends the store's
        latest states, under the same lock."""
        lock = self._locks[partition]
        async with lock:
            sent = [await self._enqueue_state(partition, key, store) for key in keys]
        return self._acked_states(sent, partition, keys, store, lock)

    async def tombstone(self, partition: int, key: str) -> None:
        """Delete ``key`` from the changelog (an old-form account record once migrated);
        wait for the ack."""
        async with self._locks[partition]:
            sent = await self._send_state(partition, key, None)
        await acknowledged(self._producer, self._health, [sent])

    async def _enqueue_state(
        self, partition: int, key: str, store: DeliveryStore, *, resend: bool = False
    ) -> Sent | None:
        """The pair's latest state, or a tombstone when it is idle (dropped from the store)
        and its record on the changelog still holds deliveries (or, on a ``resend``, when
        the tombstone is what was sent); nothing when the changelog has nothing to drop."""
        if not store.owns(partition):  # revoked meanwhile: the next owner writes it
            return None
        state = store.pair(partition, key)
        value = None if state is None else state.model_dump_json().encode()
        if value is None and not (resend or store.live(partition, key)):
            return None  # idle, never written (or tombstoned already)
        store.written(partition, key, value=value is not None)
        if value is not None and self._on_state is not None:
            self._on_state(len(value))
        return await self._send_state(partition, key, value)

    async def _send_state(self, partition: int, key: str, value: bytes | None) -> Sent:
        return await enqueue(
            self._producer,
            self._state_topic,
            value,
            key=key.encode(),
            partition=partition,
            headers=tracing.kafka_headers(),
        )

    async def _acked_states(
        self,
        sent: list[Sent | None],
        partition: int,
        keys: Sequence[str],
        store: DeliveryStore,
        lock: asyncio.Lock,
    ) -> None:
        for i, one in enumerate(sent):
            attempt = 0
            while one is not None and not await one.acked(self._health):
                await self._health.pause(attempt)
                attempt += 1
                async with lock:
                    one = await self._enqueue_state(partition, keys[i], store, resend=True)

    def log_pending(
        self, taken: list[tuple[DeliveryState, Pending]], *, now: float
    ) -> Awaitable[None]:
        return self.logging([self._entry(state, d, now) for state, d in taken])

    def log_retry(
        self,
        state: DeliveryState,
        head: Pending,
        *,
        now: float,
        attempt: AttemptRecord | None = None,
    ) -> Awaitable[None]:
        return self.logging([self._entry(state, head, now, attempt)])

    def log_finished(
        self,
        state: DeliveryState,
        head: Pending,
        finished: Finished,
        *,
        attempt: AttemptRecord | None = None,
    ) -> Awaitable[None]:
        return self.logging([self._entry(state, head, finished.finished_at, attempt, finished)])

    def log_success(
        self,
        state: DeliveryState,
        head: Pending,
        finished: Finished,
        hold: EventHold,
        *,
        attempt: AttemptRecord | None = None,
    ) -> Awaitable[None] | None:
        """The entry of a delivery settled in memory only (never written to its pair), put
        in its window with the event ``hold`` its acknowledgement releases: nobody waits for
        it (``None``), unless ``LOG_UNACKED_MAX`` such entries are under way, then what it
        returns waits for its window's record. Without windows, what it returns writes it
        and releases the hold. ``flush`` waits for them all."""
        if self._fault is not None:
            raise self._fault
        entry = self._entry(state, head, finished.finished_at, attempt, finished)
        if self._log_flush_s <= 0:
            return self._written_then(entry, hold)
        batch = self._window(entry)
        batch.holds.append(hold)
        self._unacked += 1
        if self._unacked <= LOG_UNACKED_MAX:
            return None
        wait = asyncio.get_running_loop().create_future()
        batch.waiters.append(wait)
        return wait

    async def _written_then(self, entry: DeliveryLogEntry, hold: EventHold) -> None:
        await self._log_each([entry])
        hold.done()

    async def flush(self) -> None:
        """Send every open window now and wait for every log record under way: what the
        consume loop waits for, after its lanes, before it commits (a revocation, a stop).
        Raises the fault a write nobody waited for met, if any."""
        for endpoint_id, batch in list(self._log_open.items()):
            self._close_log(endpoint_id, batch)
        await self._log_sends.settled()
        if self._fault is not None:
            raise self._fault

    async def log_note(
        self, *, endpoint_id: str, workspace_id: str, note: str, detail: str, now: float
    ) -> None:
        """A note about the endpoint itself in its delivery log (``NOTE_ENDPOINT_DISABLED``):
        shown by ``GET .../deliveries`` like a failed delivery of that event type."""
        note_id = f"note_{note}_{int(now * 1000)}"
        entry = DeliveryLogEntry(
            webhook_id=note_id,
            endpoint_id=endpoint_id,
            workspace_id=workspace_id,
            account_id="",
            event_type=note,
            event_id=note_id,
            attempts=0,
            state="failed",
            last_error=detail[:200],
            updated_at=rfc3339(now),
        )
        await self.log([entry])

    async def dead_letter(self, state: DeliveryState, head: Pending, finished: Finished) -> None:
        """The failed delivery's body, with why and where in headers."""
        headers = [
            ("webhook.id", head.webhook_id.encode()),
            ("webhook.endpoint", state.endpoint_id.encode()),
            ("webhook.event_type", head.event_type.encode()),
            ("webhook.attempts", str(finished.attempts).encode()),
            ("webhook.last_status", str(finished.last_status or "").encode()),
            ("webhook.last_error", (finished.last_error or "").encode()[:512]),
            *tracing.kafka_headers(),
        ]
        body = head.body.encode()
        key = state.account_id.encode()
        # Refused for its size (a DLQ topic with a small max.message.bytes): the letter again
        # without the body, its size and digest in its place; refused even so, it is logged
        # and the failure stands in the delivery log (docs/architecture.md, "Failure handling").
        minimal = [
            *headers,
            ("webhook.body_bytes", str(len(body)).encode()),
            ("webhook.body_sha256", hashlib.sha256(body).hexdigest().encode()),
        ]
        sent = await hand_over(
            self._producer, self._dlq_topic, (key, body, headers), (key, None, minimal)
        )
        try:
            await acknowledged(self._producer, self._health, [sent])
        except DeadLetterLost as exc:
            log.error(
                "webhook_dead_letter_lost",
                webhook_id=head.webhook_id,
                endpoint_id=state.endpoint_id,
                error=exc.detail,
            )

    async def dead_letter_record(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        """An input record (an event, a replay) that could not be processed, to the DLQ as it
        came, with ``fault`` in its ``dlq.*`` headers; waits for the ack."""
        sent = await dead_letter(self._producer, self._dlq_topic, msg, fault)
        await acknowledged(self._producer, self._health, [sent])

    def _entry(
        self,
        state: DeliveryState,
        delivery: Pending,
        now: float,
        attempt: AttemptRecord | None = None,
        finished: Finished | None = None,
    ) -> DeliveryLogEntry:
        """The entry of ``delivery`` pending (due at its next attempt), or as ``finished`` left
        it (its attempts and last answer)."""
        last = delivery if finished is None else finished
        return DeliveryLogEntry(
            webhook_id=delivery.webhook_id,
            endpoint_id=state.endpoint_id,
            workspace_id=state.workspace_id,
            account_id=state.account_id,
            event_type=delivery.event_type,
            event_id=delivery.event_id,
            version=delivery.version,
            attempts=last.attempts,
            state="pending" if finished is None else finished.state,
            last_status=last.last_status,
            last_error=last.last_error,
            next_attempt_at=None if finished is not None else rfc3339(delivery.next_attempt_at),
            updated_at=rfc3339(now),
            replay=delivery.replay,
            attempt=attempt,
            body=delivery.body,
            occurred_at=delivery.occurred_at,
        )

    async def log(self, entries: list[DeliveryLogEntry]) -> None:
        """Write ``entries`` (in their window's record, if batching); wait for the acks. Also
        the prober's way to log a probe as an attempt of its own."""
        await self.logging(entries)

    def logging(self, entries: list[DeliveryLogEntry]) -> Awaitable[None]:
        """``log``, the entries put in their window at once when batching: what it returns
        waits for the acks, beside another write, with no task of its own."""
        if self._log_flush_s > 0:
            waits = self._batched(entries)
            return waits[0] if len(waits) == 1 else _all(waits)
        return self._log_each(entries)

    async def _log_each(self, entries: list[DeliveryLogEntry]) -> None:
        sent = [await self._send_log(e.endpoint_id, e, tracing.kafka_headers()) for e in entries]
        await acknowledged(self._producer, self._health, sent)

    async def _send_log(
        self,
        endpoint_id: str,
        record: DeliveryLogEntry | DeliveryLogBatch,
        headers: list[tuple[str, bytes]],
    ) -> Sent:
        return await enqueue(
            self._producer,
            self._log_topic,
            record.model_dump_json().encode(),
            key=endpoint_id.encode(),
            headers=headers,
        )

    def _batched(self, entries: list[DeliveryLogEntry]) -> list[asyncio.Future[None]]:
        """Put ``entries`` in their endpoints' open windows; this writer's wait on each window
        (a batch closed here is sent by a task not yet started, so its waiters are all in)."""
        loop = asyncio.get_running_loop()
        batches: list[_LogBatch] = []
        for entry in entries:
            batch = self._window(entry)
            if batch not in batches:  # compared by identity (eq=False)
                batches.append(batch)
        waits = [loop.create_future() for _ in batches]
        for batch, wait in zip(batches, waits, strict=True):
            batch.waiters.append(wait)
        return waits

    def _window(self, entry: DeliveryLogEntry) -> _LogBatch:
        """The open window ``entry`` was put in (closed at once if it is full now: sent by a
        task not yet started, so what its caller adds to it goes with it)."""
        endpoint_id = entry.endpoint_id
        batch = self._log_open.get(endpoint_id)
        if batch is None:
            batch = self._log_open[endpoint_id] = _LogBatch(tracing.kafka_headers())
            asyncio.get_running_loop().call_later(
                self._log_flush_s, self._close_log, endpoint_id, batch
            )
        batch.entries.append(entry)
        batch.bytes += _size(entry)
        if len(batch.entries) >= LOG_BATCH_MAX or batch.bytes >= LOG_BATCH_BYTES:
            self._close_log(endpoint_id, batch)
        return batch

    def _close_log(self, endpoint_id: str, batch: _LogBatch) -> None:
        """The window closed (or the batch is full): send it, once."""
        if batch.closed:
            return
        batch.closed = True
        if self._log_open.get(endpoint_id) is batch:
            del self._log_open[endpoint_id]
        self._log_sends.quietly(self._send_batch(endpoint_id, batch))

    async def _send_batch(self, endpoint_id: str, batch: _LogBatch) -> None:
        try:
            record: DeliveryLogEntry | DeliveryLogBatch = (
                batch.entries[0]
                if len(batch.entries) == 1
                else DeliveryLogBatch(endpoint_id=endpoint_id, entries=tuple(batch.entries))
            )
            # Handed to the producer in the order the windows closed (the lock is FIFO), so
            # one endpoint's records keep their order.
            async with self._log_lock:
                sent = await self._send_log(endpoint_id, record, batch.headers)
            await acknowledged(self._producer, self._health, [sent])
        except BaseException as exc:
            batch.settle(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            if batch.holds:
                # Their events stay uncommitted (read again, delivered again under the same
                # webhook-id); a fault of the process is raised by the next write.
                log.error("delivery_log_write_failed", entries=len(batch.holds), error=repr(exc))
                if is_process_fault(exc):
                    self._fault = exc
        else:
            batch.settle(None)
        finally:
            self._unacked -= len(batch.holds)
