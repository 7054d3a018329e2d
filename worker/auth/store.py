"""The worker's account records per owned partition (docs/architecture.md, "Write-ahead
intent")."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import ClassVar

from worker.contract.messages import AccountRecord, decode_record
from worker.engine.store import PartitionedStore
from worker.engine.timers import Timer


class StateStore(PartitionedStore[AccountRecord]):
    """The worker's account records, and the follow-up timers of the accounts in flow on a heap
    by due time (O(log n) each, not a scan); ``inherited`` tracks each partition's hand-over."""

    tracks_handover: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        #: Live (not deregistered) accounts per workspace, per owned partition: one entry per
        #: workspace with a live account on the partition (dropped at 0 and with the
        #: partition). What a ``register_account`` is held to the account quota by.
        self.live_accounts: dict[int, dict[str, int]] = {}
        #: New live accounts decided and not yet stored, per (partition, workspace): counted
        #: with the stored ones, so that registrations running side by side (one lane per
        #: account) cannot pass the quota together. Dropped at 0; ≤ the lanes running.
        self.joining_accounts: dict[tuple[int, str], int] = {}
        #: Called with a partition before its records are dropped (a revocation, or a
        #: partition restored again): the executor's parked long-polls are answered from
        #: the records still held (``worker.auth.waits``).
        self.before_drop: Callable[[int], None] | None = None

    def workspace_accounts(self, partition: int, workspace_id: str) -> int:
        """Live accounts of ``workspace_id`` on ``partition``, those being stored included."""
        stored = self.live_accounts.get(partition, {}).get(workspace_id, 0)
        return stored + self.joining_accounts.get((partition, workspace_id), 0)

    @contextlib.contextmanager
    def joining(self, partition: int, workspace_id: str) -> Iterator[None]:
        """A new live account of ``workspace_id`` is being published: counted meanwhile.
        Entered for new accounts only: a generator per command costs more than the count."""
        key = (partition, workspace_id)
        self.joining_accounts[key] = self.joining_accounts.get(key, 0) + 1
        try:
            yield
        finally:
            left = self.joining_accounts[key] - 1
            if left:
                self.joining_accounts[key] = left
            else:
                del self.joining_accounts[key]

    def put(self, partition: int, record: AccountRecord) -> None:
        before = self.get(partition, record.account_id)
        super().put(partition, record)
        if before is not None and not before.deregistered:
            self._count(partition, before.workspace_id, -1)
        if not record.deregistered:
            self._count(partition, record.workspace_id, 1)

    def drop(self, partition: int) -> None:
        if self.before_drop is not None:
            self.before_drop(partition)
        super().drop(partition)
        self.live_accounts.pop(partition, None)

    def _count(self, partition: int, workspace_id: str, delta: int) -> None:
        counts = self.live_accounts.setdefault(partition, {})
        left = counts.get(workspace_id, 0) + delta
        if left > 0:
            counts[workspace_id] = left
        else:
            counts.pop(workspace_id, None)
            if not counts:
                del self.live_accounts[partition]

    @property
    def following(self) -> dict[str, Timer]:
        """Each account in flow and its live timer."""
        return self.timers.live

    @property
    def _timers(self) -> list[Timer]:
        return self.timers.heap

    @staticmethod
    def decode(value: bytes) -> tuple[str, AccountRecord]:
        record = decode_record(value)
        return record.account_id, record

    def key_of(self, record: AccountRecord) -> str:
        return record.account_id

    def _arm(self, partition: int, record: AccountRecord) -> None:
        fu = record.follow_up
        if fu is not None and not record.deregistered:
            self.timers.arm(record.account_id, partition, min(fu.next_poll_at, fu.deadline_at))
        else:
            self.timers.cancel(record.account_id)

    def _timer_keys(self, record: AccountRecord) -> list[str]:
        return [record.account_id]
