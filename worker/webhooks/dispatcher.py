"""One unit of dispatcher work, run by the shared consume loop: take an event in (fan out to
each pair's queue, the event's offset held until each delivery is safe), attempt a due
delivery, or migrate an account's old one-record state (docs/architecture.md, "Webhook
fan-out"; its spans: docs/operations.md, "Tracing")."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from aiokafka.structs import ConsumerRecord

from worker.engine.faults import Fault
from worker.engine.offsets import hold_record
from worker.runtime import tracing
from worker.runtime.logs import get_logger
from worker.webhooks.delivery import (
    AttemptResult,
    DeliveryState,
    Pending,
    QueueLimits,
    Settled,
    carry_over,
    fail_head,
    marker,
    refused,
    remember,
    settle,
    state_key,
    take_in,
    webhook_id,
)
from worker.webhooks.delivery_store import DeliveryStore
from worker.webhooks.endpoint_gate import SWEEP_FLOOR, EndpointGate, GateConfig
from worker.webhooks.endpoints import EndpointRecord, EndpointRegistry
from worker.webhooks.events import WebhookEvent, from_error, from_status
from worker.webhooks.holds import EventHold
from worker.webhooks.instrumentation import (
    Attempted,
    DeadLettered,
    Incoming,
    Instrumentation,
    Migrated,
    Received,
    Refused,
    TakenIn,
    Undecodable,
)
from worker.webhooks.metrics import WebhookMetrics
from worker.webhooks.publish import (
    NOTE_ENDPOINT_DISABLED,
    DeliveryPublisher,
    Replay,
    decode_replay,
)
from worker.webhooks.sender import DeliveryResult, ErrorKind

log = get_logger(__name__)

REFUSED_ENDPOINT_FULL: Final = "endpoint_queue_full"
"""``last_error`` of a delivery refused because its endpoint has as many pending pairs in the
partition as ``QueueLimits.max_pairs_per_endpoint`` allows."""


class Sender(Protocol):
    """What the dispatcher needs of ``worker.webhooks.sender.Sender``."""

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult: ...


class Signer(Protocol):
    def __call__(
        self, secrets: Sequence[str], webhook_id: str, timestamp: int, body: bytes
    ) -> dict[str, str]: ...


class EndpointWriter(Protocol):
    """Disables endpoints (``EndpointStore``): the only endpoint write a dispatcher makes."""

    def signing_secrets(self, record: EndpointRecord) -> list[str]: ...

    async def disable(self, current: EndpointRecord, reason: str) -> EndpointRecord: ...


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    status_topic: str
    errors_topic: str
    replay_topic: str
    schedule: tuple[float, ...]
    disable_after_s: float
    limits: QueueLimits = field(default_factory=QueueLimits)
    gate: GateConfig = field(default_factory=GateConfig)
    attempt_hold_s: float = 30.0
    """Longer than one attempt can take (the sender's time-out and some)."""
    hold_s: float = 0.0
    """Take in without writing, holding the event's offset (``worker.webhooks.holds``); the
    loop's ``hold_overdue_s`` is this. 0: write each pair at take-in."""


class Dispatcher:
    """The seams in one place: take in (pure + write), attempt (HTTP), settle (pure + write)."""

    def __init__(
        self,
        *,
        store: DeliveryStore,
        endpoints: EndpointRegistry,
        writer: EndpointWriter,
        sender: Sender,
        sign: Signer,
        publisher: DeliveryPublisher,
        config: DispatchConfig,
        metrics: WebhookMetrics,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.endpoints = endpoints
        self._writer = writer
        self._sender = sender
        self._sign = sign
        self._publisher = publisher
        self.config = config
        self.metrics = metrics
        self._clock = clock
        self._rng = rng or random.Random()
        self._last_success: dict[str, float] = {}
        """When each endpoint last had a delivery succeed here: only endpoints still in the
        registry, within ``disable_after_s`` (``_succeeded``)."""
        self._success_sweep_at = SWEEP_FLOOR
        self._background: set[asyncio.Task[None]] = set()
        self.gate = EndpointGate(
            config.gate,
            wake=store.wake,
            metrics=metrics,
            rng=self._rng,
            known=self._known,
        )
        self._instrument = Instrumentation(metrics)

    # -- taking events in --------------------------------------------------------------------

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> list[str]:
        """Take one record in; returns the (endpoint, account) keys due at once."""
        with tracing.consume_span(msg):
            read = self._read(msg)
            return await self._instrument.run_record(msg, read, lambda: self._receive(msg, read))

    def _read(self, msg: ConsumerRecord[bytes, bytes]) -> Incoming | Undecodable:
        """The record's event and the endpoints it goes to: those of its workspace subscribed
        to its type, or a replay request's one endpoint (none when it is gone, or of another
        workspace than the event)."""
        replay: Replay | None = None
        try:
            if msg.topic == self.config.replay_topic:
                replay = decode_replay(msg.value or b"")
                event = (from_status if replay.source == "status" else from_error)(
                    replay.event.encode()
                )
            else:
                if msg.value is None:
                    raise ValueError("no value")
                decode = from_status if msg.topic == self.config.status_topic else from_error
                event = decode(msg.value)
        except Exception as exc:
            # Nothing can be delivered from it: to the DLQ as it came, never fatal.
            return Undecodable(type(exc).__name__, f"{type(exc).__name__}: {str(exc)[:200]}")
        if replay is not None:
            endpoint = self.endpoints.get(replay.workspace_id, replay.endpoint_id)
            if endpoint is None or event.workspace_id != replay.workspace_id:
                return Incoming(event, ())
            return Incoming(event, (endpoint,), replay.replay_id)
        if event.workspace_id is None:
            return Incoming(event, ())
        return Incoming(event, self.endpoints.subscribers(event.workspace_id, event.event_type))

    async def _receive(
        self, msg: ConsumerRecord[bytes, bytes], read: Incoming | Undecodable
    ) -> Received:
        if isinstance(read, Undecodable):
            await self._publisher.dead_letter_record(msg, Fault("undecodable", read.detail))
            return DeadLettered("undecodable")
        return await self._take_in(msg.partition, read.event, read.targets, replay=read.replay)

    # -- faults (worker.engine.consume_loop retried these first) --------------------------

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        """A record whose taking-in failed for good: to the DLQ as it came."""
        await self._instrument.run_record(msg, None, lambda: self._let_go(msg, fault))

    async def _let_go(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> DeadLettered:
        await self._publisher.dead_letter_record(msg, fault)
        return DeadLettered(fault.reason)

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        """A pair whose attempt keeps failing inside the dispatcher: its head delivery fails
        (to the DLQ and the delivery log, replayable), so the deliveries behind it go on. An
        old-form account record (a key without ``/``) is left for its next migration try."""
        if "/" not in key:
            return
        endpoint_id, _, _ = key.partition("/")
        self.gate.forget(endpoint_id, key, self._clock())
        state = self.store.pair(partition, key)
        head = None if state is None else state.head()
        if state is None or head is None:
            return
        await self._instrument.run_give_up(
            partition, state, head, lambda: self._fail_head(partition, key, state, head, fault)
        )

    async def _fail_head(
        self, partition: int, key: str, state: DeliveryState, head: Pending, fault: Fault
    ) -> Attempted:
        settled = fail_head(state, f"internal_error: {fault.exception}", now=self._clock())
        endpoint = self.endpoints.get(state.workspace_id, state.endpoint_id)
        await self._apply(partition, key, endpoint, settled, head)
        return Attempted(head, settled, endpoint)

    async def _take_in(
        self,
        partition: int,
        event: WebhookEvent,
        targets: Sequence[EndpointRecord],
        *,
        replay: str | None,
    ) -> TakenIn:
        workspace = event.workspace_id
        if not targets or workspace is None:
            return TakenIn()
        now = self._clock()
        traceparent, tracestate = tracing.current_traceparent()
        taken: list[tuple[DeliveryState, Pending]] = []
        full: list[tuple[DeliveryState, Pending]] = []
        crowded: list[tuple[DeliveryState, Pending]] = []
        for endpoint in targets:
            if endpoint.workspace_id != workspace:
                continue  # an event reaches its own workspace's endpoints only
            delivery = Pending(
                webhook_id=webhook_id(event.event_id, endpoint.id),
                event_type=event.event_type,
                event_id=event.event_id,
                version=event.version,
                body=event.body,
                occurred_at=event.occurred_at,
                enqueued_at=now,
                next_attempt_at=now,
                replay=replay,
                traceparent=traceparent,
                tracestate=tracestate,
            )
            pair = self._pair(partition, endpoint, event.account_id)
            if pair.idle and self._endpoint_full(partition, endpoint.id):
                crowded.append((pair, delivery))
                continue
            state, verdict = take_in(pair, delivery, self.config.limits)
            if verdict == "taken":
                taken.append((state, delivery))
            elif verdict == "full":
                full.append((state, delivery))
        if taken:
            # Stored before the first await: the pairs' lanes settle onto these states.
            for state, _ in taken:
                self.store.put(partition, state)
            held = self._hold(partition) if self.config.hold_s > 0 else None
            if held is None:
                await self._write_now(partition, [s.key for s, _ in taken])
            else:
                for state, delivery in taken:
                    self.store.unsaved.keep(partition, state.key, marker(delivery), held)
                # A delivery behind a head that waits (for its retry, or out a pause of its
                # endpoint) is not attempted soon: its pair is written now.
                late = [
                    state.key
                    for state, delivery in taken
                    if state.queue[0] is not delivery
                    and (
                        state.queue[0].next_attempt_at > now
                        or self.store.parked(partition, state.key)
                    )
                ]
                if late:
                    await self._write_now(partition, late)
        refused = await self._refuse(partition, full, now) if full else ()
        if crowded:
            refused = (*refused, *await self._refuse_new_pairs(partition, crowded, now))
        # Pairs whose new delivery is at the head are attempted at once: their first log entry
        # is the attempt's outcome. The others wait behind an earlier one: say so in the log.
        due: list[str] = []
        waiting: list[tuple[DeliveryState, Pending]] = []
        for state, delivery in taken:
            head = state.queue[0]
            if head.webhook_id == delivery.webhook_id and head.replay == delivery.replay:
                due.append(state.key)
            else:
                waiting.append((state, delivery))
        if waiting:
            await self._publisher.log_pending(waiting, now=now)
        return TakenIn(len(taken), refused, tuple(due))

    def _hold(self, partition: int) -> EventHold | None:
        """A hold on the event being taken in, shared by its deliveries; ``None`` outside
        the consume loop."""
        event_hold: EventHold | None = None

        def overdue() -> None:
            if event_hold is not None and not event_hold.released:
                self._spawn(self._write_overdue(event_hold))

        hold = hold_record(on_overdue=overdue)
        if hold is None:
            return None
        event_hold = EventHold(hold, partition)
        return event_hold

    def _spawn(self, work: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _write_overdue(self, event_hold: EventHold) -> None:
        """An event held too long (its endpoint hangs, or its pair waits behind one): write
        the pairs that still keep its deliveries in memory only, so its offset goes free."""
        partition = event_hold.partition
        keys = sorted(k for k in event_hold.keys if self.store.unsaved.has(partition, k))
        if not keys:
            return
        try:
            await self._write_now(partition, keys)
        except Exception as exc:  # the hold stays (not committed); the pair's next write frees it
            log.error("overdue_write_failed", pairs=len(keys), error=repr(exc)[:300])

    async def _write(self, partition: int, keys: Sequence[str]) -> Awaitable[None]:
        """``send_states`` that also makes the pairs' unsaved deliveries safe: what waits for
        the acks then releases their share of their events' holds."""
        taken = self.store.unsaved.take(partition, list(keys))
        try:
            written = await self._publisher.send_states(partition, keys, store=self.store)
        except BaseException:
            self.store.unsaved.put_back(partition, taken)
            raise
        if not taken:
            return written
        return self._released_when(written, partition, taken)

    async def _released_when(
        self,
        written: Awaitable[None],
        partition: int,
        taken: list[tuple[str, str, EventHold]],
    ) -> None:
        try:
            await written
        except BaseException:
            self.store.unsaved.put_back(partition, taken)
            raise
        for _, _, event_hold in taken:
            event_hold.done()

    async def _write_now(self, partition: int, keys: Sequence[str]) -> None:
        await (await self._write(partition, keys))

    async def _save_unsaved(self, partition: int, key: str) -> None:
        """The pair's lane stops working on it (its head is not due, or its endpoint has no
        room): what it keeps in memory only is written now."""
        if self.store.unsaved.has(partition, key):
            await self._write_now(partition, [key])

    def _pair(self, partition: int, endpoint: EndpointRecord, account_id: str) -> DeliveryState:
        """The pair's state, labelled with the endpoint's own workspace."""
        key = state_key(endpoint.id, account_id)
        state = self.store.pair(partition, key)
        if state is None:
            return DeliveryState(
                endpoint_id=endpoint.id, account_id=account_id, workspace_id=endpoint.workspace_id
            )
        if state.workspace_id != endpoint.workspace_id:
            return state.model_copy(update={"workspace_id": endpoint.workspace_id})
        return state

    async def _refuse(
        self, partition: int, full: list[tuple[DeliveryState, Pending]], now: float
    ) -> tuple[Refused, ...]:
        """Deliveries whose pair's queue is full fail at once: DLQ copy and log entry first,
        then the pair remembers them (a crash in between refuses them again, never loses
        the failure)."""
        for state, delivery in full:
            finished = refused(delivery, "queue_full", now=now)
            await self._publisher.dead_letter(state, delivery, finished)
            await self._publisher.log_finished(state, delivery, finished)
        for state, delivery in full:
            # Its queue may have drained meanwhile (its lane attempts while this one awaits):
            # a pair no longer held is idle, not the full one seen at take-in.
            current = self.store.pair(partition, state.key) or state.model_copy(
                update={"queue": (), "failing_since": None}
            )
            self.store.put(partition, remember(current, delivery))
        await self._write_now(partition, [state.key for state, _ in full])
        return tuple(
            Refused(state.endpoint_id, state.account_id, delivery.webhook_id, len(state.queue))
            for state, delivery in full
        )

    def _endpoint_full(self, partition: int, endpoint_id: str) -> bool:
        """The endpoint has as many pairs with something pending in ``partition`` as it may
        (``QueueLimits.max_pairs_per_endpoint``): no new pair of it is opened."""
        cap = self.config.limits.max_pairs_per_endpoint
        return self.store.pending_pairs(partition, endpoint_id) >= cap

    async def _refuse_new_pairs(
        self, partition: int, crowded: list[tuple[DeliveryState, Pending]], now: float
    ) -> tuple[Refused, ...]:
        """Deliveries that would open a pair past their endpoint's cap fail at once
        (``endpoint_queue_full``): DLQ copy and log entry, acknowledged. Nothing is kept or
        written for the pair: the same event read again after a crash is refused again under
        the same webhook-id (a second failure entry, never a lost one)."""
        for state, delivery in crowded:
            finished = refused(delivery, REFUSED_ENDPOINT_FULL, now=now)
            await self._publisher.dead_letter(state, delivery, finished)
            await self._publisher.log_finished(state, delivery, finished)
        return tuple(
            Refused(
                state.endpoint_id,
                state.account_id,
                delivery.webhook_id,
                self.store.pending_pairs(partition, state.endpoint_id),
                REFUSED_ENDPOINT_FULL,
            )
            for state, delivery in crowded
        )

    # -- attempting deliveries ---------------------------------------------------------------

    async def follow_up(self, partition: int, key: str) -> None:
        """Attempt the pair's due deliveries, head first, until one is not due or its endpoint
        has no room; a key without ``/`` is an old-form account record to migrate."""
        if "/" not in key:
            await self._instrument.run_migration(
                partition, key, lambda: self._migrate(partition, key)
            )
            return
        endpoint_id, _, _ = key.partition("/")
        self.store.unpark(partition, key)
        while True:
            state = self.store.pair(partition, key)
            head = None if state is None else state.head()
            now = self._clock()
            if state is None or head is None:
                self.gate.forget(endpoint_id, key, now)
                if self.store.stale(partition, key):
                    # Idle, its record on the changelog still holds deliveries (restored, or
                    # a write that was not handed to the producer): tombstone it.
                    await self._write_now(partition, [key])
                return
            if head.next_attempt_at > now:
                self.store.put(partition, state)  # re-arm at the head's own time
                await self._save_unsaved(partition, key)
                return
            endpoint = self.endpoints.get(state.workspace_id, endpoint_id)
            active = endpoint is not None and endpoint.status == "active"
            if endpoint is not None and active:
                admission = self.gate.admit(
                    endpoint.id,
                    revision=endpoint.revision,
                    rate_limit=endpoint.rate_limit,
                    partition=partition,
                    key=key,
                    now=now,
                    workspace_id=endpoint.workspace_id,
                )
                if not admission.admitted:
                    self.store.defer(partition, key, admission.until)
                    if admission.reason != "capacity":
                        # A pause (back-off, Retry-After, rate limit): written now. A wait
                        # for a slot ends when an attempt ends, at a busy endpoint within
                        # milliseconds; one that lasts (a hanging endpoint) is written when
                        # its events' holds are overdue.
                        self.store.park(partition, key)
                        await self._save_unsaved(partition, key)
                    return
            else:
                self.gate.forget(endpoint_id, key, now)
            await self._instrument.run_attempt(
                partition,
                state,
                head,
                functools.partial(self._attempt_head, partition, key, state, head, endpoint, now),
            )

    async def _attempt_head(
        self,
        partition: int,
        key: str,
        state: DeliveryState,
        head: Pending,
        endpoint: EndpointRecord | None,
        now: float,
    ) -> Attempted:
        """Attempt the head (its endpoint active), settle it, and write what it came to; an
        inactive or deleted endpoint's head fails without an attempt."""
        result: AttemptResult | None = None
        if endpoint is not None and endpoint.status == "active":
            # The head stays due while it is attempted: hold the pair's timer past the
            # attempt, or the loop's sweep would find it due (and its lane busy) on every
            # tick. The write after the attempt arms it from the new state.
            self.store.defer(partition, key, now + self.config.attempt_hold_s)
            try:
                result = await self._attempt(endpoint, head)
            finally:
                self.store.undefer(key)
                self.gate.release(
                    endpoint.id,
                    ok=None if result is None else result.ok,
                    now=self._clock(),
                    retry_after_s=None if result is None else _pause_asked(result),
                )
        state = self.store.pair(partition, key) or state
        now = self._clock()
        if result is None:
            reason = "endpoint_deleted" if endpoint is None else f"endpoint_{endpoint.status}"
            settled = fail_head(state, reason, now=now)
        else:
            settled = settle(state, result, now=now, schedule=self.config.schedule, rng=self._rng)
        await self._apply(partition, key, endpoint, settled, head)
        return Attempted(head, settled, endpoint, result)

    async def _migrate(self, partition: int, account_id: str) -> Migrated | None:
        """Write the pairs of an old-form account record, then tombstone its key."""
        legacy = self.store.legacy(partition, account_id)
        if legacy is None:
            return None
        keys = [
            key
            for endpoint_id in legacy.endpoints
            if self.store.pair(partition, key := state_key(endpoint_id, account_id)) is not None
        ]
        await self._write_now(partition, keys)
        await self._publisher.tombstone(partition, account_id)
        self.store.forget_legacy(partition, account_id)
        return Migrated(account_id, len(keys))

    async def _attempt(self, endpoint: EndpointRecord, head: Pending) -> AttemptResult:
        started = time.perf_counter()
        self.metrics.in_flight_attempts.inc()
        try:
            body = head.body.encode()
            secrets = self._writer.signing_secrets(endpoint)
            headers = {
                **self._sign(secrets, head.webhook_id, int(self._clock()), body),
                **tracing.http_headers(),
            }
            answer = await self._sender.post(endpoint.url, body, headers)
            error = None if answer.error is None else str(answer.error)
            result = AttemptResult(answer.status, error, answer.retry_after_s)
        except Exception as exc:
            # Whatever one attempt raises (an answer that broke the sender, a secret that does
            # not decrypt) fails that attempt, retried on the schedule; never the loop.
            log.error("webhook_attempt_crashed", endpoint_id=endpoint.id, error=type(exc).__name__)
            result = AttemptResult(None, str(ErrorKind.INTERNAL))
        finally:
            self.metrics.in_flight_attempts.dec()
        self.metrics.attempt(result, time.perf_counter() - started)
        return result

    async def _apply(
        self,
        partition: int,
        key: str,
        endpoint: EndpointRecord | None,
        settled: Settled,
        head: Pending,
    ) -> None:
        now = self._clock()
        state = settled.state
        finished = settled.finished
        if finished is not None and finished.state == "failed":
            # A failure's record (DLQ copy, log entry) is acknowledged before the state that
            # drops the delivery: a crash in between repeats the attempt under the same
            # webhook-id instead of losing the failure. It is counted from what the attempt came
            # to (``worker.webhooks.instrumentation``), after all this.
            await self._publisher.dead_letter(state, head, finished)
            await self._publisher.log_finished(state, head, finished)
        # The account's lane may have taken deliveries in meanwhile: carry the outcome over
        # onto the state as it is now, stored with no await in between.
        current = self.store.pair(partition, key) or state
        merged = carry_over(current, settled)
        unsaved = None
        if finished is not None and merged.failing_since == current.failing_since:
            # A delivery that was never written and is now settled: the changelog never had
            # it, so there is nothing to drop there. Its log entry (and DLQ copy) being
            # acknowledged makes it safe; then its event's hold is released.
            unsaved = self.store.unsaved.settled(partition, key, marker(head))
        self.store.put(partition, merged)  # an idle pair is dropped (``DeliveryState.idle``)
        if unsaved is not None and finished is not None:
            if finished.state == "delivered":
                self._succeeded(merged.endpoint_id, now)
                await self._publisher.log_finished(merged, head, finished)
            unsaved.done()
            if self.store.stale(partition, key):
                await self._write_now(partition, [key])  # its tombstone
            if endpoint is not None and endpoint.status == "active":
                await self._maybe_disable(endpoint, settled, now)
            return
        written = await self._write(partition, [key])
        if finished is None:
            # A retry or a delivery: its log entry only informs ``GET .../deliveries``, so it
            # goes out beside the state instead of before it.
            logged = self._publisher.log_retry(merged, merged.queue[0], now=now)
            await asyncio.gather(written, logged)
        elif finished.state == "delivered":
            self._succeeded(merged.endpoint_id, now)
            logged = self._publisher.log_finished(merged, head, finished)
            await asyncio.gather(written, logged)
        else:
            await written
        if endpoint is not None and endpoint.status == "active":
            await self._maybe_disable(endpoint, settled, now)

    def _known(self, endpoint_id: str) -> bool:
        """Whether the endpoint is in the registry (not deleted)."""
        return self.endpoints.workspace_of(endpoint_id) is not None

    def _succeeded(self, endpoint_id: str, now: float) -> None:
        """Note a success. A time older than ``disable_after_s`` weighs as none in
        ``_maybe_disable``, and a deleted endpoint's not at all: once the map has doubled since
        the last sweep (at least ``SWEEP_FLOOR``), both are swept out, so it holds at most
        about twice the endpoints of the registry."""
        self._last_success[endpoint_id] = now
        if len(self._last_success) <= self._success_sweep_at:
            return
        horizon = now - self.config.disable_after_s
        for held, at in list(self._last_success.items()):
            if at <= horizon or not self._known(held):
                del self._last_success[held]
        self._success_sweep_at = max(SWEEP_FLOOR, 2 * len(self._last_success))

    async def _maybe_disable(self, endpoint: EndpointRecord, settled: Settled, now: float) -> None:
        reason = None
        # Failing since the earliest evidence: the pair's own (kept in its record) or the
        # endpoint's as a whole (this process's attempts to any of its pairs).
        known = [
            t for t in (settled.state.failing_since, self.gate.failing_since(endpoint.id)) if t
        ]
        since = min(known) if known else None
        if settled.outcome == "gone":
            reason = "the endpoint answered 410 Gone"
        elif since is not None and now - since >= self.config.disable_after_s:
            last_ok = self._last_success.get(endpoint.id, 0.0)
            if now - last_ok >= self.config.disable_after_s:
                reason = f"failing for {self.config.disable_after_s / 86400:g} days"
        if reason is None:
            return
        try:
            await self._writer.disable(endpoint, reason)
        except Exception as exc:  # the next failure tries again; never fatal for a lane
            log.error("endpoint_disable_failed", endpoint_id=endpoint.id, error=repr(exc))
            return
        self.metrics.disabled.inc()
        log.warning(
            "endpoint_disabled",
            endpoint_id=endpoint.id,
            workspace_id=endpoint.workspace_id,
            reason=reason,
        )
        await self._publisher.log_note(
            endpoint_id=endpoint.id,
            workspace_id=endpoint.workspace_id,
            note=NOTE_ENDPOINT_DISABLED,
            detail=reason,
            now=now,
        )


def _pause_asked(result: AttemptResult) -> float | None:
    """A ``Retry-After`` on 429/503 pauses the whole endpoint, not just this pair."""
    return result.retry_after_s if result.status in (429, 503) else None


__all__ = ["DispatchConfig", "Dispatcher", "EndpointWriter", "Sender", "Signer"]
