"""What the consume loop takes from the process it runs in: the ``Handler`` of each unit of
work and the state store it restores and drops per partition (its metric series are a
``worker.engine.metrics.LoopSeries``; docs/architecture.md, "The consume engine")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Protocol

from aiokafka.structs import ConsumerRecord

from worker.engine.faults import Fault


class LoopStore(Protocol):
    """What the loop needs of a state store (``worker.engine.store.PartitionedStore``)."""

    tracks_handover: ClassVar[bool]

    def handed_over(self, topic: str, partition: int, end: int) -> None: ...

    @staticmethod
    def decode(value: bytes) -> tuple[str, Any]: ...

    def load(self, partition: int, records: dict[str, Any]) -> None: ...

    def drop(self, partition: int) -> None: ...

    def pop_due(self, now: float, *, retry_at: float) -> tuple[str, int] | None: ...

    def __len__(self) -> int: ...


class Handler(Protocol):
    """One unit of work per record or due key: the worker's ``Executor``, the dispatcher's
    ``Dispatcher``. A unit that raises is retried, then recovered or given up; only a process
    fault (``worker.engine.faults.is_process_fault``), here or in ``recover``, ends the process.

    A handler may also have ``async handle_batch(records, release)``: the loop then hands it,
    as one unit, the records of a fetched partition whose keys have nothing in flight (one
    per key); it lets each go as soon as it can, ``release(records, True)`` once their
    outputs are acknowledged, ``release(records, False)`` for ``handle`` to take them (its
    key's later records behind them); those not let go when it returns go to ``handle``
    (docs/architecture.md, "Per-account lanes"). And ``async flush()``: writes it started
    that no unit waits for (each releasing a held offset once acknowledged), waited for after
    the lanes and before the loop commits at a revocation or a stop."""

    @property
    def store(self) -> LoopStore: ...

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> Iterable[str] | None:
        """Apply one record; may return keys (of the record's partition) due at once."""

    async def follow_up(self, partition: int, key: str) -> None:
        """Act on a key the store said is due."""

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        """Dead-letter a record whose handling failed for good (acknowledged before the
        offset is committed). Raising here ends the process: the record cannot be let go."""

    async def give_up(self, partition: int, key: str, fault: Fault) -> None:
        """Set aside a due key whose follow-up failed for good (postpone it)."""
