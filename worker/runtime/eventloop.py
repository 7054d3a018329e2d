"""The event loop of every process: uvloop by default, the standard loop with ``EVENT_LOOP=asyncio``
to rule uvloop out when diagnosing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

LoopName = Literal["uvloop", "asyncio"]


def loop_factory(name: LoopName) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new event loops of kind ``name``."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], name: LoopName) -> T:
    """``asyncio.run(main)`` on a loop of kind ``name``."""
    with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
        return runner.run(main)


def running_loop_name() -> LoopName:
    """Which kind of loop runs the calling coroutine (for the start-up log lines)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"
