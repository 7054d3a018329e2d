"""A stop asked for while a process is still starting ends it cleanly. Until the loop installs
its own handlers (``worker.runtime.process.on_stop_signals``, which replace this one), SIGTERM
would kill a starting process by its default action, a crash to whoever watches (an
orchestrator scaling down a pod just started, a pool restarting a member). Each ``__main__``
installs this before its heavy imports: a SIGTERM while the process imports, connects or
restores raises ``SystemExit(0)``. Nothing is consumed, decided or produced before the loop's
handlers are in place, so nothing is lost. SIGINT keeps Python's ``KeyboardInterrupt``."""

from __future__ import annotations

import signal
from types import FrameType

__all__ = ["exit_on_sigterm_while_starting"]


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def exit_on_sigterm_while_starting() -> None:
    """Make SIGTERM end the process with status 0 until the loop's handlers replace this."""
    signal.signal(signal.SIGTERM, _exit_cleanly)
