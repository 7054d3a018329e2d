"""Delivery state of one (endpoint, account) pair and the pure decisions over it (``settle``):
a waiting or retrying delivery is a record with a due time, never a sleeping task
(docs/architecture.md, "Webhook fan-out")."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

Outcome = Literal["delivered", "retry", "failed", "gone", "deferred"]
"""``deferred``: not attempted for want of a slot of ours (a connection, a lookup thread):
nothing changes in the pair, no retry step is spent, the receiver is not charged."""

SEEN_KEPT: Final = 64
"""Webhook-ids remembered per (endpoint, account) to drop replays of the same event."""
JITTER: Final = 0.2
"""Each retry delay is scaled by a uniform factor in [1 - JITTER, 1 + JITTER]."""

DEFAULT_SCHEDULE_S: Final = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
"""Svix's retry schedule: the waits after the 1st, 2nd, ... failed attempt."""
MAX_WAIT_S: Final = 30 * 86_400.0
"""The longest wait a schedule may name: due times stay dates a timestamp can hold."""
ERROR_CHARS: Final = 200
"""``last_error`` is cut to this many characters: it is stored with the head and logged."""
MARKER_CHARS: Final = 100
"""The longest dedup marker (a webhook-id, ``#`` and a replay id), for the size bound."""
MAX_PAIRS_PER_ENDPOINT: Final = 1000
"""``QueueLimits.max_pairs_per_endpoint`` by default: per endpoint and partition."""
WORKSPACE_MAX_PENDING: Final = 10 * MAX_PAIRS_PER_ENDPOINT
"""``QueueLimits.workspace_max_pending`` by default: deliveries per workspace and dispatcher
process, as many as one delivery waiting on every pair of ten endpoints at their cap of pairs
in one partition; a workspace's 16 endpoints at their caps could hold 1,600 times that."""
STATE_HEADROOM: Final = SEEN_KEPT * MARKER_CHARS + 1024
"""What a pair record may still grow by after a take-in was judged to fit: the dedup window
filling up (``SEEN_KEPT`` markers) and the head's bookkeeping after attempts (attempt count,
status, the cut ``last_error``, times)."""


def state_key(endpoint_id: str, account_id: str) -> str:
    """The record key of a (endpoint, account) pair; ``/`` never occurs in an id."""
    return f"{endpoint_id}/{account_id}"


def is_old_form(key: str) -> bool:
    """Whether a due key is an old-form account record's (an account id, no ``/``)."""
    return "/" not in key


class Pending(BaseModel):
    """A delivery waiting for its (next) attempt. ``body`` is the exact JSON that is signed.
    ``traceparent``/``tracestate`` are the trace context it was taken in under: every attempt,
    even days later or on another dispatcher, continues that trace."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    webhook_id: str
    event_type: str
    event_id: str
    version: int | None = None
    body: str
    occurred_at: str
    enqueued_at: float
    attempts: int = 0
    next_attempt_at: float
    first_failed_at: float | None = None
    last_status: int | None = None
    last_error: str | None = None
    replay: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None


class Finished(BaseModel):
    """A delivery that ended: delivered, or failed for good."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    webhook_id: str
    event_type: str
    version: int | None = None
    attempts: int
    state: Literal["delivered", "failed"]
    last_status: int | None = None
    last_error: str | None = None
    finished_at: float


