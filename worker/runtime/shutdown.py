"""How every process stops within a bound (docs/architecture.md, "Bounded shutdown"): each close
step has a time and is abandoned past it, and a watchdog exits if the whole stop overruns, so a
process ends by its own hand, naming what held it, before the orchestrator's SIGKILL."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Final

from worker.runtime.logs import get_logger

__all__ = ["EX_OVERRAN", "CloseBudget", "bounded", "graceful_then_forced"]

log = get_logger(__name__)

EX_OVERRAN: Final = 70
"""Exit status of a stop that overran its hard limit (sysexits.h ``EX_SOFTWARE``)."""


async def bounded(step: Awaitable[object], what: str, timeout: float) -> None:
    """Run a close step for at most ``timeout`` seconds; its failure is logged, never raised.
    Not ``wait_for``, which waits for the cancelled step to finish: a library that absorbs the
    cancellation (a rebalance inside ``consumer.stop()``) makes that unbounded."""
    started = time.monotonic()
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        log.error("shutdown_step_timed_out", step=what, timeout_s=round(timeout, 3))
        return
    if task.cancelled() or (exc := task.exception()) is not None:
        error = "cancelled" if task.cancelled() else repr(exc)
        log.warning("shutdown_step_failed", step=what, error=error)
        return
    log.info("shutdown_step_done", step=what, seconds=round(time.monotonic() - started, 3))


class CloseBudget:
    """Close steps that share one budget: each gets what is left of ``total_s``, and at least
    ``floor_s``, so a step that hangs costs the ones after it their time, not their chance to
    run; the close takes at most ``total_s`` plus ``floor_s`` per step."""

    def __init__(self, total_s: float, *, floor_s: float = 0.2) -> None:
        self.total_s = total_s
        self.floor_s = floor_s
        self._deadline: float | None = None

    async def step(self, step: Awaitable[object], what: str) -> None:
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.total_s
        await bounded(step, what, max(self._deadline - now, self.floor_s))


def graceful_then_forced(stop: Callable[[], object], *, hard_limit_s: float) -> Callable[[], None]:
    """A stop-signal handler: the first signal calls ``stop`` and arms a watchdog that exits
    (``EX_OVERRAN``) if the process is still stopping ``hard_limit_s`` later; a second signal
    exits at once (130)."""
    signals = 0

    def overran() -> None:
        log.error("shutdown_overran", hard_limit_s=hard_limit_s)
        os._exit(EX_OVERRAN)

    def handler() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.error("forced_exit")
            os._exit(130)
            return  # only reached when os._exit is replaced (tests)
        log.info("stop_requested", hard_limit_s=hard_limit_s)
        asyncio.get_running_loop().call_later(hard_limit_s, overran)
        stop()

    return handler
