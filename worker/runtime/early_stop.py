"""A stop asked for while a process is still starting ends it cleanly (``SystemExit(0)``) rather
than by SIGTERM's default action, a crash to whoever watches; nothing is consumed or produced
before the loop installs its own handlers, so nothing is lost. SIGINT stays as it is."""

from __future__ import annotations

import signal
from types import FrameType

__all__ = ["exit_on_sigterm_while_starting"]


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def exit_on_sigterm_while_starting() -> None:
    """Make SIGTERM end the process with status 0 until the loop's handlers replace this."""
    signal.signal(signal.SIGTERM, _exit_cleanly)
