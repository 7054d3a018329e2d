"""One unit of dispatcher work, run by the shared consume loop: take an event in (fan out to
each pair's queue, the event's offset held until each delivery is safe), attempt a due
delivery, or migrate an account's old one-record state (``PairWrites.migrate``)
(docs/architecture.md, "Webhook fan-out"; its spans: docs/operations.md, "Tracing")."""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiokafka.structs import ConsumerRecord

from worker.contract.delivery_log import AttemptRecord, webhook_id
from worker.contract.webhook_endpoints import EndpointRecord, is_active
from worker.contract.webhook_events import WebhookEvent
from worker.dispatcher.delivery import (
    DeliveryResult,
    DeliveryState,
    Pending,
    QueueLimits,
    Settled,
    carry_over,
    fail_head,
    is_old_form,
    marker,
    settle,
    state_key,
    take_in,
)
from worker.dispatcher.delivery_store import DeliveryStore
from worker.dispatcher.disabling import Disabling, ProbeConfig
from worker.dispatcher.dispatch_ports import Ports
from worker.dispatcher.endpoint_gate import EndpointGate, GateConfig
from worker.dispatcher.instrumentation import (
    Attempted,
    DeadLettered,
    Incoming,
    Instrumentation,
    Received,
    TakenIn,
    Undecodable,
)
from worker.dispatcher.intake import Intake
from worker.dispatcher.metrics import WebhookMetrics
from worker.dispatcher.missed_first import RECHECK_S, MissedFirst
from worker.dispatcher.pair_writes import PairWrites
from worker.dispatcher.refusals import Refusals
from worker.dispatcher.sender import ErrorKind, attempt_record
from worker.engine.faults import Fault
from worker.runtime import tracing
from worker.runtime.logs import get_logger, log_context

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    status_topic: str
    replay_topic: str
    schedule: tuple[float, ...]
    disable_after_s: float
    limits: QueueLimits = field(default_factory=QueueLimits)
    gate: GateConfig = field(default_factory=GateConfig)
    hold_s: float = 0.0
    """Take in without writing, holding the event's offset (``worker.dispatcher.holds``); the
    loop's ``hold_overdue_s`` is this. 0: write each pair at take-in."""
    probe: ProbeConfig = field(default_factory=ProbeConfig)


