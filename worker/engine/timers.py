"""Due times by key in a heap, for the consume loop's "who is due now?" (follow-ups, delivery
retries). A re-armed or cancelled entry goes stale and is skipped at the top, so arming is
O(log n) and nothing is searched."""

from __future__ import annotations

import heapq

Timer = tuple[float, str, int]
"""A heap entry: (due epoch seconds, key, partition)."""


class TimerQueue:
    """One live timer per key; ``pop_due`` hands out due keys one at a time."""

    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.live: dict[str, Timer] = {}
        self.heap: list[Timer] = []

    def __len__(self) -> int:
        return len(self.live)

    def arm(self, key: str, partition: int, due: float) -> None:
        held = self.live.get(key)
        if held is not None and held[0] == due and held[2] == partition:
            return
        timer = (due, key, partition)
        self.live[key] = timer
        heapq.heappush(self.heap, timer)

    def cancel(self, key: str) -> None:
        self.live.pop(key, None)

    def pop_due(self, now: float, *, retry_at: float) -> tuple[str, int] | None:
        """The next key (and its partition) due at ``now``, or ``None``.

        Its timer is re-armed at ``retry_at``: if the caller cannot act now, or acting changes
        nothing, the key comes back then; acting re-arms it from the new state instead.
        """
        heap = self.heap
        while heap and heap[0][0] <= now:
            timer = heapq.heappop(heap)
            _, key, partition = timer
            if self.live.get(key) is timer:
                self.arm(key, partition, retry_at)
                return key, partition
        return None

    def compact(self) -> None:
        """Drop stale entries once they outnumber the live ones (after a partition left)."""
        if len(self.heap) > 2 * len(self.live) + 1024:
            self.heap = list(self.live.values())
            heapq.heapify(self.heap)
