"""The worker's account records per owned partition, and the follow-up timers of the accounts
in flow; which commands a previous owner may have sent (docs/architecture.md,
"Write-ahead intent")."""

from __future__ import annotations

from typing import ClassVar

from worker.contract.messages import AccountRecord, decode_record
from worker.engine.store import PartitionedStore
from worker.engine.timers import Timer


class StateStore(PartitionedStore[AccountRecord]):
    """The worker's account records, and the follow-up timers of the accounts in flow.

    The timers are a heap by due time, so finding the due ones costs O(log n) each instead
    of a scan of every account in flow four times a second. A record in flow arms its
    account's timer; a settled or deregistered one cancels it.

    It tracks the hand-over of each command partition (``inherited``): a confirm that a
    previous owner may have sent to the provider is re-driven instead of sent blind
    (docs/architecture.md, "Write-ahead intent").
    """

    tracks_handover: ClassVar[bool] = True

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