class DeliveryState(BaseModel):
    """The value on the delivery-state topic: one (endpoint, account) pair's deliveries (key:
    ``state_key``, in the account's partition)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["webhook_delivery_state"] = "webhook_delivery_state"
    schema_version: Literal[1] = 1
    endpoint_id: str
    account_id: str
    workspace_id: str
    queue: tuple[Pending, ...] = ()
    seen: tuple[str, ...] = ()
    failing_since: float | None = None

    @property
    def key(self) -> str:
        return state_key(self.endpoint_id, self.account_id)

    def head(self) -> Pending | None:
        return self.queue[0] if self.queue else None

    @property
    def idle(self) -> bool:
        """Nothing pending: nothing to attempt, retry or resume. An idle pair is kept neither
        in memory nor on the changelog (``DeliveryStore.put`` drops it, its record is
        tombstoned): its dedup window only saves a re-send, under the same webhook-id, of an
        event read again after a crash."""
        return not self.queue

    def due_at(self) -> float | None:
        """When the head is due, or ``None`` when nothing waits."""
        return self.queue[0].next_attempt_at if self.queue else None


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """The bound of one pair's queue: at most ``max_pending`` deliveries and a record of at
    most ``max_bytes`` (its JSON, as written to the changelog). A delivery that does not fit
    is refused (the newest one: what waits already keeps its place and order) and fails into
    the webhook DLQ, so no tenant can grow a record without bound."""

    max_pending: int = 100
    max_bytes: int = 256 * 1024
    max_pairs_per_endpoint: int = MAX_PAIRS_PER_ENDPOINT
    """Pairs with something pending one endpoint may have in one partition of the delivery
    state (``DeliveryStore.pending_pairs``). A delivery that would open one more is refused
    (``endpoint_queue_full``, into the webhook DLQ and the delivery log, the newest one: the
    pairs that wait keep their place), so a failing endpoint fed events for ever new accounts
    (an error event per made-up account id) holds a bounded number of records, in memory and
    on the changelog, charged to that endpoint alone."""
    workspace_max_pending: int = WORKSPACE_MAX_PENDING
    """Deliveries waiting one workspace may have in one dispatcher process, every endpoint and
    owned partition together (``DeliveryStore.pending_deliveries``), the owner-level sibling of
    the two caps above: a delivery that would pass it is refused (``workspace_queue_full``,
    into the webhook DLQ and the delivery log), so one workspace's failing endpoints hold a
    bounded part of the dispatcher's memory and timers, and the others' deliveries are still
    taken in."""

    def __post_init__(self) -> None:
        for name in ("max_pending", "max_pairs_per_endpoint", "workspace_max_pending"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_bytes < 2 * STATE_HEADROOM:
            raise ValueError(f"max_bytes must be >= {2 * STATE_HEADROOM}")

    def fits(self, state: DeliveryState) -> bool:
        """Whether ``state`` (a queue with the new delivery in it) may be taken in: its record's
        bytes as written (a character of a body may take up to 6 of them)."""
        if len(state.queue) > self.max_pending:
            return False
        room = self.max_bytes - STATE_HEADROOM
        most = most_bytes(state, limit=room)
        if most is not None and most <= room:
            return True  # even written at its longest it fits: not measured (a dump a take-in)
        return len(state.model_dump_json().encode()) <= room


ESCAPED_CHAR_BYTES: Final = 6
"""The most bytes one character of a string takes in a record: ``\\u001f`` (4-byte UTF-8
characters and two-character escapes take fewer)."""
NUMBER_CHARS: Final = 24
"""The most characters a float (``-1.7976931348623157e+308``) or an int below
``SMALL_INT`` takes, ``null`` included."""
SMALL_INT: Final = 10**20
PENDING_TEXT: Final = tuple(
    name for name, field in Pending.model_fields.items() if field.annotation in (str, str | None)
)
"""``Pending``'s strings; the rest of its fields are numbers."""
PENDING_FRAME: Final = (
    sum(len(name) + 4 for name in Pending.model_fields)  # "name": and the comma
    + 2 * len(PENDING_TEXT)  # a string's quotes
    + (len(Pending.model_fields) - len(PENDING_TEXT)) * NUMBER_CHARS
    + 2  # braces
)
"""The bytes of a ``Pending``'s record that are not its strings' characters, at most."""
STATE_FRAME: Final = 512
"""The bytes of a ``DeliveryState``'s record that are neither its deliveries nor its strings'
characters, at most: its field names, ``type``, its version, ``failing_since``."""


def most_bytes(state: DeliveryState, *, limit: int | None = None) -> int | None:
    """At most the bytes of ``state``'s record as written, summed from its strings' lengths
    without writing it; ``None`` when a number in it is too large to bound that way. With
    ``limit``, the sum stops once past it (and is then more than ``limit``, not the bound):
    a full pair is not summed to its end before it is written out anyway."""
    total = STATE_FRAME + ESCAPED_CHAR_BYTES * (
        len(state.endpoint_id) + len(state.account_id) + len(state.workspace_id)
    )
    total += ESCAPED_CHAR_BYTES * sum(map(len, state.seen)) + 3 * len(state.seen)
    for delivery in state.queue:
        for number in (delivery.version, delivery.attempts, delivery.last_status):
            if number is not None and not -SMALL_INT < number < SMALL_INT:
                return None
        chars = (  # the strings of ``PENDING_TEXT``, spelled out: this runs per take-in
            len(delivery.webhook_id)
            + len(delivery.event_type)
            + len(delivery.event_id)
            + len(delivery.body)
            + len(delivery.occurred_at)
            + len(delivery.last_error or "")
            + len(delivery.replay or "")
            + len(delivery.traceparent or "")
            + len(delivery.tracestate or "")
        )
        total += PENDING_FRAME + 1 + ESCAPED_CHAR_BYTES * chars
        if limit is not None and total > limit:
            return total
    return total


