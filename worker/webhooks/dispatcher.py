"""One unit of dispatcher work: take an event in (fan-out), or attempt a due delivery.

The consume loop (``worker.consumer``) runs this exactly as it runs the worker's executor:
records of auth.status / auth.errors / the replay topic arrive on the lane of their account;
a due delivery arrives as a follow-up on the lane of its (endpoint, account) pair. So one
account's events are taken in in order, each endpoint's deliveries for it go out in order, and
a slow or failing endpoint only ever occupies its own lanes.

Taking in: the event becomes one pending delivery per subscribed, active endpoint of its
workspace, written to the account's delivery-state record and acknowledged before the offset
may be committed ("durably scheduled"). Attempting: the head of the pair's queue is signed
(Standard Webhooks) and sent; ``delivery.settle`` says what the answer means; the new state is
written, the delivery log gets the outcome, a failed delivery goes to the webhook DLQ, a 410
or five days of failures disable the endpoint.

Tracing (``worker.tracing``): taking an event in is a CONSUMER span continuing the event
record's ``traceparent``; each delivery stores that span's context, and each attempt is a
CLIENT span under it that sends ``traceparent`` to the endpoint (beside the signature headers,
which it does not touch). The records written meanwhile carry the context of the span they
are written under.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from aiokafka.structs import ConsumerRecord
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from worker import tracing
from worker.faults import Fault
from worker.logs import get_logger
from worker.webhooks.delivery import (
    AttemptResult,
    Pending,
    Settled,
    carry_over,
    enqueue,
    fail_head,
    settle,
    state_key,
    webhook_id,
)
from worker.webhooks.endpoints import EndpointRecord, EndpointRegistry
from worker.webhooks.events import WebhookEvent, from_error, from_status
from worker.webhooks.metrics import WebhookMetrics
from worker.webhooks.publish import DeliveryPublisher, Replay, decode_replay
from worker.webhooks.sender import DeliveryResult, ErrorKind
from worker.webhooks.state import AccountDeliveries, DeliveryStore

log = get_logger(__name__)


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

    # -- taking events in --------------------------------------------------------------------

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> list[str]:
        """Take one record in; returns the (endpoint, account) keys due at once."""
        with tracing.consume_span(msg) as taking:
            due = await self._handle(msg)
            if taking.is_recording():
                taking.set_attribute("passkey.webhook.due", len(due))
            return due

    async def _handle(self, msg: ConsumerRecord[bytes, bytes]) -> list[str]:
        if msg.topic == self.config.replay_topic:
            return await self._take_in_replay(msg)
        decode = from_status if msg.topic == self.config.status_topic else from_error
        try:
            if msg.value is None:
                raise ValueError("no value")
            event = decode(msg.value)
        except Exception as exc:
            # Nothing can be delivered from it: to the DLQ as it came, never fatal.
            await self._undecodable(msg, exc)
            return []
        if event.workspace_id is None:
            return []
        targets = self.endpoints.subscribers(event.workspace_id, event.event_type)
        return await self._take_in(msg.partition, event, targets, replay=None)

    async def _take_in_replay(self, msg: ConsumerRecord[bytes, bytes]) -> list[str]:
        try:
            replay: Replay = decode_replay(msg.value or b"")
            event = (from_status if replay.source == "status" else from_error)(
                replay.event.encode()
            )
        except Exception as exc:
            await self._undecodable(msg, exc)
            return []
        endpoint = self.endpoints.get(replay.workspace_id, replay.endpoint_id)
        if endpoint is None or event.workspace_id != replay.workspace_id:
            return []
        return await self._take_in(msg.partition, event, [endpoint], replay=replay.replay_id)

    async def _undecodable(self, msg: ConsumerRecord[bytes, bytes], exc: Exception) -> None:
        self.metrics.undecodable.inc()
        log.error(
            "event_undecodable",
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            error=type(exc).__name__,
        )
        detail = f"{type(exc).__name__}: {str(exc)[:200]}"
        await self._publisher.dead_letter_record(msg, Fault("undecodable", detail))
        self.metrics.dlq.labels("undecodable").inc()

    # -- faults (worker.consumer retried these first) ------------------------------------------

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        """A record whose taking-in failed for good: to the DLQ as it came."""
        await self._publisher.dead_letter_record(msg, fault)
        self.metrics.dlq.labels(fault.reason).inc()

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        """A pair whose attempt keeps failing inside the dispatcher: its head delivery fails
        (to the DLQ and the delivery log, replayable), so the deliveries behind it go on."""
        endpoint_id, _, account_id = key.partition("/")
        record = self.store.get(partition, account_id)
        head = None if record is None else record.of(endpoint_id).head()
        if record is None or head is None:
            return
        settled = fail_head(
            record.of(endpoint_id), f"internal_error: {fault.exception}", now=self._clock()
        )
        endpoint = self.endpoints.get(record.workspace_id, endpoint_id)
        await self._apply(partition, account_id, record, endpoint, settled, head)

    async def _take_in(
        self,
        partition: int,
        event: WebhookEvent,
        targets: Sequence[EndpointRecord],
        *,
        replay: str | None,
    ) -> list[str]:
        if not targets or event.workspace_id is None:
            return []
        now = self._clock()
        record = self.store.get(partition, event.account_id) or AccountDeliveries(
            account_id=event.account_id, workspace_id=event.workspace_id
        )
        traceparent, tracestate = tracing.current_traceparent()
        current = trace.get_current_span()
        if current.is_recording():
            current.set_attributes(
                {"passkey.account_id": event.account_id, "passkey.event_id": event.event_id}
            )
        taken: list[tuple[str, Pending]] = []
        for endpoint in targets:
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
            state, accepted = enqueue(record.of(endpoint.id), delivery)
            if accepted:
                record = record.with_state(state)
                taken.append((endpoint.id, delivery))
        if not taken:
            return []
        await self._publisher.persist(partition, record, store=self.store)
        self.metrics.taken_in.inc(len(taken))
        # Pairs whose new delivery is at the head are attempted at once: their first log entry
        # is the attempt's outcome. The others wait behind an earlier one: say so in the log.
        due, waiting = [], []
        for endpoint_id, delivery in taken:
            head = record.endpoints[endpoint_id].queue[0]
            if head.webhook_id == delivery.webhook_id and head.replay == delivery.replay:
                due.append(state_key(endpoint_id, event.account_id))
            else:
                waiting.append((endpoint_id, delivery))
        if waiting:
            await self._publisher.log_pending(record, waiting, now=now)
        return due

    # -- attempting deliveries ---------------------------------------------------------------

    async def follow_up(self, partition: int, key: str) -> None:
        """Attempt the pair's due deliveries, head first, until one is not due."""
        endpoint_id, _, account_id = key.partition("/")
        while True:
            record = self.store.get(partition, account_id)
            head = None if record is None else record.of(endpoint_id).head()
            if record is None or head is None:
                return
            if head.next_attempt_at > self._clock():
                self.store.put(partition, record)  # re-arm at the head's own time
                return
            endpoint = self.endpoints.get(record.workspace_id, endpoint_id)
            with tracing.span(
                "POST webhook",
                kind=SpanKind.CLIENT,
                parent=tracing.context_from_traceparent(head.traceparent, head.tracestate),
                attributes=_attempt_attributes(endpoint_id, account_id, head),
            ) as attempt:
                result: AttemptResult | None = None
                if endpoint is not None and endpoint.status == "active":
                    result = await self._attempt(endpoint, head)
                record = self.store.get(partition, account_id) or record
                state = record.of(endpoint_id)
                now = self._clock()
                if result is None:
                    reason = (
                        "endpoint_deleted" if endpoint is None else f"endpoint_{endpoint.status}"
                    )
                    settled = fail_head(state, reason, now=now)
                else:
                    settled = settle(
                        state, result, now=now, schedule=self.config.schedule, rng=self._rng
                    )
                if attempt.is_recording():
                    _attempt_outcome(attempt, endpoint, result, settled)
                await self._apply(partition, account_id, record, endpoint, settled, head)

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
        account_id: str,
        record: AccountDeliveries,
        endpoint: EndpointRecord | None,
        settled: Settled,
        head: Pending,
    ) -> None:
        now = self._clock()
        endpoint_id = settled.state.endpoint_id
        finished = settled.finished
        if finished is not None and finished.state == "failed":
            # A failure's record (DLQ copy, log entry) is acknowledged before the state that
            # drops the delivery: a crash in between repeats the attempt under the same
            # webhook-id instead of losing the failure.
            self.metrics.failed.inc()
            await self._publisher.dead_letter(record, endpoint_id, head, finished)
            await self._publisher.log_finished(record, endpoint_id, head, finished)
        # The account's lane may have taken deliveries in meanwhile: carry the outcome over
        # onto the record as it is now, stored with no await in between.
        current = self.store.get(partition, account_id) or record
        merged = current.with_state(carry_over(current.of(endpoint_id), settled))
        self.store.put(partition, merged)
        written = await self._publisher.send_state(partition, merged, store=self.store)
        if finished is None:
            # A retry or a delivery: its log entry only informs ``GET .../deliveries``, so it
            # goes out beside the state instead of before it.
            self.metrics.retries.inc()
            logged = self._publisher.log_retry(
                record, endpoint_id, merged.of(endpoint_id).queue[0], now=now
            )
            await asyncio.gather(written, logged)
        elif finished.state == "delivered":
            self._last_success[endpoint_id] = now
            self.metrics.delivered(head.occurred_at, now)
            logged = self._publisher.log_finished(record, endpoint_id, head, finished)
            await asyncio.gather(written, logged)
        else:
            await written
        if endpoint is not None and endpoint.status == "active":
            await self._maybe_disable(endpoint, settled, now)

    async def _maybe_disable(self, endpoint: EndpointRecord, settled: Settled, now: float) -> None:
        reason = None
        if settled.outcome == "gone":
            reason = "the endpoint answered 410 Gone"
        elif (since := settled.state.failing_since) is not None and (
            now - since >= self.config.disable_after_s
        ):
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
        log.warning("endpoint_disabled", endpoint_id=endpoint.id, reason=reason)


