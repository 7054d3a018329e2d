"""Resends and test sends: one delivery queued on the replay topic, keyed by its account so its lane
takes it behind the account's newer events. A resend carries the logged body and event id, so it
goes out under the same webhook-id with the same bytes (docs/operations.md, "Quotas")."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Final, Literal

from worker.api.request_rate import RateLimiter
from worker.api.webhooks.quotas import Refused
from worker.contract.delivery_log import DeliveryLogEntry, Replay, webhook_id
from worker.contract.messages import rfc3339
from worker.contract.webhook_endpoints import EndpointRecord
from worker.contract.webhook_events import EventCopy
from worker.engine.broker_health import BrokerHealth
from worker.engine.writes import acknowledged, enqueue

SENDS: Final = "webhook_sends"
"""The ``quota`` label of a refused resend or test send."""
SENDS_PER_MINUTE: Final = 30
"""``WEBHOOK_SENDS_PER_MINUTE`` by default: resends and test sends a workspace may queue per
minute on one front-end, a burst of a third of it."""


def new_send_id(kind: Literal["resend", "test"]) -> str:
    """``rs_`` (resend) or ``ts_`` (test) + 32 hex characters: the delivery's own id beside
    its webhook-id (the dispatcher's de-duplication keeps each such send once)."""
    return f"{'rs' if kind == 'resend' else 'ts'}_{uuid.uuid4().hex}"


class SendBudget:
    """Resends and test sends per workspace (a ``RateLimiter``; 429 past it); each process takes
    its share of the live replicas', so the budget holds across replicas."""

    def __init__(self, per_minute: int, *, replicas: Callable[[], int] | None = None) -> None:
        self.per_minute = per_minute
        self.burst = max(1, per_minute // 3)
        self.limiter = (
            RateLimiter(per_minute / 60.0, self.burst, replicas=replicas)
            if per_minute > 0
            else None
        )

    def spend(self, workspace_id: str) -> None:
        if self.limiter is None:
            return
        wait = self.limiter.take(workspace_id)
        if wait > 0:
            raise Refused.too_many(
                SENDS,
                f"The workspace queued its {self.per_minute} resends and test sends of this"
                " minute; retry after Retry-After seconds. Nothing was queued.",
                max(1, int(wait + 0.999)),
            )


class DeliverySends:
    """Puts one delivery on the replay topic, its ``pending`` entry on the delivery log first,
    and waits for the broker's acks: the answer's ``delivery_id`` can be read at once, and the
    dispatcher's entries, written after it, are the later ones. (A replay record that then
    fails to be written leaves that entry pending; the answer says the outcome is unknown.)"""

    def __init__(self, producer: Any, topic: str, *, log_topic: str, health: BrokerHealth) -> None:
        self._producer = producer
        self._topic = topic
        self._log_topic = log_topic
        self._health = health

    async def queue(self, endpoint: EndpointRecord, copy: EventCopy, send_id: str) -> None:
        now = rfc3339(time.time())
        entry = DeliveryLogEntry(
            webhook_id=webhook_id(copy.event_id, endpoint.id),
            endpoint_id=endpoint.id,
            workspace_id=endpoint.workspace_id,
            account_id=copy.account_id,
            event_type=copy.event_type,
            event_id=copy.event_id,
            version=copy.version,
            attempts=0,
            state="pending",
            next_attempt_at=now,
            updated_at=now,
            replay=send_id,
            body=copy.body,
            occurred_at=copy.occurred_at,
        )
        replay = Replay(
            replay_id=send_id,
            endpoint_id=endpoint.id,
            workspace_id=endpoint.workspace_id,
            source="webhook",
            event=copy.model_dump_json(),
        )
        # The log's entry acknowledged first, then the send, keyed by its account.
        for topic, record, key in (
            (self._log_topic, entry, endpoint.id),
            (self._topic, replay, copy.account_id),
        ):
            sent = await enqueue(
                self._producer, topic, record.model_dump_json().encode(), key=key.encode()
            )
            await acknowledged(self._producer, self._health, [sent])


__all__ = ["SENDS", "DeliverySends", "SendBudget", "new_send_id"]
