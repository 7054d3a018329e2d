"""Process plumbing of every entry point: the one place that installs SIGTERM/SIGINT handlers
(so every process stops the same way), running a command until a signal, and GC tuning."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Final

from worker.runtime import eventloop

if TYPE_CHECKING:
    from worker.runtime.logs import LogConfig

__all__ = [
    "EX_CONFIG",
    "STOP_SIGNALS",
    "Misconfigured",
    "on_stop_signals",
    "run_subcommand",
    "run_until_signal",
    "tune_gc",
]

STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
"""What Kubernetes (SIGTERM) and a terminal (Ctrl-C) send to ask for a graceful stop."""

EX_CONFIG: Final = 78
"""Exit status of a process that refuses to start on a configuration error (sysexits.h)."""


class Misconfigured(Exception):
    """The environment or the cluster is not as configured: the process refuses to
    start, says why in one log line and exits with ``EX_CONFIG``, rather than run wrongly.
    A restart does not help, so an orchestrator's crash loop shows the message."""


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[], object], *, enabled: bool = True) -> Iterator[None]:
    """Call ``handler`` on the running loop for every SIGTERM/SIGINT while the block runs;
    the loop's previous behaviour comes back afterwards. ``enabled=False`` installs nothing
    (in-process tests, where the test runner owns the signals)."""
    loop = asyncio.get_running_loop()
    installed = STOP_SIGNALS if enabled else ()
    for sig in installed:
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run_until_signal(coro: Coroutine[Any, Any, Any], event_loop: eventloop.LoopName) -> int:
    """Run ``coro`` on an event loop of kind ``event_loop`` (``EVENT_LOOP``) until it ends or a stop
    signal cancels it, so its clean-up (child processes, sockets) runs. Coroutines with a
    graceful stop of their own install their handlers over these. Returns the exit status."""

    async def until_signal() -> None:
        task = asyncio.ensure_future(coro)
        with on_stop_signals(task.cancel), contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        eventloop.run(until_signal(), event_loop)
    except KeyboardInterrupt:
        return 130
    return 0


def run_subcommand(args: Any, log_config: LogConfig, command: Callable[[], int]) -> int:
    """The body of every ``main``: configure logs, run ``command`` (the subcommand ``args`` chose),
    treat a closed stdout (``| head``) as the end rather than an error, and a ``Misconfigured``
    as a refusal to start (``EX_CONFIG``, one log line naming the problem, no traceback)."""
    from worker.runtime import logs

    logs.configure(
        log_config.level,
        log_config.format,
        service=getattr(args, "service", None) or str(getattr(args, "command", "passkey")),
        library_level=log_config.library_level,
        access_log=log_config.access_log,
    )
    with contextlib.suppress(BrokenPipeError):
        try:
            code = command()
        except Misconfigured as exc:
            logs.get_logger(__name__).error("refusing_to_start", reason=str(exc))
            return EX_CONFIG
        return code
    return 1


def tune_gc(threshold: int) -> None:
    """Long-lived server processes: raise the young-generation threshold to ``threshold``
    (``WORKER_GC_THRESHOLD``; 0 keeps the interpreter's; docs/configuration.md)."""
    if threshold:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(threshold, gen1, gen2)
