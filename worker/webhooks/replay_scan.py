"""The scan behind a replay: a bounded read of auth.status and auth.errors from a time to their
ends of now, each matching event turned into a ``Replay`` record on webhook.replays that the
dispatcher delivers under the event's own webhook-id. Run by the front-end's ``POST
.../replay`` and by the dispatcher recovering an endpoint (docs/architecture.md, "Endpoints
that heal"); the progress both write to the replay board is ``ReplayProgress``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from aiokafka import TopicPartition
from pydantic import Field, ValidationError

from worker.contract.delivery_log import Replay
from worker.contract.messages import Identifier, TopicRecord
from worker.contract.topics import Topics
from worker.contract.webhook_endpoints import EndpointRecord
from worker.contract.webhook_events import WebhookEvent, from_error, from_status, parse_rfc3339
from worker.engine.broker_health import BrokerHealth
from worker.engine.catch_up import high_water_marks
from worker.engine.client_start import AsideCloses
from worker.engine.fetch import skipping
from worker.engine.range_read import partitions, read_range
from worker.engine.writes import acknowledged, enqueue, send_retrying
from worker.runtime.logs import get_logger

log = get_logger("worker.api.webhooks.replay")  # the replays' lines keep their logger name

#: How much earlier than ``since`` a partition is read from: the broker's timestamps are the
#: producer's clock (Kafka's CreateTime) or the broker's (append time, on some brokers), and an
#: event's ``occurred_at`` the worker's.
SEEK_MARGIN_S: Final = 60.0
#: Records decoded between two yields to the event loop.
DECODE_SLICE: Final = 100
REPLAY_ID_RE: Final = re.compile(r"^rp_[0-9a-f]{32}$")
ERROR_CHARS: Final = 200
#: How often a running replay writes its progress (the board reads a silent one as stalled).
PROGRESS_EVERY_S: Final = 1.0
#: A replay's time budget: the front-end's ends there, a recovery's resumes at the next sweep.
REPLAY_TIMEOUT_S: Final = 300.0

ReplayState = Literal["queued", "running", "done", "cancelled", "failed"]
ENDED: Final = frozenset({"done", "cancelled", "failed"})


def recovery_replay_id(endpoint_id: str, disabled_at: float) -> str:
    """The one replay id of an endpoint's recovery from the disable at ``disabled_at``: a
    recovery resumed after a crash replays under the same id (the dispatcher's dedup window
    drops what it already took in)."""
    digest = hashlib.sha256(f"{endpoint_id}\0{disabled_at!r}".encode()).hexdigest()
    return f"rp_{digest[:32]}"


class ReplayProgress(TopicRecord):
    """One replay's state and counts (value on ``api.presence``, key: ``replay_id``)."""

    type: Literal["webhook_replay_status"] = "webhook_replay_status"
    replay_id: str = Field(pattern=REPLAY_ID_RE.pattern)
    workspace_id: Identifier
    endpoint_id: Identifier
    since: str = Field(max_length=64)
    state: ReplayState
    events_found: int = Field(default=0, ge=0)
    events_sent: int = Field(default=0, ge=0)
    events_failed: int = Field(default=0, ge=0)
    records_scanned: int = Field(default=0, ge=0)
    created_at: float
    updated_at: float
    error: str | None = Field(default=None, max_length=ERROR_CHARS)
    cancel_requested: bool = False
    recovery: bool = False  # a dispatcher's, of what a recovered endpoint missed

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def progress_record(
    replay_id: str,
    endpoint: EndpointRecord,
    since: datetime,
    state: ReplayState,
    created_at: float,
    counts: list[int] | None = None,
    **more: Any,
) -> ReplayProgress:
    """A replay's record now; ``counts``: events sent (acknowledged), records scanned,
    events found (the scan's)."""
    sent, scanned, found = counts or (0, 0, 0)
    return ReplayProgress(
        replay_id=replay_id,
        workspace_id=endpoint.workspace_id,
        endpoint_id=endpoint.id,
        since=since.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        state=state,
        events_found=found,
        events_sent=sent,
        records_scanned=scanned,
        created_at=created_at,
        updated_at=time.time(),
        **more,
    )


async def following(
    write: Callable[[], Awaitable[object]], every_s: float, stop: Callable[[], bool]
) -> None:
    """A running replay's progress notes, the front-end's and the dispatcher's: ``write()``
    every ``every_s`` (a failed one is said again by the next) until ``stop()``."""
    while await asyncio.sleep(every_s, True) and not stop():
        with contextlib.suppress(Exception):
            await write()


