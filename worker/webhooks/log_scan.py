"""``GET .../deliveries`` as a bounded, on-demand scan of the endpoint's partition of the
delivery log, one at a time per process: a replica holds no log and a request costs at most
``window`` records (docs/architecture.md, "A replica's cost follows its own traffic")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition

from worker.engine.fetch import getmany as fetch_records
from worker.engine.fetch import skipping
from worker.engine.route import home_partition
from worker.engine.tail import partitions_of
from worker.runtime.logs import get_logger
from worker.webhooks.log_view import DeliveryLogView
from worker.webhooks.publish import DeliveryLogEntry

log = get_logger(__name__)

SHOWN_MAX = 100
"""Deliveries one answer shows at most (docs/api.md)."""


class DeliveryScanFailed(Exception):
    """The scan did not finish in time or the broker failed it; the route answers 500."""


class DeliveryLogScan:
    """Reads one endpoint's recent deliveries from ``topic`` on demand.

    ``consumer_factory`` builds an unstarted, group-less consumer; ``start`` builds and starts
    it, ``stop`` closes it. ``window`` is how many of the partition's last records a scan
    reads at most (plus one fetched batch).
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
    ) -> None:
        self._factory = consumer_factory
        self.topic = topic
        self.window = window
        self.timeout_s = timeout_s
        self._idle_timeout_ms = idle_timeout_ms
        self._max_records = max_records
        self._consumer: Any = None
        self._turn = asyncio.Lock()
        self._skip = skipping("delivery-log-scan", log)
        self.scans = 0
        self.records_read = 0

    async def start(self) -> None:
        consumer = self._factory()
        await consumer.start()
        self._consumer = consumer

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def recent(self, endpoint_id: str) -> list[DeliveryLogEntry]:
        """The endpoint's most recent deliveries (at most ``SHOWN_MAX``), most recently
        changed first; raises ``DeliveryScanFailed``."""
        deadline = time.monotonic() + self.timeout_s
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._turn:
                    return await self._scan(endpoint_id, deadline)
        except TimeoutError:
            log.warning("delivery_scan_timeout", endpoint_id=endpoint_id, timeout_s=self.timeout_s)
            raise DeliveryScanFailed("the scan did not finish in time") from None
        except DeliveryScanFailed:
            raise
        except Exception as exc:  # a broker error: the request fails, the process goes on
            log.error("delivery_scan_failed", endpoint_id=endpoint_id, error=repr(exc)[:300])
            raise DeliveryScanFailed(repr(exc)) from None

    async def _partition(self, key: bytes, deadline: float) -> TopicPartition:
        consumer = self._consumer
        if consumer is None:
            raise DeliveryScanFailed("not started")
        parts = await partitions_of(consumer, self.topic, deadline=deadline, pause_s=0.05)
        if not parts:
            raise DeliveryScanFailed(f"topic {self.topic!r} has no partitions")
        return TopicPartition(self.topic, home_partition(key, len(parts)))

    async def _scan(self, endpoint_id: str, deadline: float) -> list[DeliveryLogEntry]:
        consumer = self._consumer
        key = endpoint_id.encode()
        tp = await self._partition(key, deadline)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, max(0, end - self.window))
        view = DeliveryLogView(per_endpoint=SHOWN_MAX)
        target: int | None = None
        read = 0
        while True:
            batch = await fetch_records(
                consumer,
                timeout_ms=self._idle_timeout_ms,
                max_records=self._max_records,
                on_unreadable=self._skip,
                owned=[tp],
            )
            records = batch.get(tp, ())
            read += len(records)
            view.handle(r for r in records if r.key == key)
            if target is None:
                target = consumer.highwater(tp)  # the end as of the first response
            if target is not None and await consumer.position(tp) >= target:
                break
            if read > self.window + self._max_records:
                break  # a short end estimate on a busy partition: enough has been read
        self.scans += 1
        self.records_read += read
        return view.of_endpoint(endpoint_id, limit=SHOWN_MAX)
