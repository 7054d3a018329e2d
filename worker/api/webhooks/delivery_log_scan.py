"""``GET .../deliveries`` as a bounded scan of the endpoint's delivery-log partition on demand: a
replica holds no log, a request reads at most ``window`` records, and a scan never queues (an
admission slot or ``NoRoom`` at once; docs/architecture.md, "Admission")."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass
from typing import Any, Final

from aiokafka import TopicPartition
from pydantic import ValidationError

from worker.api.webhooks.quotas import read_slots
from worker.contract.delivery_log import DeliveryLogEntry, decode_log
from worker.engine.client_start import AsideCloses
from worker.engine.fetch import skipping
from worker.engine.range_read import partitions, read_range
from worker.runtime.logs import get_logger

log = get_logger(__name__)

MAX_CONCURRENT_SCANS: Final = 4
"""Scans running at once on one process, each on its consumer (one consumer each)."""


class DeliveryScanFailed(Exception):
    """The scan did not finish in time or the broker failed it; the route answers 500."""


@dataclass(eq=False)
class DeliveryLogScan:
    """Reads one endpoint's entries of the delivery log on demand, each scan on a consumer of
    its own while it holds its ``admission`` slot, so never more than ``max_concurrent``."""

    consumer_factory: Callable[[], Any]
    topic: str
    _: KW_ONLY
    window: int
    timeout_s: float
    max_concurrent: InitVar[int] = MAX_CONCURRENT_SCANS

    def __post_init__(self, max_concurrent: int) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self.admission = read_slots("deliveries_scans", max_concurrent)
        self._started = False
        self._idle: list[Any] = []
        # Every one built and not stopped: at most max_concurrent (one per admission slot).
        self._consumers: list[Any] = []
        self._aside = AsideCloses()
        self._skip = skipping("delivery-log-scan", log)

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
        """The endpoint's entries in ``[lo, upto)`` of its partition (``None``: the end now, and
        ``window`` records before ``upto``), charged to ``owner``; ``NoRoom`` at once without a
        slot."""
        if not self._started:
            raise DeliveryScanFailed("not started")
        slot = self.admission.take(owner)  # NoRoom: refused now, never queued
        deadline = time.monotonic() + self.timeout_s
        try:
            with slot:  # released after the consumer is given back (same step, no await)
                async with asyncio.timeout(self.timeout_s):
                    consumer = await self._take()
                    try:
                        return await self._slice(consumer, endpoint_id, upto, lo, deadline)
                    finally:
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
        if self._idle:
            return self._idle.pop()
        return await self._build()

    def _give_back(self, consumer: Any) -> None:
        if consumer in self._consumers:  # not when stopped meanwhile
            self._idle.append(consumer)

    async def _build(self) -> Any:
        consumer = self.consumer_factory()
        # Cancelled (the request's time-out) or failed while starting: closed aside, so a
        # half-started consumer holds no connection.
        await self._aside.start(consumer)
        self._consumers.append(consumer)
        return consumer

    async def _slice(
        self, consumer: Any, endpoint_id: str, upto: int | None, lo: int | None, deadline: float
    ) -> LogSlice:
        """``read``'s scan (``worker.engine.range_read``): without ``upto``, the last
        ``window`` records before the end the partition had when the scan began; with it (a
        cursor's), ``[lo, upto)`` as given, never past that end nor wider than ``window``."""
        key = endpoint_id.encode()
        (tp,) = await partitions(consumer, self.topic, deadline=deadline, key=key)
        entries: list[tuple[tuple[int, int], DeliveryLogEntry]] = []

        def keep(_: TopicPartition, records: list[Any]) -> None:
            for msg in records:
                if msg.key != key:
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

        low = None if upto is None else min(max(lo or 0, upto - self.window), upto)
        span = (
            await read_range(
                consumer,
                [tp],
                keep,
                on_unreadable=self._skip,
                offsets=None if low is None else {tp: low},
                last=self.window if low is None else None,
                max_records=None if upto is None or low is None else upto - low,
            )
        )[tp]
        return LogSlice(tp.partition, span.start, span.end if upto is None else upto, entries)


@dataclass(frozen=True, slots=True)
class LogSlice:
    """An endpoint's entries read from ``[lo, hi)`` of ``partition``, oldest first, each with
    its position (offset, index in its record)."""

    partition: int
    lo: int
    hi: int
    entries: list[tuple[tuple[int, int], DeliveryLogEntry]]
