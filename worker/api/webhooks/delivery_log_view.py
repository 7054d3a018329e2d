"""The read model behind ``GET .../deliveries``: decodes log records and keeps the latest entry
of each endpoint's most recent deliveries, filled by ``worker.api.webhooks.delivery_log_scan``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from worker.runtime.logs import get_logger
from worker.webhooks.publish import DeliveryLogEntry, decode_log

log = get_logger(__name__)


class DeliveryLogView:
    """Recent deliveries by endpoint, newest last."""

    def __init__(self, *, per_endpoint: int = 100) -> None:
        self._per_endpoint = per_endpoint
        self._recent: dict[str, OrderedDict[str, DeliveryLogEntry]] = {}
        self.undecodable = 0

    def handle(self, records: Iterable[Any]) -> None:
        for msg in records:
            try:
                entries = decode_log(msg.value or b"")
            except ValidationError:
                self.undecodable += 1
                log.error("delivery_log_undecodable", partition=msg.partition, offset=msg.offset)
                continue
            for entry in entries:
                self.add(entry)

    def add(self, entry: DeliveryLogEntry) -> None:
        recent = self._recent.setdefault(entry.endpoint_id, OrderedDict())
        recent.pop(entry.webhook_id, None)
        recent[entry.webhook_id] = entry
        while len(recent) > self._per_endpoint:
            recent.popitem(last=False)

    def of_endpoint(self, endpoint_id: str, *, limit: int = 100) -> list[DeliveryLogEntry]:
        """The endpoint's recent deliveries, most recently changed first."""
        recent = self._recent.get(endpoint_id)
        if not recent:
            return []
        return list(reversed(recent.values()))[:limit]

    def forget(self, endpoint_id: str) -> None:
        self._recent.pop(endpoint_id, None)
