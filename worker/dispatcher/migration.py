"""Migrating the old delivery state (one ``webhook_account_deliveries`` record per account,
split into pair records on restore): on the account's lane, its pairs are written, then its key
tombstoned (docs/operations.md, "Upgrading the delivery state"). Remove on 2027-06-01, with the
old form's reading in ``delivery_store`` and ``Migrated`` in ``instrumentation``, once: no
dispatcher older than pair records runs anywhere or can come back by rollback; every partition
of ``webhook.delivery-state`` was restored by a migrating dispatcher since the last old one
stopped; and ``passkey_webhook_state_migrated_total`` no longer rises on any deployment."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from worker.dispatcher.delivery import state_key
from worker.dispatcher.delivery_store import DeliveryStore
from worker.dispatcher.instrumentation import Instrumentation, Migrated
from worker.dispatcher.publish import DeliveryPublisher

#: Writes pairs' records and waits for their acks (``PairWrites.write_now``).
WriteNow = Callable[[int, Sequence[str]], Awaitable[None]]


def is_old_form(key: str) -> bool:
    """Whether a due key is an old-form account record's (an account id, no ``/``) rather
    than a pair's (``endpoint_id/account_id``)."""
    return "/" not in key


class Migration:
    """Migrates one old-form account record at a time, as its due key comes up on its lane."""

    def __init__(
        self,
        store: DeliveryStore,
        publisher: DeliveryPublisher,
        write_now: WriteNow,
        instrument: Instrumentation,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.write_now = write_now
        self.instrument = instrument

    async def follow_up(self, partition: int, account_id: str) -> None:
        """The due key of an old-form record: migrate it, counted and logged."""
        await self.instrument.run_migration(
            partition, account_id, lambda: self.migrate(partition, account_id)
        )

    async def migrate(self, partition: int, account_id: str) -> Migrated | None:
        """Write the pairs of an old-form account record, then tombstone its key."""
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
        return Migrated(account_id, len(keys))