@dataclass(eq=False, kw_only=True)
class ReplayScan:
    """Scans for replays (of ``topics``: reads status and errors, writes webhook_replays).
    ``consumer_factory`` builds an unstarted, group-less consumer per topic scanned;
    ``producer`` is the process's started producer, ``health`` its sends' broker health."""

    consumer_factory: Callable[[], Any]
    producer: Any
    topics: Topics
    health: BrokerHealth = field(default_factory=BrokerHealth)
    seek_margin_s: float = SEEK_MARGIN_S

    def __post_init__(self) -> None:
        self.aside = AsideCloses()  # scans' consumers whose start a cancel cut short
        self._skip = skipping("webhook-replay", log)
        #: Records fetched by every scan of this process (all workspaces' events are read,
        #: the topics are keyed by account): what the scans cost.
        self.records_read = 0

    async def run(
        self,
        replay_id: str,
        endpoint: EndpointRecord,
        since: datetime,
        counts: list[int],
        *,
        start: dict[str, int] | None = None,
        deadline: float | None = None,
    ) -> dict[str, int]:
        """Read each topic's partitions from the first record stamped at or after ``since``
        less ``seek_margin_s`` (clocks that disagree) to their ends of now
        (``worker.engine.range_read``), on a consumer per topic (one assigned to a topic does
        not learn another's metadata). An event is replayed only when its ``occurred_at`` is
        at or after ``since`` too, so an index that starts early costs reading, never a wrong
        delivery. ``counts`` (replayed and acknowledged, scanned, found) grows as it goes.
        Past ``deadline`` it stops between fetches: where (``topic:partition`` → offset, all
        before acknowledged), for ``start`` to resume from; ``{}`` once read to the end."""

        async def replay(tp: TopicPartition, records: list[Any]) -> None:
            self.records_read += len(records)
            counts[1] += len(records)
            counts[0] += await self._batch(replay_id, endpoint, since, tp, records, counts)

        at = int((since.timestamp() - self.seek_margin_s) * 1000)
        topics: tuple[str, ...] = (self.topics.status, self.topics.errors)
        start = start or {}
        if any(k.startswith(f"{self.topics.errors}:") for k in start):
            topics = topics[1:]  # auth.status was read to its end
        for topic in topics:
            consumer = self.consumer_factory()
            await self.aside.start(consumer)  # a start cut short is closed aside
            try:
                tps = await partitions(consumer, topic, deadline=time.monotonic() + 30.0)
                keys = {tp: f"{topic}:{tp.partition}" for tp in tps}
                resumed = bool(start) and topic == topics[0]
                spans = await read_range(
                    consumer, tps, replay, on_unreadable=self._skip, deadline=deadline,
                    offsets={tp: start.get(k, 0) for tp, k in keys.items()} if resumed else None,
                    since_ms=None if resumed else at,
                )  # fmt: skip
            finally:
                await consumer.stop()
            if not all(span.complete for span in spans.values()):
                return {keys[tp]: span.next for tp, span in spans.items()}
        return {}

    async def ends(self) -> dict[int, int]:
        """Where each webhook.replays partition ends now (partition → high-water mark): read
        after a scan's records were acknowledged, past all it queued, a killed run's too."""
        consumer = self.consumer_factory()
        await self.aside.start(consumer)
        try:
            tps = await partitions(
                consumer, self.topics.webhook_replays, deadline=time.monotonic() + 30.0
            )
            return {
                tp.partition: end for tp, end in (await high_water_marks(consumer, tps)).items()
            }
        finally:
            await consumer.stop()

    async def publish(self, topic: str, progress: ReplayProgress) -> None:
        """Write ``progress`` where every front-end's replay board reads it (``topic``:
        ``api.presence``, key: its replay id), acknowledged: a scan run by the dispatcher."""
        value = progress.model_dump_json().encode()
        key = progress.replay_id.encode()
        await send_retrying(self.producer, self.health, topic, value, key=key, partition=0)

    async def _batch(
        self,
        replay_id: str,
        endpoint: EndpointRecord,
        since: datetime,
        tp: TopicPartition,
        records: list[Any],
        counts: list[int],
    ) -> int:
        """Produce a ``Replay`` for each record of ``endpoint`` since ``since``, on the
        partition number the event was on (its account's lane); wait for the acks, sending
        again what an outage failed (a lost record would be a silently missing delivery)."""
        source: Literal["status", "errors"] = (
            "status" if tp.topic == self.topics.status else "errors"
        )
        decode = from_status if source == "status" else from_error
        sent = []
        for n, msg in enumerate(records, 1):
            if n % DECODE_SLICE == 0:
                await asyncio.sleep(0)  # the process's loop serves the rest meanwhile
            if msg.value is None:
                continue
            event = event_of(decode, msg.value)
            if (
                event is None
                or event.workspace_id != endpoint.workspace_id
                or not endpoint.subscribes(event.event_type)
                or not occurred_since(event, since)
            ):
                continue
            counts[2] += 1
            replay = Replay(
                replay_id=replay_id,
                endpoint_id=endpoint.id,
                workspace_id=endpoint.workspace_id,
                source=source,
                event=msg.value.decode("utf-8", "replace"),
            )
            sent.append(
                await enqueue(
                    self.producer,
                    self.topics.webhook_replays,
                    replay.model_dump_json().encode(),
                    key=event.account_id.encode(),
                    partition=msg.partition,
                )
            )
        await acknowledged(self.producer, self.health, sent)
        return len(sent)


def event_of(decode: Callable[[bytes], WebhookEvent], value: bytes) -> WebhookEvent | None:
    """The event ``value`` holds, or ``None`` when it holds none."""
    try:
        return decode(value)
    except ValidationError:
        return None  # not an event (the dispatcher skips it too)


def occurred_since(event: WebhookEvent, since: datetime) -> bool:
    try:
        return parse_rfc3339(event.occurred_at) >= since
    except ValueError:
        return False


__all__ = [
    "ENDED",
    "PROGRESS_EVERY_S",
    "REPLAY_ID_RE",
    "REPLAY_TIMEOUT_S",
    "SEEK_MARGIN_S",
    "ReplayProgress",
    "ReplayScan",
    "ReplayState",
    "event_of",
    "following",
    "occurred_since",
    "progress_record",
    "recovery_replay_id",
]
