"""Deliveries kept in memory only, while their event's held offset is their durable copy: the
hold is released once each is settled or written, so a first-time success costs no state
record (docs/architecture.md, "Webhook fan-out")."""

from __future__ import annotations

from worker.engine.offsets import Hold


class EventHold:
    """The loop's hold on one event's offset, shared by the event's unsaved deliveries."""

    __slots__ = ("_hold", "_left", "keys", "partition")

    def __init__(self, hold: Hold, partition: int) -> None:
        self._hold = hold
        self._left = 0
        self.partition = partition
        self.keys: set[str] = set()
        """The pairs the event's unsaved deliveries are in (for the overdue write)."""

    def add(self, key: str) -> None:
        self._left += 1
        self.keys.add(key)

    def done(self) -> None:
        """One of the event's deliveries is safe; the last one releases the offset."""
        self._left -= 1
        if self._left <= 0:
            self._hold.release()

    @property
    def released(self) -> bool:
        return self._hold.released


class Unsaved:
    """Which deliveries (by dedup marker) of which pairs are in memory only, and the event
    hold each one is part of; per partition, dropped with it."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: dict[int, dict[str, dict[str, EventHold]]] = {}

    def keep(self, partition: int, key: str, mark: str, hold: EventHold) -> None:
        pairs = self._parts.setdefault(partition, {})
        pairs.setdefault(key, {})[mark] = hold
        hold.add(key)

    def has(self, partition: int, key: str) -> bool:
        return bool(self._parts.get(partition, {}).get(key))

    def settled(self, partition: int, key: str, mark: str) -> EventHold | None:
        """The hold of an unsaved delivery that was just settled (and is no longer unsaved),
        or ``None`` when it was written (or is being written) in its pair's record."""
        marks = self._parts.get(partition, {}).get(key)
        if not marks:
            return None
        hold = marks.pop(mark, None)
        if not marks:
            del self._parts[partition][key]
        return hold

    def take(self, partition: int, keys: list[str]) -> list[tuple[str, str, EventHold]]:
        """Every unsaved delivery of ``keys`` (no longer unsaved): a write of those pairs
        about to be sent makes them safe once acknowledged."""
        pairs = self._parts.get(partition, {})
        return [(key, mark, hold) for key in keys for mark, hold in pairs.pop(key, {}).items()]

    def put_back(self, partition: int, taken: list[tuple[str, str, EventHold]]) -> None:
        """A write that failed: its deliveries are unsaved again."""
        pairs = self._parts.setdefault(partition, {})
        for key, mark, hold in taken:
            pairs.setdefault(key, {})[mark] = hold

    def drop(self, partition: int) -> None:
        """The partition was revoked: its holds went with the loop's tracker."""
        self._parts.pop(partition, None)

    def __len__(self) -> int:
        return sum(len(m) for p in self._parts.values() for m in p.values())


__all__ = ["EventHold", "Unsaved"]
