"""Tracing, logging and metrics around the dispatcher's handlers, in blocks as a middleware
would put them (the executor's are ``worker.auth.instrumentation``): the handlers return what
a record or an attempt came to, and ``Instrumentation``'s block puts its identity on the span
and in the log context around them, then counts and logs it, so each count comes after the
writes the handler orders (a failure's DLQ copy before its state). Never in a span or the log
context: an endpoint's URL (the attempt span keeps its host and port), a secret, a body."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Literal
from urllib.parse import urlsplit

from aiokafka.structs import ConsumerRecord
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from worker.contract.webhook_endpoints import EndpointRecord
from worker.contract.webhook_events import WebhookEvent
from worker.dispatcher.delivery import DeliveryResult, DeliveryState, Pending, Settled
from worker.dispatcher.metrics import WebhookMetrics
from worker.runtime import tracing
from worker.runtime.logs import get_logger, log_context

# The dispatcher's lines (here, ``disabling`` and ``pair_writes``) keep its logger name, which
# dashboards and searches use.
log = get_logger("worker.dispatcher.dispatcher")

ATTEMPT_SPAN = "POST webhook"


@dataclass(frozen=True, slots=True)
class Incoming:
    """An event read from its record: the endpoints it goes to (none: nothing to do) and,
    from ``webhook.replays``, the replay request's id."""

    event: WebhookEvent
    targets: Sequence[EndpointRecord]
    replay: str | None = None


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A record nothing can be delivered from: ``error`` names why (an exception's type),
    ``detail`` says it for the DLQ copy's headers."""

    error: str
    detail: str


@dataclass(frozen=True, slots=True)
class Refused:
    """A delivery failed at take-in: its pair's queue full (``queue_full``; ``pending`` is
    that queue's length), or its endpoint at its cap of pending pairs in the partition
    (``endpoint_queue_full``; ``pending`` is that count), or its workspace at its cap of
    pending deliveries in the process (``workspace_queue_full``; ``pending`` is that count)."""

    endpoint_id: str
    account_id: str
    webhook_id: str
    pending: int
    reason: Literal["queue_full", "endpoint_queue_full", "workspace_queue_full"] = "queue_full"


@dataclass(frozen=True, slots=True)
class TakenIn:
    """An event fanned out: ``taken`` deliveries queued, ``refused`` ones failed at once, and
    the pairs ``due`` to be attempted at once."""

    taken: int = 0
    refused: tuple[Refused, ...] = ()
    due: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """An input record (an event, a replay request) sent to the webhook DLQ as it came, by
    ``dlq.reason``."""

    reason: str


Received = TakenIn | DeadLettered


@dataclass(frozen=True, slots=True)
class Attempted:
    """A pair's head settled and its outcome written: ``result`` is the HTTP attempt's
    (``None``: the head failed without one, its endpoint inactive or gone, or given up)."""

    head: Pending
    settled: Settled
    endpoint: EndpointRecord | None
    result: DeliveryResult | None = None


class Instrumentation:
    """Puts a dispatcher handler's record or pair identity in context around it, then records
    what it came to: a block whose handler fails part way counts nothing, its retry what it
    comes to. Blocks (``record``, ``attempt``), not wrappers awaiting the handler: a wrapper's
    coroutine is one more frame for every delivery to pass through at each suspension.
    Measures of one output stay where they happen: the HTTP request's (counted for every
    request sent, whatever becomes of its writes), a disabling (its line must not wait on the
    note after it), the gate's deferrals, the state records' sizes."""

    def __init__(self, metrics: WebhookMetrics) -> None:
        self.metrics = metrics

    def record(
        self, msg: ConsumerRecord[bytes, bytes], read: Incoming | Undecodable | None
    ) -> RecordBlock:
        """The block a record is taken in or dead-lettered in. ``read`` is what the record was
        read as (``None``: not read, a record let go after its retries). The span is the
        caller's: an event's CONSUMER span, none for a record let go."""
        span = tracing.current_span()
        context: dict[str, object] = {
            "topic": msg.topic,
            "partition": msg.partition,
            "offset": msg.offset,
        }
        if isinstance(read, Incoming):
            event = read.event
            if read.targets and span.is_recording():
                span.set_attributes(
                    {"passkey.account_id": event.account_id, "passkey.event_id": event.event_id}
                )
            context |= {
                "account_id": event.account_id,
                "workspace_id": event.workspace_id,
                "event_id": event.event_id,
                "event_type": event.event_type,
            }
        return RecordBlock(self.metrics, msg, read, span, log_context(**context))

    def attempt(
        self, partition: int, state: DeliveryState, head: Pending, *, sent: bool = True
    ) -> AttemptBlock:
        """The block of one attempt at the pair's head, in a CLIENT span whose parent is the
        trace of the event the delivery came from (its context is stored with it). ``sent``
        false: the head of a pair whose attempts keep failing inside the dispatcher, failed
        without an attempt (no span: nothing is sent)."""
        spanned = (
            tracing.span_from(
                head.traceparent,
                head.tracestate,
                ATTEMPT_SPAN,
                kind=SpanKind.CLIENT,
                attributes=_attempt_attributes(state, head),
            )
            if sent
            else None
        )
        return AttemptBlock(self.metrics, spanned, _pair_context(partition, state, head))


class RecordBlock:
    """``Instrumentation.record``'s block: the record's identity in the log context; ``done``
    counts and logs what the record came to."""

    __slots__ = ("_context", "_metrics", "_msg", "_read", "_span")

    def __init__(
        self,
        metrics: WebhookMetrics,
        msg: ConsumerRecord[bytes, bytes],
        read: Incoming | Undecodable | None,
        span: trace.Span,
        context: log_context,
    ) -> None:
        self._metrics, self._msg, self._read, self._span = metrics, msg, read, span
        self._context = context

    def __enter__(self) -> RecordBlock:
        self._context.__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        self._context.__exit__()

    def done(self, received: Received) -> list[str]:
        """``received`` counted and logged; the pairs due at once."""
        metrics, msg = self._metrics, self._msg
        if isinstance(received, TakenIn):
            if received.taken:
                metrics.taken_in.inc(received.taken)
            for one in received.refused:
                metrics.failed.inc()
                metrics.queue_full.inc()
                log.warning(
                    "delivery_refused",
                    reason=one.reason,
                    endpoint_id=one.endpoint_id,
                    account_id=one.account_id,
                    webhook_id=one.webhook_id,
                    pending=one.pending,
                )
            due = list(received.due)
        else:
            if isinstance(self._read, Undecodable):
                metrics.undecodable.inc()
                log.error(
                    "event_undecodable",
                    topic=msg.topic,
                    partition=msg.partition,
                    offset=msg.offset,
                    error=self._read.error,
                )
            metrics.child(metrics.dlq, received.reason).inc()
            due = []
        if self._span.is_recording():
            self._span.set_attribute("passkey.webhook.due", len(due))
        return due


class AttemptBlock:
    """``Instrumentation.attempt``'s block: the attempt's span (an exception escaping the
    block is recorded on it) and the pair's identity in the log context; ``done`` puts the
    outcome on the span and counts it."""

    __slots__ = ("_context", "_metrics", "_spanned", "span")

    def __init__(
        self,
        metrics: WebhookMetrics,
        spanned: AbstractContextManager[trace.Span] | None,
        context: log_context,
    ) -> None:
        self._metrics, self._spanned, self._context = metrics, spanned, context
        self.span: trace.Span | None = None

    def __enter__(self) -> AttemptBlock:
        if self._spanned is not None:
            self.span = self._spanned.__enter__()
        try:
            self._context.__enter__()
        except BaseException as exc:  # the span entered is left, as a ``with`` would leave it
            if self._spanned is not None:
                self._spanned.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._context.__exit__()
        if self._spanned is not None:
            self._spanned.__exit__(kind, exc, tb)

    def done(self, attempted: Attempted) -> Attempted:
        """``attempted`` on the span and counted: a deferral was counted where it was decided
        (``Dispatcher._attempt``)."""
        span = self.span
        if span is not None and span.is_recording():
            _attempt_outcome(span, attempted)
        settled = attempted.settled
        if settled.outcome == "deferred":
            return attempted
        finished = settled.finished
        if finished is None:
            self._metrics.retries.inc()
        elif finished.state == "failed":
            self._metrics.failed.inc()
        else:
            self._metrics.delivered(attempted.head.occurred_at, finished.finished_at)
        return attempted


def _pair_context(partition: int, state: DeliveryState, head: Pending) -> log_context:
    return log_context(
        partition=partition,
        endpoint_id=state.endpoint_id,
        account_id=state.account_id,
        workspace_id=state.workspace_id,
        webhook_id=head.webhook_id,
        event_type=head.event_type,
    )


def _attempt_attributes(state: DeliveryState, head: Pending) -> dict[str, str | int] | None:
    """The attempt span's attributes (none built when nothing is recorded). The endpoint's
    URL is not among them: integrators put tokens in query strings."""
    if not tracing.recording():
        return None
    return {
        "http.request.method": "POST",
        "passkey.endpoint_id": state.endpoint_id,
        "passkey.account_id": state.account_id,
        "passkey.webhook_id": head.webhook_id,
        "passkey.webhook.event_type": head.event_type,
        "passkey.webhook.attempt": head.attempts + 1,
    }


def _attempt_outcome(span: trace.Span, attempted: Attempted) -> None:
    endpoint, result = attempted.endpoint, attempted.result
    span.set_attribute("passkey.webhook.outcome", attempted.settled.outcome)
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


__all__ = [
    "ATTEMPT_SPAN",
    "AttemptBlock",
    "Attempted",
    "DeadLettered",
    "Incoming",
    "Instrumentation",
    "Received",
    "RecordBlock",
    "Refused",
    "TakenIn",
    "Undecodable",
]
