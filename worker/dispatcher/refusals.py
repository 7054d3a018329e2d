"""Deliveries refused at take-in, which fail at once with their failure recorded (DLQ copy and
delivery log entry, acknowledged): a pair whose queue is full, a new pair past its endpoint's
cap in the partition, or a delivery past its workspace's cap of pending deliveries in the
process (docs/architecture.md, "Resource bounds")."""

from __future__ import annotations

from typing import Literal

from worker.dispatcher.delivery import DeliveryState, Pending, refused, remember
from worker.dispatcher.delivery_store import DeliveryStore
from worker.dispatcher.instrumentation import Refused
from worker.dispatcher.pair_writes import PairWrites
from worker.dispatcher.publish import DeliveryPublisher


class Refusals:
    """Refuses deliveries on the lane that takes their event in."""

    def __init__(
        self, store: DeliveryStore, publisher: DeliveryPublisher, writes: PairWrites
    ) -> None:
        self.store = store
        self._publisher = publisher
        self._writes = writes

    async def queue_full(
        self, partition: int, full: list[tuple[DeliveryState, Pending]], now: float
    ) -> tuple[Refused, ...]:
        """Deliveries whose pair's queue is full fail at once: DLQ copy and log entry first,
        then the pair remembers them (a crash in between refuses them again, never loses
        the failure)."""
        await self._fail(full, "queue_full", now)
        for state, delivery in full:
            # Its queue may have drained meanwhile (its lane attempts while this one awaits):
            # a pair no longer held is idle, not the full one seen at take-in.
            current = self.store.pair(partition, state.key) or state.model_copy(
                update={"queue": (), "failing_since": None}
            )
            self.store.put(partition, remember(current, delivery))
        await self._writes.write_now(partition, [state.key for state, _ in full])
        return tuple(
            Refused(state.endpoint_id, state.account_id, delivery.webhook_id, len(state.queue))
            for state, delivery in full
        )

    async def new_pairs(
        self,
        partition: int,
        crowded: list[tuple[DeliveryState, Pending]],
        now: float,
        *,
        workspace: bool = False,
    ) -> tuple[Refused, ...]:
        """Deliveries that would open a pair past their endpoint's cap (``endpoint_queue_full``)
        or pass their workspace's (``workspace`` true: ``workspace_queue_full``) fail at once:
        DLQ copy and log entry, acknowledged. Nothing is kept or written for the pair: the
        same event read again after a crash is refused again under the same webhook-id (a
        second failure entry, never a lost one)."""
        reason: Literal["endpoint_queue_full", "workspace_queue_full"] = (
            "workspace_queue_full" if workspace else "endpoint_queue_full"
        )
        await self._fail(crowded, reason, now)
        return tuple(
            Refused(
                state.endpoint_id,
                state.account_id,
                delivery.webhook_id,
                self.store.pending_deliveries(state.workspace_id)
                if workspace
                else self.store.pending_pairs(partition, state.endpoint_id),
                reason,
            )
            for state, delivery in crowded
        )

    async def _fail(
        self, refused_ones: list[tuple[DeliveryState, Pending]], reason: str, now: float
    ) -> None:
        for state, delivery in refused_ones:
            finished = refused(delivery, reason, now=now)
            await self._publisher.dead_letter(state, delivery, finished)
            await self._publisher.log_finished(state, delivery, finished)