def _attempt_attributes(
    endpoint_id: str, account_id: str, head: Pending
) -> dict[str, str | int] | None:
    """The attempt span's attributes (none built when nothing is recorded). The endpoint's
    URL is not among them: integrators put tokens in query strings."""
    if not tracing.recording():
        return None
    return {
        "http.request.method": "POST",
        "passkey.endpoint_id": endpoint_id,
        "passkey.account_id": account_id,
        "passkey.webhook_id": head.webhook_id,
        "passkey.webhook.event_type": head.event_type,
        "passkey.webhook.attempt": head.attempts + 1,
    }


def _attempt_outcome(
    span: trace.Span,
    endpoint: EndpointRecord | None,
    result: AttemptResult | None,
    settled: Settled,
) -> None:
    span.set_attribute("passkey.webhook.outcome", settled.outcome)
    if endpoint is not None:
        url = urlsplit(endpoint.url)
        span.set_attribute("server.address", url.hostname or "")
        if url.port is not None:
            span.set_attribute("server.port", url.port)
    if result is None or result.status is None:
        span.set_attribute("error.type", (result.error if result else None) or "not_attempted")
        span.set_status(Status(StatusCode.ERROR))
        return
    span.set_attribute("http.response.status_code", result.status)
    if not result.ok:
        span.set_attribute("error.type", str(result.status))
        span.set_status(Status(StatusCode.ERROR))


__all__ = ["DispatchConfig", "Dispatcher", "EndpointWriter", "Sender", "Signer"]
