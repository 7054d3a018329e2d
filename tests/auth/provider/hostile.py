"""A provider that speaks raw bytes on a loopback socket: no HTTP library between the test and
the wire, so it can send what no well-behaved server would."""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import re
from collections.abc import Awaitable, Callable

STATE = b'{"status":"passkey_confirmation_sent","auth_status":"passkey_confirmation_sent"}'
DEEP = b"[" * 100_000 + b"]" * 100_000  # 200 KB: past the default cap
DEEP_IN_CAP = b"[" * 30_000 + b"]" * 30_000  # 60 KB: within it, so the parser must cope
Script = Callable[[asyncio.StreamWriter], Awaitable[None]]


def http(status: bytes, body: bytes = b"", *headers: bytes) -> bytes:
    fields = b"".join(h + b"\r\n" for h in headers)
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\n"
        + fields
        + b"Content-Length: %d\r\n" % len(body)
        + b"Connection: close\r\n\r\n"
        + body
    )


def written(raw: bytes) -> Script:
    async def script(writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        await writer.drain()

    return script


class HostileProvider:
    """Answers each request with ``by_method[method]``, else ``script``; keeps the methods and
    the heads (request line and header fields) of the requests it read."""

    def __init__(self) -> None:
        self.script: Script = written(http(b"200 OK", STATE))
        self.by_method: dict[str, Script] = {}
        self.requests: list[str] = []
        self.heads: list[bytes] = []
        self.url = ""
        self._handlers: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            method = head.split(b" ", 1)[0].decode()
            self.requests.append(method)
            self.heads.append(head)
            await self.by_method.get(method, self.script)(writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._handlers.discard(task)

    async def __aenter__(self) -> HostileProvider:
        self._server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *_: object) -> None:
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()


def in_turn(*scripts: Script) -> Script:
    """Each request gets the next script; the last one answers every request after it."""
    pending = list(scripts)

    async def script(writer: asyncio.StreamWriter) -> None:
        await (pending.pop(0) if len(pending) > 1 else pending[0])(writer)

    return script


def json_answer(status: bytes, body: object, *headers: bytes) -> bytes:
    """``http`` with ``body`` as a JSON document."""
    return http(status, json.dumps(body).encode(), b"Content-Type: application/json", *headers)


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9)


@functools.cache
def zeros_gzipped(megabytes: int) -> bytes:
    """A gzip bomb: ``megabytes`` MB of zeros, about a thousandth of that on the wire."""
    return gzipped(b"\0" * (megabytes * 1024 * 1024))
