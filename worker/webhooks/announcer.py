"""Publishes operational events (``worker.contract.operational_events``) to ``webhook.replays``:
the front-end announces ``endpoint.enabled``, the dispatcher ``endpoint.disabled``, each before
the endpoint write (docs/architecture.md, "Operational events")."""

from __future__ import annotations

from typing import Any

from worker.contract.operational_events import OperationalRecord
from worker.engine.broker_health import BrokerHealth
from worker.engine.writes import send_retrying


class Announcer:
    """Publishes operational records to ``webhook.replays`` and waits for the ack (re-sent
    through a broker outage): the caller writes the endpoint only after it returns."""

    def __init__(self, producer: Any, topic: str, health: BrokerHealth | None = None) -> None:
        self._producer = producer
        self.topic = topic
        self._health = health or BrokerHealth()

    async def announce(self, record: OperationalRecord) -> None:
        await send_retrying(
            self._producer,
            self._health,
            self.topic,
            record.model_dump_json().encode(),
            key=record.endpoint_id.encode(),
        )


__all__ = ["Announcer"]