TakenIn = Literal["taken", "duplicate", "full"]


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What one attempt came to (``worker.dispatcher.sender`` builds it): a status, or an
    ``error`` (a ``sender.ErrorKind``, or why a delivery ended without an attempt), never
    both. ``body`` is at most the sender's cap (``truncated``: more was sent);
    ``retry_after_s`` is the answer's ``Retry-After`` for 429 and 503, at most the sender's
    ``retry_after_max_s``; ``detail`` is a short, secret-free explanation (a block reason or
    an exception type)."""

    status: int | None
    elapsed_s: float = 0.0
    error: str | None = None
    detail: str | None = None
    retry_after_s: float | None = None
    body: bytes = b""
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """A 2xx answer: the only kind of success in the Standard Webhooks sense."""
        return self.status is not None and 200 <= self.status < 300


@dataclass(frozen=True, slots=True)
class Settled:
    """The next state after an attempt, and what it meant."""

    state: DeliveryState
    outcome: Outcome
    finished: Finished | None = None
    base: DeliveryState | None = None
    """The state the outcome was decided from: ``carry_over`` onto it is ``state`` itself."""


def enqueue(
    state: DeliveryState, delivery: Pending, *, missed: bool = False, held: bool = False
) -> tuple[DeliveryState, bool]:
    """Append ``delivery`` unless its webhook-id was taken in already (a replay of the same
    event after a crash or rebalance). A ``/replay`` request carries its own ``replay`` id and
    is taken in once per request, under the event's original webhook-id. ``missed``: a
    recovery's replay (docs/architecture.md, "Endpoints that heal"), older than the live
    deliveries never attempted at the tail, goes ahead of them (behind a ``held`` head, one in
    flight); no replay nor attempted delivery changes place."""
    mark = marker(delivery)
    if mark in state.seen or any(marker(p) == mark for p in state.queue):
        return state, False
    seen = (*state.seen, mark)[-SEEN_KEPT:]
    queue, at = state.queue, len(state.queue)
    while missed and at > int(held) and queue[at - 1].replay is None and not queue[at - 1].attempts:
        at -= 1
    queue = (*queue[:at], delivery, *queue[at:])
    return state.model_copy(update={"queue": queue, "seen": seen}), True


def take_in(
    state: DeliveryState,
    delivery: Pending,
    limits: QueueLimits,
    *,
    missed: bool = False,
    held: bool = False,
) -> tuple[DeliveryState, TakenIn]:
    """``enqueue`` within ``limits``. ``full``: the delivery is refused and ``state`` comes
    back unchanged; the caller fails the delivery (webhook DLQ, log entry), then has the
    pair ``remember`` it so that the same event read again after a crash is not refused
    twice."""
    grown, accepted = enqueue(state, delivery, missed=missed, held=held)
    if not accepted:
        return state, "duplicate"
    if limits.fits(grown):
        return grown, "taken"
    return state, "full"


def remember(state: DeliveryState, delivery: Pending) -> DeliveryState:
    """``state`` with ``delivery``'s marker in its dedup window (a refused delivery)."""
    mark = marker(delivery)
    if mark in state.seen:
        return state
    return state.model_copy(update={"seen": (*state.seen, mark)[-SEEN_KEPT:]})


def refused(delivery: Pending, reason: str, *, now: float) -> Finished:
    """The end of a delivery that was never queued (``take_in`` said ``full``)."""
    return _ended(delivery, 0, DeliveryResult(None, error=reason), now)


def marker(delivery: Pending) -> str:
    """What the dedup window remembers of a delivery: its webhook-id, with the replay id of a
    ``/replay`` request."""
    return (
        delivery.webhook_id
        if delivery.replay is None
        else f"{delivery.webhook_id}#{delivery.replay}"
    )


