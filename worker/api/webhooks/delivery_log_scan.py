"""``GET .../deliveries`` as a bounded, on-demand scan of the endpoint's partition of the
delivery log: a replica holds no log and a request costs at most ``window`` records
(docs/architecture.md, "A replica's cost follows its own traffic"). Scans never queue: each
takes a slot through the admission rule (``max_concurrent`` per process, one per workspace, the
seconds held charged to the workspace) or is refused at once with ``NoRoom``, and runs on a
consumer of its own (``DeliveryLogScan``; docs/architecture.md, "Admission")."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from aiokafka import TopicPartition
from pydantic import ValidationError

from worker.api.webhooks.quotas import SCAN_RETRY_AFTER_S, SCAN_TIME
from worker.engine.client_start import AsideCloses
from worker.engine.fetch import getmany as fetch_records
from worker.engine.fetch import skipping
from worker.engine.home_partition import home_partition
from worker.engine.tail import partitions_of
from worker.runtime.admission import Admission, Share, TimeCharge
from worker.runtime.logs import get_logger
from worker.webhooks.publish import DeliveryLogEntry, decode_log

log = get_logger(__name__)

Scanned = TypeVar("Scanned")

MAX_CONCURRENT_SCANS: Final = 4
"""Scans running at once on one process, each on its consumer (one consumer each)."""


class DeliveryScanFailed(Exception):
    """The scan did not finish in time or the broker failed it; the route answers 500."""


class DeliveryLogScan:
    """Reads one endpoint's entries of the delivery log from ``topic`` on demand (``read``).

    ``consumer_factory`` builds an unstarted, group-less consumer; ``start`` builds and starts
    the first, a scan that finds none idle builds another; ``stop`` closes them all.
    ``window`` is how many of the partition's last records a scan reads at most (plus one
    fetched batch).

    A scan first takes a slot of ``admission`` for its workspace (``max_concurrent`` slots, one
    per workspace, ``time_charge`` charged; ``clock`` for tests), else ``NoRoom`` at once: a
    workspace whose scans are slow holds one slot and spends its own time, never the others',
    and nothing waits for a slot, so no request turns into a 500 behind other workspaces'
    scans. Each running scan holds its slot and one consumer, so there are never more
    consumers than ``max_concurrent``.
    """

    def __init__(
        self,
        consumer_factory: Callable[[], Any],
        topic: str,
        *,
        window: int,
        timeout_s: float,
        idle_timeout_ms: int = 200,
        max_records: int = 2000,
        max_concurrent: int = MAX_CONCURRENT_SCANS,
        time_charge: TimeCharge = SCAN_TIME,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self._factory = consumer_factory
        self.topic = topic
        self.window = window
        self.timeout_s = timeout_s
        self.max_concurrent = max_concurrent
        self._idle_timeout_ms = idle_timeout_ms
        self._max_records = max_records
        self.admission = Admission(
            "deliveries_scans",
            Share(capacity=max_concurrent, per_owner=1),
            time=time_charge,
            retry_after_s=SCAN_RETRY_AFTER_S,
            clock=clock,
        )
        self._started = False
        self._idle: list[Any] = []
        # Every one built and not stopped: at most max_concurrent (one per admission slot).
        self._consumers: list[Any] = []
        self._aside = AsideCloses()
        self._skip = skipping("delivery-log-scan", log)
        self.scans = 0
        self.records_read = 0
        #: Scans under way now, and the most there were at once.
        self.running = 0
        self.peak_running = 0

    @property
    def consumers(self) -> int:
        """Consumers built and open (at most ``max_concurrent``)."""
        return len(self._consumers)

    async def start(self) -> None:
        self._started = True
        self._idle.append(await self._build())

    async def stop(self) -> None:
        self._started = False
        consumers, self._consumers, self._idle = self._consumers, [], []
        for consumer in consumers:
            with contextlib.suppress(Exception):
                await consumer.stop()
        await self._aside.drain()

    async def read(
        self, endpoint_id: str, *, owner: str, upto: int | None, lo: int | None
    ) -> LogSlice:
        """The endpoint's entries in ``[lo, upto)`` of its partition, with their positions:
        ``upto`` ``None`` is the end now, ``lo`` ``None`` is ``window`` records before
        ``upto`` (never before the partition's start). The scan is charged to ``owner`` (the
        workspace); raises ``NoRoom`` at once when it has no slot, ``DeliveryScanFailed``."""
        return await self._run(
            endpoint_id, owner, lambda c, d: self._slice(c, endpoint_id, upto, lo, d)
        )

    async def _run(
        self, endpoint_id: str, owner: str, scan: Callable[[Any, float], Awaitable[Scanned]]
    ) -> Scanned:
        if not self._started:
            raise DeliveryScanFailed("not started")
        slot = self.admission.take(owner)  # NoRoom: refused now, never queued
        deadline = time.monotonic() + self.timeout_s
        try:
            with slot:  # released after the consumer is given back (same step, no await)
                async with asyncio.timeout(self.timeout_s):
                    consumer = await self._take()
                    self.running += 1
                    self.peak_running = max(self.peak_running, self.running)
                    try:
                        return await scan(consumer, deadline)
                    finally:
                        self.running -= 1
                        self._give_back(consumer)
        except TimeoutError:
            log.warning("delivery_scan_timeout", endpoint_id=endpoint_id, timeout_s=self.timeout_s)
            raise DeliveryScanFailed("the scan did not finish in time") from None
        except DeliveryScanFailed:
            raise
        except Exception as exc:  # a broker error: the request fails, the process goes on
            log.error("delivery_scan_failed", endpoint_id=endpoint_id, error=repr(exc)[:300])
            raise DeliveryScanFailed(repr(exc)) from None

    async def _take(self) -> Any:
        """An idle consumer, or a new one (the admission slot held bounds how many)."""
        if not self._started:
            raise DeliveryScanFailed("not started")
        if self._idle:
            return self._idle.pop()
        return await self._build()

    def _give_back(self, consumer: Any) -> None:
        if consumer in self._consumers:  # not when stopped meanwhile
            self._idle.append(consumer)

    async def _build(self) -> Any:
        consumer = self._factory()
        # Cancelled (the request's time-out) or failed while starting: closed aside, so a
        # half-started consumer holds no connection.
        await self._aside.start(consumer)
        self._consumers.append(consumer)
        return consumer

    async def _partition(self, consumer: Any, key: bytes, deadline: float) -> TopicPartition:
        parts = await partitions_of(consumer, self.topic, deadline=deadline, pause_s=0.05)
        if not parts:
            raise DeliveryScanFailed(f"topic {self.topic!r} has no partitions")
        return TopicPartition(self.topic, home_partition(key, len(parts)))

    async def _slice(
        self, consumer: Any, endpoint_id: str, upto: int | None, lo: int | None, deadline: float
    ) -> LogSlice:
        """``read``'s scan. Without ``upto`` the end is the high-water mark of the first
        fetch's answer when that is further than ``end_offsets`` said (the embedded broker
        answers the start of its last batch there), and the start follows it, so a slice
        is never wider than ``window``; with ``upto`` (a cursor's) the slice is as given,
        read within the same budget of records whatever it says."""
        key = endpoint_id.encode()
        tp = await self._partition(consumer, key, deadline)
        consumer.assign([tp])
        start = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        hi = end if upto is None else upto
        low = max(start, hi - self.window if lo is None else lo)
        entries: list[tuple[tuple[int, int], DeliveryLogEntry]] = []
        if upto is not None and hi <= low:
            return LogSlice(tp.partition, low, hi, entries)
        consumer.seek(tp, low)
        read = 0
        idle = 0
        learned = upto is not None
        while idle < 3 and (not learned or await consumer.position(tp) < hi):
            batch = await fetch_records(
                consumer,
                timeout_ms=self._idle_timeout_ms,
                max_records=self._max_records,
                on_unreadable=self._skip,
                owned=[tp],
            )
            records = batch.get(tp, ())
            read += len(records)
            if not learned:
                highwater = consumer.highwater(tp)
                if highwater is None and not records:
                    # No answer for the partition yet (a new consumer still connecting, a
                    # loaded broker): an empty poll says nothing of it, so it neither ends
                    # the scan nor counts as idle; the scan's time-out bounds the wait.
                    continue
                learned = True
                if highwater is not None and highwater > hi:
                    hi = highwater
                    low = max(low, hi - self.window)
            idle = 0 if records else idle + 1  # a gap the broker never fills: stop
            if read > self.window + self._max_records:
                break  # a cursor's end past the partition's: no more than a page's budget
            for msg in records:
                if not low <= msg.offset < hi or msg.key != key:
                    continue
                try:
                    decoded = decode_log(msg.value or b"")
                except ValidationError:
                    log.error(
                        "delivery_log_undecodable", partition=msg.partition, offset=msg.offset
                    )
                    continue
                entries.extend(
                    ((msg.offset, i), e)
                    for i, e in enumerate(decoded)
                    if e.endpoint_id == endpoint_id
                )
        self.scans += 1
        self.records_read += read
        return LogSlice(tp.partition, low, hi, entries)


@dataclass(frozen=True, slots=True)
class LogSlice:
    """An endpoint's entries read from ``[lo, hi)`` of ``partition``, oldest first, each with
    its position (offset, index in its record)."""

    partition: int
    lo: int
    hi: int
    entries: list[tuple[tuple[int, int], DeliveryLogEntry]]
