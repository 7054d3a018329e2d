"""``GET /v1/accounts/{account_id}/events``: the account's status and error events, rendered as its
webhooks are, so polling and webhooks agree. Each read is bounded and takes a slot through the
admission rule, so workspaces that loop on reads spend their own time; the next page's cursor is
signed and bound to account and workspace (docs/architecture.md, "An account's event history")."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from aiokafka import TopicPartition

from worker.api.webhooks.quotas import EVENT_SCANS, busy, read_slots
from worker.contract.topics import Topics
from worker.contract.webhook_events import WebhookEvent, from_error, from_status
from worker.engine.client_start import AsideCloses
from worker.engine.fetch import skipping
from worker.engine.range_read import Span, partitions, read_range
from worker.runtime.admission import NoRoom
from worker.runtime.logs import get_logger
from worker.runtime.signed import SignedCodec
from worker.webhooks.replay_scan import SEEK_MARGIN_S, event_of, occurred_since

log = get_logger(__name__)

DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 100
#: Records of each topic's home partition one request reads at most.
SCAN_RECORDS: Final = 20_000
SCAN_TIMEOUT_S: Final = 5.0
#: The oldest ``since`` a first page may start from (and where it starts without one).
WINDOW_S: Final = 7 * 86_400.0
MAX_SCANS: Final = 4
CURSOR_MAX_CHARS: Final = 512
WINDOW_EXCEEDED: Final = "event_history_window_exceeded"
#: The cursors' form: a cursor of the first form (no prefix) is refused as any invalid one.
CURSOR_PREFIX: Final = "evc2."


class CursorError(ValueError):
    """A cursor that is malformed, forged, or of another account or workspace."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next page starts: the next offset of the home partition of each topic."""

    account_id: str
    workspace_id: str
    status: tuple[int, int]  # (partition, next offset)
    errors: tuple[int, int]


class CursorCodec:
    """Opaque cursors signed (``worker.runtime.signed``) under the cursors' own label with the
    front-ends' shared ``WEBHOOK_SECRETS_KEY`` (any replica reads any replica's cursor)."""

    def __init__(self, secret: bytes) -> None:
        self._codec = SignedCodec(
            secret, label=b"account-events-cursor", prefix=CURSOR_PREFIX, max_chars=CURSOR_MAX_CHARS
        )

    def encode(self, cursor: Cursor) -> str:
        return self._codec.encode(
            {
                "a": cursor.account_id,
                "w": cursor.workspace_id,
                "s": list(cursor.status),
                "e": list(cursor.errors),
            }
        )

    def decode(self, text: str, *, account_id: str, workspace_id: str) -> Cursor:
        """The cursor ``text`` names, when it is one this service issued for this account of
        this workspace; raises ``CursorError`` otherwise (the reason is not told)."""
        raw = self._codec.decode(text)
        if raw is None:
            raise CursorError("malformed or forged")
        try:
            cursor = Cursor(
                account_id=str(raw["a"]),
                workspace_id=str(raw["w"]),
                status=_position(raw["s"]),
                errors=_position(raw["e"]),
            )
        except (ValueError, KeyError, TypeError):
            raise CursorError("malformed") from None
        if cursor.account_id != account_id or cursor.workspace_id != workspace_id:
            raise CursorError("another account")
        return cursor


def _position(value: Any) -> tuple[int, int]:
    partition, offset = value
    if type(partition) is not int or type(offset) is not int or min(partition, offset) < 0:
        raise ValueError("not a position")
    return partition, offset


@dataclass(frozen=True, slots=True)
class FoundEvent:
    """One event of the account, where it was read."""

    event: WebhookEvent
    source: str  # "status" or "errors"
    timestamp_ms: int
    offset: int

    def order(self) -> tuple[int, int, int]:
        return (self.timestamp_ms, 0 if self.source == "status" else 1, self.offset)


