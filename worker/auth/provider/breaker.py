"""A circuit breaker per provider: after ``threshold`` transient failures in a row calls fail at
once (502), and after ``reset_s`` one probe call decides; "identity mismatch" is healthy."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Literal, get_args

__all__ = ["BREAKER_STATES", "BreakerState", "CircuitBreaker", "CircuitOpenError"]

BreakerState = Literal["closed", "open", "half_open"]
#: Every state, in the order of the diagram (the state gauge exports one series each).
BREAKER_STATES: Final[tuple[BreakerState, ...]] = get_args(BreakerState)


class CircuitOpenError(Exception):
    """The breaker refused the call; nothing was sent to the provider."""

    def __init__(self, provider: str) -> None:
        super().__init__(f"circuit open for provider {provider!r}")
        self.provider = provider


class CircuitBreaker:
    """Consecutive-failure breaker. Not thread-safe; one event loop uses it."""

    def __init__(
        self, threshold: int, reset_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if threshold < 1 or reset_s <= 0:
            raise ValueError("threshold must be >= 1 and reset_s > 0")
        self.threshold = threshold
        self.reset_s = reset_s
        self._clock = clock
        self._state: BreakerState = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._probe_in_flight = False

    @property
    def state(self) -> BreakerState:
        """The current state; an open breaker whose reset time has passed reads half_open."""
        if self._state == "open" and self._clock() - self._opened_at >= self.reset_s:
            return "half_open"
        return self._state

    def allow(self) -> bool:
        """May a call go out now? In half-open, only one probe at a time is allowed."""
        state = self.state
        if state == "closed":
            return True
        if state == "open" or self._probe_in_flight:
            return False
        self._state = "half_open"
        self._probe_in_flight = True
        return True

    def record_success(self) -> None:
        """The provider answered; a successful probe closes the breaker."""
        if self._state == "open":
            return  # a straggler from before the breaker opened proves little
        self._state = "closed"
        self._failures = 0
        self._probe_in_flight = False

    def record_failure(self) -> None:
        """A transient failure: count it, or re-open if it was the half-open probe."""
        if self._state == "half_open":
            self._open()
        elif self._state == "closed":
            self._failures += 1
            if self._failures >= self.threshold:
                self._open()

    def release(self) -> None:
        """A permitted call ended without a verdict (cancelled): free the probe slot."""
        if self._state == "half_open":
            self._probe_in_flight = False

    def _open(self) -> None:
        self._state = "open"
        self._opened_at = self._clock()
        self._failures = 0
        self._probe_in_flight = False