class Dispatcher:
    """The seams in one place: take in (pure + write), attempt (HTTP), settle (pure + write)."""

    def __init__(
        self,
        *,
        store: DeliveryStore,
        ports: Ports,
        config: DispatchConfig,
        metrics: WebhookMetrics,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        endpoints_to_end: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.store = store
        endpoints, publisher = ports.endpoints, ports.publisher
        self.missed_first = MissedFirst(endpoints)
        self.endpoints = endpoints
        self._ports = ports
        self._publisher = publisher
        self._intake = Intake(endpoints, config.status_topic, config.replay_topic, endpoints_to_end)
        self.config = config
        self.metrics = metrics
        self._clock = clock
        self._rng = rng or random.Random()

        def known(endpoint_id: str) -> bool:
            return endpoints.workspace_of(endpoint_id) is not None  # not deleted

        self.gate = EndpointGate(
            config.gate, wake=store.wake, metrics=metrics, rng=self._rng, known=known
        )
        self._instrument = Instrumentation(metrics)
        self.attempting = 0
        """HTTP attempts under way; read when scraped (nothing written per attempt)."""
        metrics.in_flight_attempts.set_function(lambda: self.attempting)
        self._writes = PairWrites(store, publisher, clock)
        self._refusals = Refusals(store, publisher, self._writes)
        self.disabling = Disabling(
            ports=ports,
            gate=self.gate,
            metrics=metrics,
            known=known,
            disable_after_s=config.disable_after_s,
            probing=config.probe,
        )

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> list[str]:
        """Take one record in; returns the (endpoint, account) keys due at once."""
        with tracing.consume_span(msg):
            read = await self._intake.read_current(msg)
            with self._instrument.record(msg, read) as block:
                return block.done(await self._receive(msg, read))

    async def _receive(
        self, msg: ConsumerRecord[bytes, bytes], read: Incoming | Undecodable | Fault
    ) -> Received:
        """Take ``read`` in; an undecodable record, or one whose taking-in failed for good
        (``read`` its fault), goes to the DLQ as it came."""
        if isinstance(read, Incoming):
            return await self._take_in(msg.partition, read.event, read.targets, replay=read.replay)
        fault = read if isinstance(read, Fault) else Fault("undecodable", read.detail)
        await self._publisher.dead_letter_record(msg, fault)
        return DeadLettered(fault.reason)

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        """A record whose taking-in failed for good: to the DLQ as it came."""
        with self._instrument.record(msg, None) as block:
            block.done(await self._receive(msg, fault))

    async def flush(self) -> None:
        """The log entries under way that hold events' offsets, before the loop commits."""
        await self._publisher.flush()

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        """A pair whose attempt keeps failing inside the dispatcher: its head delivery fails
        (to the DLQ and the delivery log, replayable), so the deliveries behind it go on. An
        old-form account record's key is left for its next migration try."""
        if is_old_form(key):
            return
        endpoint_id, _, _ = key.partition("/")
        self.gate.forget(endpoint_id, key, self._clock())
        state = self.store.pair(partition, key)
        head = None if state is None else state.head()
        if state is None or head is None:
            return
        self.missed_first.settling.add(key)
        try:
            with self._instrument.attempt(partition, state, head, sent=False) as block:
                block.done(await self._fail_head(partition, key, state, head, fault))
        finally:
            self.missed_first.settling.discard(key)

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
        limits = self.config.limits
        traceparent, tracestate = tracing.current_traceparent()
        taken: list[tuple[DeliveryState, Pending]] = []
        full: list[tuple[DeliveryState, Pending]] = []
        crowded: list[tuple[DeliveryState, Pending]] = []
        over: list[tuple[DeliveryState, Pending]] = []  # past the workspace's cap
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
            pairs = self.store.pending_pairs(partition, endpoint.id)
            if pair.idle and pairs >= limits.max_pairs_per_endpoint:
                crowded.append((pair, delivery))  # no new pair of the endpoint is opened
                continue
            missed = self.missed_first.missed(endpoint, replay)
            ahead = pair.key in self.missed_first.settling
            state, verdict = take_in(pair, delivery, limits, missed=missed, held=ahead)
            pending = self.store.pending_deliveries(workspace) + len(taken)
            if verdict == "taken" and pending >= limits.workspace_max_pending:
                over.append((pair, delivery))  # after the dedup: a duplicate is no new one
            elif verdict == "taken":
                taken.append((state, delivery))
            elif verdict == "full":
                full.append((state, delivery))
        # Stored before the first await: the pairs' lanes settle onto these states.
        for state, _ in taken:
            self.store.put(partition, state)
        by_id = {endpoint.id: endpoint for endpoint in targets}
        lined = {s.key for s, d in taken if s.queue[0] is d and self._lined_up(partition, s, by_id)}
        held = self._writes.hold(partition) if taken and self.config.hold_s > 0 else None
        if taken:
            if held is None:
                await self._writes.write_now(partition, [s.key for s, _ in taken])
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
                    await self._writes.write_now(partition, late)
        refused = (
            *(await self._refusals.queue_full(partition, full, now) if full else ()),
            *(await self._refusals.new_pairs(partition, crowded, now) if crowded else ()),
            *(await self._refusals.new_pairs(partition, over, now, workspace=True) if over else ()),
        )
        # A delivery's first log entry is its attempt's outcome, or ``pending`` once its pair
        # is written with it (``PairWrites.write``). Written at once, unheld: say so now.
        if held is None and (waiting := [(s, d) for s, d in taken if s.queue[0] is not d]):
            await self._publisher.log_pending(waiting, now=now)
        due = tuple(s.key for s, d in taken if s.queue[0] is d and s.key not in lined)
        return TakenIn(len(taken), refused, due)

    def _lined_up(
        self, partition: int, state: DeliveryState, by_id: dict[str, EndpointRecord]
    ) -> bool:
        """A new live pair of an active endpoint with no slot waits in its line, the gate asked
        once (``EndpointGate.line_up``); a head a follow-up may hold back is left to it."""
        key, now, ep = state.key, self._clock(), by_id[state.endpoint_id]
        if len(state.queue) > 1 or state.queue[0].replay or self.store.claimed(key):
            return False
        if not is_active(ep) or ep.replaying or ep.recovery is not None:
            return False
        until = self.gate.line_up(ep.id, ep.revision, ep.workspace_id, partition, key, now)
        if until is not None:
            self.store.defer(partition, key, until)
        return until is not None

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

    async def follow_up(self, partition: int, key: str) -> None:
        """Attempt the pair's due deliveries, head first, until one is not due or its endpoint
        has no room; an old-form account record's key is migrated instead."""
        if is_old_form(key):
            with log_context(account_id=key, partition=partition):
                if (pairs := await self._writes.migrate(partition, key)) is not None:
                    self.metrics.state_migrated.inc()
                    log.info("delivery_state_migrated", pairs=pairs)
            return
        end = self.missed_first.replays_end(partition, key)
        behind = end is not None and await self.missed_first.behind(partition, end)
        self.store.claim(key)  # its timer is armed once, when released, from the state left
        try:
            await self._follow_up(partition, key, behind)
        finally:
            self.store.release(partition, key)
            self.missed_first.settling.discard(key)  # whatever its attempt raised

    async def _follow_up(self, partition: int, key: str, behind: bool) -> None:
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
                    await self._writes.write_now(partition, [key])
                return
            if head.next_attempt_at > now:
                await self._writes.save_unsaved(partition, key)
                return  # armed at the head's own time when released
            endpoint = self.endpoints.get(state.workspace_id, endpoint_id)
            if self.missed_first.waits(head, endpoint, behind):
                # Held in the pair, not failed; a missed event taken in goes ahead of it.
                self.store.defer(partition, key, now + RECHECK_S)
                self.store.park(partition, key)
                return
            if is_active(endpoint):
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
                        # A pause (back-off, Retry-After, rate limit): written now. A wait for
                        # a slot ends with an attempt, within milliseconds at a busy endpoint;
                        # one that lasts (a hanging endpoint) is written by the overdue hold.
                        self.store.park(partition, key)
                        await self._writes.save_unsaved(partition, key)
                    return
            else:
                self.gate.forget(endpoint_id, key, now)
            self.missed_first.settling.add(key)  # dropped once settled, or by follow_up
            with self._instrument.attempt(partition, state, head) as block:
                attempted = block.done(
                    await self._attempt_head(partition, key, state, head, endpoint, now)
                )
            self.missed_first.settling.discard(key)
            if attempted.settled.outcome == "deferred":
                return  # its timer is armed at the deferral when the pair is released

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
        result: DeliveryResult | None = None
        attempt: AttemptRecord | None = None
        if is_active(endpoint):
            # The head stays due while it is attempted; its pair is claimed (``follow_up``),
            # so no timer brings it back meanwhile.
            try:
                result, attempt = await self._attempt(endpoint, head)
            finally:
                ours = result is not None and _our_capacity(result)
                self.store.undefer(key)
                paused = result is not None and result.status in (429, 503)
                self.gate.release(
                    endpoint.id,
                    ok=None if result is None or ours else result.ok,
                    now=self._clock(),
                    # A 429/503's ``Retry-After`` pauses the whole endpoint, not just this pair.
                    retry_after_s=result.retry_after_s if result and paused else None,
                )
        state = self.store.pair(partition, key) or state
        now = self._clock()
        if result is not None and _our_capacity(result):
            # No slot of ours (a connection, a lookup thread): nothing was sent, so nothing
            # is settled; the pair looks again shortly, its retry schedule, its endpoint's
            # failures and disable clock untouched.
            wait = (result.retry_after_s or 1.0) * self._rng.uniform(1.0, 1.5)
            self.store.defer(partition, key, now + wait)
            deferred = Settled(state, "deferred", base=state)
            return Attempted(head, deferred, endpoint, result)
        if result is None:
            reason = "endpoint_deleted" if endpoint is None else f"endpoint_{endpoint.status}"
            settled = fail_head(state, reason, now=now)
        else:
            settled = settle(state, result, now=now, schedule=self.config.schedule, rng=self._rng)
        await self._apply(partition, key, endpoint, settled, head, attempt)
        return Attempted(head, settled, endpoint, result)

    async def _attempt(
        self, endpoint: EndpointRecord, head: Pending
    ) -> tuple[DeliveryResult, AttemptRecord]:
        started = time.perf_counter()
        at = self._clock()
        self.attempting += 1
        try:
            body = head.body.encode()
            secrets = self._ports.writer.signing_secrets(endpoint)
            headers = {
                **self._ports.sign(secrets, head.webhook_id, int(at), body),
                **tracing.http_headers(),
            }
            result = await self._ports.sender.post(endpoint.url, body, headers)
            record = attempt_record(at, result)
            if _our_capacity(result):
                self.metrics.child(self.metrics.deferrals, "capacity").inc()
                return result, record  # not a request sent: no attempt counted
        except Exception as exc:
            # Whatever one attempt raises (an answer that broke the sender, a secret that does
            # not decrypt) fails that attempt, retried on the schedule; never the loop.
            log.error("webhook_attempt_crashed", endpoint_id=endpoint.id, error=type(exc).__name__)
            kind = str(ErrorKind.INTERNAL)
            result, record = DeliveryResult(None, error=kind), attempt_record(at, None, kind)
        finally:
            self.attempting -= 1
        self.metrics.attempt(result, time.perf_counter() - started)
        return result, record

    async def _apply(
        self,
        partition: int,
        key: str,
        endpoint: EndpointRecord | None,
        settled: Settled,
        head: Pending,
        attempt: AttemptRecord | None = None,
    ) -> None:
        now = self._clock()
        state = settled.state
        finished = settled.finished
        if finished is not None and finished.state == "failed":
            # A failure's record (DLQ copy, log entry) is acknowledged before the state that
            # drops the delivery: a crash in between repeats the attempt under the same
            # webhook-id, the failure is not lost. Counted after all this (instrumentation).
            await self._publisher.dead_letter(state, head, finished)
            await self._publisher.log_finished(state, head, finished, attempt=attempt)
        # The account's lane may have taken deliveries in meanwhile: carry the outcome over
        # onto the state as it is now, stored with no await in between.
        current = self.store.pair(partition, key) or state
        merged = carry_over(current, settled)
        unsaved = None
        if finished is not None and merged.failing_since == current.failing_since:
            # Never written and now settled: nothing to drop on the changelog. Its log entry
            # (and DLQ copy) acknowledged makes it safe: its event's hold is released then (a
            # success's, without the pair waiting for it: ``DeliveryPublisher.log_success``).
            unsaved = self.store.unsaved.settled(partition, key, marker(head))
        self.store.put(partition, merged)  # an idle pair is dropped (``DeliveryState.idle``)
        self.missed_first.settling.discard(key)  # settled: a missed event may go ahead of next
        if unsaved is not None and finished is not None:
            if finished.state == "delivered":
                self.disabling.succeeded(merged.endpoint_id, now)
                pub = self._publisher
                if wait := pub.log_success(merged, head, finished, unsaved, attempt=attempt):
                    await wait
            else:
                unsaved.done()
            if self.store.stale(partition, key):
                await self._writes.write_now(partition, [key])  # its tombstone
            if is_active(endpoint):
                await self.disabling.maybe_disable(endpoint, settled, now)
            return
        written = await self._writes.write(partition, [key], logged=marker(head))
        logged: Awaitable[None] | None = None
        if finished is None:
            # A retry or a delivery: its log entry only informs ``GET .../deliveries``, so it
            # goes out beside the state instead of before it (no task of their own).
            logged = self._publisher.log_retry(merged, merged.queue[0], now=now, attempt=attempt)
        elif finished.state == "delivered":
            self.disabling.succeeded(merged.endpoint_id, now)
            logged = self._publisher.log_finished(merged, head, finished, attempt=attempt)
        try:
            await written
        finally:
            if logged is not None:
                await logged
        if is_active(endpoint):
            await self.disabling.maybe_disable(endpoint, settled, now)


def _our_capacity(result: DeliveryResult) -> bool:
    """The attempt found no slot of ours (``ErrorKind.CAPACITY``): nothing was sent."""
    return result.status is None and result.error == ErrorKind.CAPACITY


__all__ = ["DispatchConfig", "Dispatcher"]
