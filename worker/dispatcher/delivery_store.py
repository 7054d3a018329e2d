"""The dispatcher's state store: one delivery-state record per (endpoint, account) pair, in
its account's partition, restored on assignment; the old one-record-per-account form is read
and migrated (``PairWrites.migrate``; docs/operations.md, "Upgrading the delivery state")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from worker.dispatcher.delivery import SEEN_KEPT, DeliveryState, marker
from worker.dispatcher.holds import Unsaved
from worker.engine.store import PartitionedStore

WorkspaceOf = Callable[[str], str | None]
"""An endpoint id → the workspace that owns it (``None``: unknown)."""


class AccountDeliveries(BaseModel):
    """The old form of the delivery-state topic's value, one per account (key: account id):
    read on restore and migrated to pair records, never written any more."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["webhook_account_deliveries"] = "webhook_account_deliveries"
    schema_version: Literal[1] = 1
    account_id: str
    workspace_id: str
    endpoints: dict[str, DeliveryState] = {}


def decode_state(value: bytes) -> tuple[str, DeliveryState | AccountDeliveries]:
    """A changelog value as (key, record), in either form; raises
    ``pydantic.ValidationError`` for anything else."""
    try:
        state = DeliveryState.model_validate_json(value)
    except ValidationError:
        legacy = AccountDeliveries.model_validate_json(value)
        return legacy.account_id, legacy
    return state.key, state


def merge(newer: DeliveryState, older: DeliveryState) -> DeliveryState:
    """``newer`` (a pair record) plus what only ``older`` (the same pair inside an account
    record) holds: deliveries it queued that ``newer`` never saw, in their order behind
    ``newer``'s own, and its dedup markers. A delivery both know is kept once; at worst one
    already delivered is sent again under its own webhook-id (at-least-once)."""
    known = set(newer.seen) | {marker(p) for p in newer.queue}
    extra = tuple(p for p in older.queue if marker(p) not in known)
    seen = (*(m for m in older.seen if m not in known), *newer.seen)[-SEEN_KEPT:]
    return newer.model_copy(update={"queue": (*newer.queue, *extra), "seen": seen})