def settle(
    state: DeliveryState,
    result: DeliveryResult,
    *,
    now: float,
    schedule: Sequence[float] = DEFAULT_SCHEDULE_S,
    rng: random.Random | None = None,
) -> Settled:
    """Apply the result of the head's attempt.

    2xx: delivered. 410: the endpoint is gone (the caller disables it); the delivery fails.
    Anything else: retry after the schedule's next wait (jittered; a longer ``Retry-After``
    on 429/503 wins, up to the schedule's longest step: a receiver cannot push a retry past
    the schedule, nor a due time past what a timestamp holds), or fail once the schedule is
    used up.
    """
    head = state.queue[0]
    attempts = head.attempts + 1
    if result.ok:
        return _finish(state, attempts, result, now, "delivered")
    if result.status == 410:
        return _finish(state, attempts, result, now, "gone")
    failures = attempts  # every attempt so far failed
    if failures > len(schedule):
        return _finish(state, attempts, result, now, "failed")
    wait = schedule[failures - 1] * (rng or random).uniform(1 - JITTER, 1 + JITTER)
    hint = result.retry_after_s
    if hint is not None and result.status in (429, 503) and math.isfinite(hint):
        wait = max(wait, min(hint, max(schedule)))
    since = state.failing_since or now
    retried = head.model_copy(
        update={
            "attempts": attempts,
            "next_attempt_at": now + wait,
            "first_failed_at": head.first_failed_at or now,
            "last_status": result.status,
            "last_error": _cut(result.error),
        }
    )
    nxt = state.model_copy(update={"queue": (retried, *state.queue[1:]), "failing_since": since})
    return Settled(nxt, "retry", base=state)


def fail_head(state: DeliveryState, reason: str, *, now: float) -> Settled:
    """The head fails without an attempt (its endpoint was deactivated, disabled or deleted)."""
    return _finish(
        state, state.queue[0].attempts, DeliveryResult(None, error=reason), now, "failed"
    )


def _finish(
    state: DeliveryState, attempts: int, result: DeliveryResult, now: float, outcome: Outcome
) -> Settled:
    """The head ended: delivered when ``result`` is a 2xx, else failed."""
    since = None if result.ok else (state.failing_since or now)
    nxt = state.model_copy(update={"queue": _behind(state.queue, now), "failing_since": since})
    done = _ended(state.queue[0], attempts, result, now)
    return Settled(nxt, outcome, finished=done, base=state)


def _ended(head: Pending, attempts: int, result: DeliveryResult, now: float) -> Finished:
    return Finished(
        webhook_id=head.webhook_id,
        event_type=head.event_type,
        version=head.version,
        attempts=attempts,
        state="delivered" if result.ok else "failed",
        last_status=result.status,
        last_error=_cut(result.error),
        finished_at=now,
    )


def _behind(queue: tuple[Pending, ...], now: float) -> tuple[Pending, ...]:
    """The deliveries behind the head that ended at ``now``: the next one waited behind it,
    so it is due now, not at its old time."""
    rest = queue[1:]
    if rest and rest[0].next_attempt_at > now:
        rest = (rest[0].model_copy(update={"next_attempt_at": now}), *rest[1:])
    return rest


def _cut(error: str | None) -> str | None:
    return None if error is None else error[:ERROR_CHARS]


def carry_over(current: DeliveryState, settled: Settled) -> DeliveryState:
    """``settled`` applied onto ``current``: the state may have changed while the outcome was
    being written (the account's lane appends deliveries and webhook-ids behind the head), but
    only the attempting lane ever changes the head, so its transition carries over as is.
    Nothing changed meanwhile (the usual case): the settled state is that, no copy made."""
    if current is settled.base:
        return settled.state
    if settled.finished is None:
        queue = (settled.state.queue[0], *current.queue[1:])
    else:
        queue = _behind(current.queue, settled.finished.finished_at)
    return current.model_copy(update={"queue": queue, "failing_since": settled.state.failing_since})


def parse_schedule(text: str) -> tuple[float, ...]:
    """``WEBHOOK_RETRY_SCHEDULE_S``: comma-separated seconds, e.g. ``5,300,1800``."""
    waits = tuple(float(part) for part in text.split(",") if part.strip())
    if any(not 0 <= w <= MAX_WAIT_S for w in waits):
        raise ValueError(f"retry waits must be >= 0 and <= {MAX_WAIT_S:.0f} seconds")
    return waits
