"""The event loop every ``python -m worker`` process runs on.

uvloop (libuv) is the default: the worker, the front-end and the simulator spend much of
their CPU in the loop itself (socket reads and writes, callbacks, the ~10 tasks and futures
of each command), and uvloop does that work in C. ``EVENT_LOOP=asyncio`` selects the standard
library's loop, e.g. to rule uvloop out when diagnosing a problem; the code is the same on
both (the in-process tests run on the standard loop, the process tests on the default).
"""

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
