"""Serving an ASGI app inside a running event loop (probes, simulator, front-end, tests), with
uvicorn's signal handlers off: the process owner decides how to stop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Generator
from typing import Any

import uvicorn


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket. ``proto=IPPROTO_TCP`` matters: asyncio only sets
    TCP_NODELAY on sockets that say so, and without it Nagle plus delayed ACKs add ~40 ms to
    every loopback answer."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


@contextlib.asynccontextmanager
async def serving(app: Any, *, host: str, port: int, name: str) -> AsyncIterator[str]:
    """Serve ``app`` while the block runs; yields the base URL (``port=0`` picks one)."""
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        host=host,
        port=bound,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="none",
        timeout_graceful_shutdown=5,
    )
    server = EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=name)
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError(f"{name} stopped during start-up")
            await asyncio.sleep(0.005)
        url_host = f"[{host}]" if ":" in host else host
        yield f"http://{url_host}:{bound}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()