class DeliveryStore(PartitionedStore[DeliveryState | AccountDeliveries]):
    """Delivery states by pair key, a timer per pair whose queue waits, and the old-form
    account records still to migrate (a timer under the account id each).

    Only pairs with something pending are held (``put`` of an idle pair drops it); ``live``
    says which have a value on the changelog, so a dropped pair's record is tombstoned
    (``stale``) and one never written needs no write. ``defer`` keeps a pair waiting for its
    endpoint from running again on every event; ``claim`` keeps the sweep from finding a pair
    due, and its lane busy, again and again while the lane works on it. ``unsaved``: the
    deliveries in memory only (``holds``).
    """

    def __init__(self, *, workspace_of: WorkspaceOf | None = None) -> None:
        super().__init__()
        self._workspace_of = workspace_of
        self._deferred: dict[str, float] = {}
        self._live: dict[int, set[str]] = {}
        self._pending: dict[int, Counter[str]] = {}
        self._workspace_pending: dict[int, Counter[str]] = {}
        self._workspace_total: Counter[str] = Counter()
        self._parked: dict[int, set[str]] = {}
        self._claimed: set[str] = set()
        self.unsaved = Unsaved()

    @staticmethod
    def decode(value: bytes) -> tuple[str, DeliveryState | AccountDeliveries]:
        return decode_state(value)

    def key_of(self, record: DeliveryState | AccountDeliveries) -> str:
        return record.account_id if isinstance(record, AccountDeliveries) else record.key

    def pair(self, partition: int, key: str) -> DeliveryState | None:
        record = self.get(partition, key)
        return record if isinstance(record, DeliveryState) else None

    def legacy(self, partition: int, account_id: str) -> AccountDeliveries | None:
        record = self.get(partition, account_id)
        return record if isinstance(record, AccountDeliveries) else None

    def put(self, partition: int, record: DeliveryState | AccountDeliveries) -> None:
        """Hold ``record``; an idle pair is dropped instead (``stale`` says whether its record
        on the changelog is still to tombstone)."""
        held = self._parts.setdefault(partition, {})
        if isinstance(record, DeliveryState):
            key = record.key
            old = held.get(key)
            if isinstance(old, DeliveryState):
                self._count_deliveries(partition, old.workspace_id, -len(old.queue))
            self._count_deliveries(partition, record.workspace_id, len(record.queue))
            if record.idle:
                if isinstance(held.pop(key, None), DeliveryState):
                    _add(_of(self._pending, partition), record.endpoint_id, -1)
                self._deferred.pop(key, None)
                self.unpark(partition, key)
                self.timers.cancel(key)
                return
            if not isinstance(held.get(key), DeliveryState):
                _add(_of(self._pending, partition), record.endpoint_id, +1)
        super().put(partition, record)

    def _count_deliveries(self, partition: int, workspace_id: str, delta: int) -> None:
        if delta:
            _add(_of(self._workspace_pending, partition), workspace_id, delta)
            _add(self._workspace_total, workspace_id, delta)

    def pending_deliveries(self, workspace_id: str) -> int:
        """How many deliveries of ``workspace_id`` wait in the pairs this store holds, every
        owned partition together (``QueueLimits.workspace_max_pending`` bounds it)."""
        return self._workspace_total[workspace_id]

    def pending_pairs(self, partition: int, endpoint_id: str) -> int:
        """How many pairs of ``endpoint_id`` with something pending this store holds in
        ``partition`` (``QueueLimits.max_pairs_per_endpoint`` bounds it)."""
        counts = self._pending.get(partition)
        return 0 if counts is None else counts[endpoint_id]

    def park(self, partition: int, key: str) -> None:
        """The pair's endpoint paused it (back-off, ``Retry-After``, rate limit): a delivery
        taken in behind it is written at once. Only a pair this store holds is marked."""
        if self.pair(partition, key) is not None:
            self._parked.setdefault(partition, set()).add(key)

    def unpark(self, partition: int, key: str) -> None:
        keys = self._parked.get(partition)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._parked[partition]

    def parked(self, partition: int, key: str) -> bool:
        return key in self._parked.get(partition, ())

    def owns(self, partition: int) -> bool:
        """Whether ``partition`` is assigned here (restored and not dropped)."""
        return partition in self._parts

    def live(self, partition: int, key: str) -> bool:
        """Whether the pair's latest record on the changelog is a value (not a tombstone)."""
        return key in self._live.get(partition, ())

    def stale(self, partition: int, key: str) -> bool:
        """The pair is dropped (idle) but its record on the changelog still holds deliveries:
        its next write is a tombstone."""
        return self.live(partition, key) and self.pair(partition, key) is None

    def written(self, partition: int, key: str, *, value: bool) -> None:
        """A value (``value``) or a tombstone of the pair was handed to the producer."""
        if value:
            self._live.setdefault(partition, set()).add(key)
        else:
            self._live.get(partition, set()).discard(key)

    def load(self, partition: int, records: dict[str, DeliveryState | AccountDeliveries]) -> None:
        """Install a restored partition: pair records as they are, each old-form account
        record split into its pairs (merged behind a pair record of the same key, which is
        newer) and kept under its account id until ``forget_legacy``. An idle pair record
        (written before idle pairs were tombstoned) is not held: its key is due at once, and
        its lane tombstones it."""
        pairs = {k: r for k, r in records.items() if isinstance(r, DeliveryState)}
        legacy = [r for r in records.values() if isinstance(r, AccountDeliveries)]
        live = set(pairs)
        for old in legacy:
            for endpoint_id, state in old.endpoints.items():
                split = self._split(old, endpoint_id, state)
                held = pairs.get(split.key)
                pairs[split.key] = split if held is None else merge(held, split)
        super().load(partition, {**pairs, **{old.account_id: old for old in legacy}})
        self._live[partition] = live
        for key in live:
            if self.pair(partition, key) is None:
                self.timers.arm(key, partition, 0.0)  # tombstone at once

    def _split(
        self, old: AccountDeliveries, endpoint_id: str, state: DeliveryState
    ) -> DeliveryState:
        """One pair of an old-form record. Its workspace is the endpoint's own: the old form
        took the account's workspace from the first event it saw, which may be another's."""
        owner = self._workspace_of(endpoint_id) if self._workspace_of is not None else None
        return state.model_copy(
            update={
                "endpoint_id": endpoint_id,
                "account_id": old.account_id,
                "workspace_id": owner or state.workspace_id,
            }
        )

    def forget_legacy(self, partition: int, account_id: str) -> None:
        """The old-form record was migrated (its pairs written, its key tombstoned)."""
        held = self._parts.get(partition, {})
        if isinstance(held.get(account_id), AccountDeliveries):
            del held[account_id]
            self.timers.cancel(account_id)

    def drop(self, partition: int) -> None:
        for key in self._parts.get(partition, {}):
            self._deferred.pop(key, None)
            self._claimed.discard(key)
        for key in self._live.pop(partition, set()):
            if self.pair(partition, key) is None:
                self.timers.cancel(key)  # a stale pair's tombstone: the next owner's
        self._pending.pop(partition, None)
        for workspace_id, count in self._workspace_pending.pop(partition, Counter()).items():
            _add(self._workspace_total, workspace_id, -count)
        self._parked.pop(partition, None)
        self.unsaved.drop(partition)
        super().drop(partition)

    def __len__(self) -> int:
        return sum(
            1 for p in self._parts.values() for r in p.values() if isinstance(r, DeliveryState)
        )

    def claim(self, key: str) -> None:
        """The pair's lane works on it: no timer until ``release`` (its follow-up re-reads the
        pair at every step, so nothing the pair's writes arm meanwhile is needed)."""
        self._claimed.add(key)
        self.timers.cancel(key)

    def release(self, partition: int, key: str) -> None:
        """The pair's lane is done with it: arm its timer once, from its state now (its head's
        due time, or a deferral or wake set meanwhile, whichever is later)."""
        self._claimed.discard(key)
        state = self.pair(partition, key)
        if state is not None:
            self._arm(partition, state)

    def claimed(self, key: str) -> bool:
        return key in self._claimed

    def defer(self, partition: int, key: str, until: float) -> None:
        """Hold the pair's timer at ``until`` (or its head's due time, if later)."""
        state = self.pair(partition, key)
        if state is None:
            return
        self._deferred[key] = until
        self._arm(partition, state)

    def undefer(self, key: str) -> None:
        """Forget the pair's deferral; its timer follows its head again from the next write."""
        self._deferred.pop(key, None)

    def wake(self, partition: int, key: str, at: float) -> bool:
        """Make a deferred pair due at ``at`` (or its head's due time, if later); False when
        this store holds nothing to attempt for it. The loop looks for it at its next turn
        (``sweep_soon``): the slot it was woken for is held idle until it comes."""
        state = self.pair(partition, key)
        if state is None or state.head() is None:
            return False
        self._deferred[key] = at
        self._arm(partition, state)
        if key not in self._claimed:
            self.sweep_soon()  # a sweep finds nothing before ``at``: the tick then does
        return True

    def _arm(self, partition: int, record: DeliveryState | AccountDeliveries) -> None:
        if isinstance(record, AccountDeliveries):
            self.timers.arm(record.account_id, partition, 0.0)  # migrate at once
            return
        key = record.key
        due = record.due_at()
        if due is None:
            self._deferred.pop(key, None)
            self.timers.cancel(key)
            return
        if key in self._claimed:
            return  # armed when its lane releases it
        self.timers.arm(key, partition, max(due, self._deferred.get(key, 0.0)))

    def _timer_keys(self, record: DeliveryState | AccountDeliveries) -> list[str]:
        return [self.key_of(record)]


def _of(table: dict[int, Counter[str]], partition: int) -> Counter[str]:
    """The partition's counts, made at its first use (not a ``Counter`` made per call)."""
    counts = table.get(partition)
    if counts is None:
        counts = table[partition] = Counter()
    return counts


def _add(counts: Counter[str], key: str, delta: int) -> None:
    """Count ``delta`` more of ``key``; a key at zero is not kept."""
    counts[key] += delta
    if counts[key] <= 0:
        del counts[key]


__all__ = [
    "AccountDeliveries",
    "DeliveryStore",
    "WorkspaceOf",
    "decode_state",
    "merge",
]
