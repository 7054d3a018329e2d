"""The event loop of every process: uvloop by default, the standard loop with ``EVENT_LOOP=asyncio``
to rule uvloop out when diagnosing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

LoopName = Literal["uvloop", "asyncio"]


def run(main: Coroutine[Any, Any, T], name: LoopName) -> T:
    """``asyncio.run(main)`` on a loop of kind ``name`` (uvloop imported only when asked for)."""
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if name == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> LoopName:
    """Which kind of loop runs the calling coroutine (for the start-up log lines)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"