@dataclass(frozen=True, slots=True)
class _TopicRead:
    partition: int
    span: Span
    found: list[FoundEvent]


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page: ``events`` in order, the ``cursor`` to continue from (always: new events keep
    arriving), ``has_more`` when this page stopped short of the end of either topic."""

    events: list[FoundEvent]
    cursor: Cursor
    has_more: bool
    found_any: bool


@dataclass(eq=False)
class AccountEvents:
    """Reads pages of an account's events, a group-less consumer per topic scanned, each read
    under ``admission`` (``MAX_SCANS``, one per workspace, ``SCAN_TIME`` charged)."""

    consumer_factory: Callable[[], Any]
    _: KW_ONLY
    topics: Topics
    scan_records: int = SCAN_RECORDS

    def __post_init__(self) -> None:
        self._aside = AsideCloses()
        self.admission = read_slots("account_event_reads", MAX_SCANS)
        self._skip = skipping("account-events", log)
        #: Records read by every scan of this process: what the scans cost.
        self.records_read = 0

    @contextlib.contextmanager
    def turn(self, workspace_id: str) -> Iterator[None]:
        """The workspace's read slot for the ``with`` block, or ``Refused`` (429 with the
        admission's ``Retry-After``)."""
        try:
            slot = self.admission.take(workspace_id)
        except NoRoom as exc:
            raise busy(EVENT_SCANS, "event-history read", exc) from None
        with slot:
            yield

    async def page(
        self,
        workspace_id: str,
        account_id: str,
        *,
        cursor: Cursor | None,
        since: datetime | None,
        limit: int,
    ) -> EventPage:
        """The next ``limit`` events at most from ``cursor`` (or from ``since``)."""
        deadline = time.monotonic() + SCAN_TIMEOUT_S
        start_ms = None
        if cursor is None:
            start = since or datetime.now(UTC) - timedelta(seconds=WINDOW_S)
            start_ms = int((start.timestamp() - SEEK_MARGIN_S) * 1000)
        # The reads stop at ``deadline``; this bounds the broker calls around them too.
        async with asyncio.timeout(2 * SCAN_TIMEOUT_S + 5):
            status, errors = [
                await self._read(topic, workspace_id, account_id, at, start_ms, since, deadline)
                for topic, at in (
                    (self.topics.status, None if cursor is None else cursor.status),
                    (self.topics.errors, None if cursor is None else cursor.errors),
                )
            ]
        return _merge(workspace_id, account_id, status, errors, limit)

    async def _read(
        self,
        topic: str,
        workspace_id: str,
        account_id: str,
        at: tuple[int, int] | None,
        start_ms: int | None,
        since: datetime | None,
        deadline: float,
    ) -> _TopicRead:
        consumer = self.consumer_factory()
        await self._aside.start(consumer)  # a start cut short is closed aside
        try:
            key = account_id.encode()
            (tp,) = await partitions(consumer, topic, deadline=deadline, key=key)
            if at is not None and at[0] != tp.partition:
                raise CursorError("the topic's partitions changed")
            found: list[FoundEvent] = []
            source = "status" if topic == self.topics.status else "errors"
            decode = from_status if source == "status" else from_error

            def keep(_: TopicPartition, records: list[Any]) -> None:
                self.records_read += len(records)
                for msg in records:
                    event = _event(decode, msg.value, msg.key, account_id)
                    if event is None or event.workspace_id != workspace_id:
                        continue
                    if since is not None and at is None and not occurred_since(event, since):
                        continue
                    found.append(FoundEvent(event, source, msg.timestamp, msg.offset))

            spans = await read_range(
                consumer,
                [tp],
                keep,
                on_unreadable=self._skip,
                offsets=None if at is None else {tp: at[1]},
                since_ms=start_ms,
                max_records=self.scan_records,
                deadline=deadline,
            )
            return _TopicRead(tp.partition, spans[tp], found)
        finally:
            await consumer.stop()


def _event(
    decode: Callable[[bytes], WebhookEvent], value: bytes | None, key: bytes | None, account: str
) -> WebhookEvent | None:
    if value is None or key != account.encode():
        return None  # another account's (its key), or a tombstone
    event = event_of(decode, value)
    return event if event is not None and event.account_id == account else None


def _merge(
    workspace_id: str, account_id: str, status: _TopicRead, errors: _TopicRead, limit: int
) -> EventPage:
    """The page: both topics' events by broker time, none later than where an unfinished
    topic's read stopped (it may still hold earlier ones), ``limit`` at most; each topic's
    next offset is its first event not on the page, or where its read stopped."""
    horizons = [r.span.last_timestamp_ms for r in (status, errors) if not r.span.complete]
    horizon = None
    if horizons:
        horizon = min(-1 if h is None else h for h in horizons)
    candidates = sorted((*status.found, *errors.found), key=FoundEvent.order)
    taken = [e for e in candidates if horizon is None or e.timestamp_ms <= horizon][:limit]
    chosen = {(e.source, e.offset) for e in taken}

    def next_offset(read: _TopicRead, source: str) -> int:
        left = [e.offset for e in read.found if (source, e.offset) not in chosen]
        return min(left) if left else read.span.next

    cursor = Cursor(
        account_id=account_id,
        workspace_id=workspace_id,
        status=(status.partition, next_offset(status, "status")),
        errors=(errors.partition, next_offset(errors, "errors")),
    )
    more = not (status.span.complete and errors.span.complete) or len(taken) < len(candidates)
    return EventPage(events=taken, cursor=cursor, has_more=more, found_any=bool(candidates))


__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "SCAN_RECORDS",
    "WINDOW_S",
    "AccountEvents",
    "Cursor",
    "CursorCodec",
    "CursorError",
    "EventPage",
    "FoundEvent",
]
