"""Writing pairs' delivery states so that what they hold is safe: a write's acks release the
share of their events' holds that the pairs' unsaved deliveries took (each logged ``pending``
beside it), and an event held too long gets its pairs written (docs/architecture.md, "Webhook
fan-out"); an old-form account record migrated to pair records."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from worker.dispatcher.delivery import DeliveryState, Pending, marker, state_key
from worker.dispatcher.delivery_store import DeliveryStore
from worker.dispatcher.holds import EventHold
from worker.dispatcher.instrumentation import log
from worker.dispatcher.publish import DeliveryPublisher
from worker.engine.compacted_view import Chores
from worker.engine.offsets import hold_record


class PairWrites:
    """The dispatcher's writes of pair states, and the holds of the events being taken in."""

    def __init__(
        self,
        store: DeliveryStore,
        publisher: DeliveryPublisher,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self._clock = clock
        self._chores = Chores("dispatcher-writes")
        self._overdue: dict[int, list[EventHold]] = {}
        """Per partition, the holds whose overdue call came since its write was started: one
        write for all of them (``_write_overdue`` takes them at its first step)."""

    async def write(
        self, partition: int, keys: Sequence[str], *, logged: str | None = None
    ) -> Awaitable[None]:
        """``send_states`` that also makes the pairs' unsaved deliveries safe: what waits for
        the acks then releases their share of their events' holds. Each unsaved delivery
        written here gets its first delivery-log entry, ``pending``, beside its record, but
        the one marked ``logged`` (the head whose attempt the caller logs)."""
        taken = self.store.unsaved.take(partition, list(keys))
        try:
            written = await self.publisher.send_states(partition, keys, store=self.store)
        except BaseException:
            self.store.unsaved.put_back(partition, taken)
            raise
        if not taken:
            return written
        first = self._first_entries(partition, taken, logged)
        return self._released_when(written, first, partition, taken)

    def _first_entries(
        self, partition: int, taken: list[tuple[str, str, EventHold]], logged: str | None
    ) -> Awaitable[None] | None:
        """The ``pending`` entries of the deliveries a write makes durable before any attempt
        of theirs is logged: one taken in and attempted within its hold never needs one."""
        marks: dict[str, set[str]] = {}
        for key, mark, _ in taken:
            if mark != logged:
                marks.setdefault(key, set()).add(mark)
        first: list[tuple[DeliveryState, Pending]] = []
        for key, ours in marks.items():
            state = self.store.pair(partition, key)
            if state is not None:
                first.extend((state, d) for d in state.queue if marker(d) in ours)
        return self.publisher.log_pending(first, now=self._clock()) if first else None

    async def _released_when(
        self,
        written: Awaitable[None],
        first: Awaitable[None] | None,
        partition: int,
        taken: list[tuple[str, str, EventHold]],
    ) -> None:
        try:
            await written
        except BaseException:
            self.store.unsaved.put_back(partition, taken)
            raise
        finally:
            if first is not None:
                await first
        for _, _, event_hold in taken:
            event_hold.done()

    async def write_now(self, partition: int, keys: Sequence[str]) -> None:
        """``write``, and wait for the acks."""
        acknowledged = await self.write(partition, keys)
        await acknowledged

    async def save_unsaved(self, partition: int, key: str) -> None:
        """The pair's lane stops working on it (its head is not due, or its endpoint has no
        room): what it keeps in memory only is written now."""
        if self.store.unsaved.has(partition, key):
            await self.write_now(partition, [key])

    async def migrate(self, partition: int, account_id: str) -> int | None:
        """Write the pairs of an old-form account record (``delivery_store.AccountDeliveries``),
        then tombstone its key; how many pairs were written (``None``: no such record). See
        docs/operations.md, "Upgrading the delivery state". Remove on 2027-06-01, with the old
        form's reading in ``delivery_store``, once no dispatcher older than pair records runs
        anywhere or can come back by rollback; every partition of ``webhook.delivery-state``
        was restored by a migrating dispatcher since the last old one stopped; and
        ``passkey_webhook_state_migrated_total`` no longer rises on any deployment."""
        legacy = self.store.legacy(partition, account_id)
        if legacy is None:
            return None
        keys = [
            key
            for endpoint_id in legacy.endpoints
            if self.store.pair(partition, key := state_key(endpoint_id, account_id)) is not None
        ]
        await self.write_now(partition, keys)
        await self.publisher.tombstone(partition, account_id)
        self.store.forget_legacy(partition, account_id)
        return len(keys)

    def hold(self, partition: int) -> EventHold | None:
        """A hold on the event being taken in, shared by its deliveries; ``None`` outside
        the consume loop."""
        event_hold: EventHold | None = None

        def overdue() -> None:
            if event_hold is not None and not event_hold.released:
                due = self._overdue.get(partition)
                if due is None:
                    due = self._overdue[partition] = []
                    self._chores.quietly(self._write_overdue(partition))
                due.append(event_hold)

        hold = hold_record(on_overdue=overdue)
        if hold is None:
            return None
        event_hold = EventHold(hold, partition)
        return event_hold

    async def _write_overdue(self, partition: int) -> None:
        """Events held too long (their endpoint hangs, or their pairs wait behind one): write
        the pairs that still keep their deliveries in memory only, so their offsets go free.
        The events of one partition whose holds came due in one commit tick (a backlog's, by
        the thousand) are written together: one write, each pair once."""
        holds = self._overdue.pop(partition, [])
        unsaved = self.store.unsaved
        keys = sorted({k for hold in holds for k in hold.keys if unsaved.has(partition, k)})
        if not keys:
            return
        try:
            await self.write_now(partition, keys)
        except Exception as exc:  # the hold stays (not committed); the pair's next write frees it
            log.error("overdue_write_failed", pairs=len(keys), error=repr(exc)[:300])
