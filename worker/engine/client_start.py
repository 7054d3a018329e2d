"""Starting a short-lived Kafka client (a scan's or a replay's consumer) so that a start cut
short still ends with the client closed: aiokafka's bootstrap, cancelled while it waits for
metadata, leaves its first connection open, unknown to ``stop()``. So the start is never cut:
the caller's wait ends at once, the start runs on (bounded by the request time-out) and the
client is stopped, in a task its owner holds (docs/architecture.md, "Resource bounds")."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["AsideCloses"]


class AsideCloses:
    """The clients of one owner whose start was cut short, each closed in the background once
    its start has ended: held at most the client's request time-out per bootstrap host, so
    there are at most as many as the starts the owner began in that time."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    async def start(self, client: Any) -> None:
        """``client.start()``; when it is cancelled or fails, raise at once and close the
        client aside. On return the client is started and the caller stops it."""
        starting = asyncio.ensure_future(client.start())
        try:
            await asyncio.shield(starting)
        except BaseException:
            task = asyncio.get_running_loop().create_task(_finish_then_stop(client, starting))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            raise

    async def drain(self) -> None:
        """Wait for the closes under way (the owner's stop; the close budget bounds it)."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)


async def _finish_then_stop(client: Any, starting: asyncio.Future[None]) -> None:
    with contextlib.suppress(BaseException):
        await starting
    with contextlib.suppress(Exception):
        await client.stop()
