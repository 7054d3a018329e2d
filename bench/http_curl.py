"""pycurl's multi interface driven from the asyncio loop: contender (c) of
``bench.http_clients`` (bench/README.md, "HTTP clients").

pycurl is not a dependency of the project: ``load_pycurl`` imports it from the environment or
from a directory given to it (``--pycurl-path``, e.g. a ``pip install --target`` under /tmp),
and the benchmark skips this contender when neither has it.

libcurl tells the loop which sockets to watch (``M_SOCKETFUNCTION``) and when to wake it
(``M_TIMERFUNCTION``); the loop calls ``socket_action`` back, so no thread is involved.
Connections are kept alive in the multi handle's cache, at most ``max_per_host`` per host;
easy handles are reused. Time-outs: connect, and the whole transfer (libcurl has no separate
headers phase); the body cap aborts the transfer (``CURLE_WRITE_ERROR``) past ``body_cap``.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["CurlClient", "CurlFailure", "load_pycurl"]


def load_pycurl(path: str | None = None) -> Any | None:
    """The pycurl module, or None when it cannot be imported (from ``path`` first, if given)."""
    if path and path not in sys.path:
        sys.path.append(path)
    try:
        return importlib.import_module("pycurl")
    except ImportError:
        return None


class CurlFailure(Exception):
    """The transfer failed (libcurl's error number and message)."""


class _Transfer:
    __slots__ = ("cap", "chunks", "future", "over", "size")

    def __init__(self, future: asyncio.Future[tuple[int, bytes]], cap: int) -> None:
        self.future = future
        self.cap = cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.over = False

    def write(self, data: bytes) -> int | None:
        self.size += len(data)
        if self.size > self.cap:
            self.over = True
            return 0  # anything but len(data): libcurl aborts with CURLE_WRITE_ERROR
        self.chunks.append(data)
        return None


class CurlClient:
    """POST through one ``CurlMulti``; ``post`` answers ``(status, body)`` or raises
    ``CurlFailure``."""

    def __init__(
        self,
        pycurl: Any,
        *,
        cafile: str | None = None,
        cert: tuple[str, str] | None = None,
        max_per_host: int = 32,
        connect_timeout_s: float = 5.0,
        timeout_s: float = 15.0,
        body_cap: int = 4096,
    ) -> None:
        self._pc = pycurl
        self._loop = asyncio.get_running_loop()
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, max_per_host)
        self._multi.setopt(pycurl.M_MAXCONNECTS, max_per_host)
        self._cafile, self._cert = cafile, cert
        self._connect_ms = int(connect_timeout_s * 1000)
        self._timeout_ms = int(timeout_s * 1000)
        self._cap = body_cap
        self._free: list[Any] = []
        self._running: dict[Any, _Transfer] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._watched: dict[int, int] = {}

    def _easy(self) -> Any:
        if self._free:
            return self._free.pop()
        pc = self._pc
        easy = pc.Curl()
        easy.setopt(pc.NOSIGNAL, 1)
        easy.setopt(pc.FOLLOWLOCATION, 0)
        easy.setopt(pc.PROTOCOLS, pc.PROTO_HTTP | pc.PROTO_HTTPS)
        easy.setopt(pc.CONNECTTIMEOUT_MS, self._connect_ms)
        easy.setopt(pc.TIMEOUT_MS, self._timeout_ms)
        if self._cafile:
            easy.setopt(pc.CAINFO, self._cafile)
        if self._cert:
            easy.setopt(pc.SSLCERT, self._cert[0])
            easy.setopt(pc.SSLKEY, self._cert[1])
        return easy

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        pc = self._pc
        easy = self._easy()
        transfer = _Transfer(self._loop.create_future(), self._cap)
        easy.setopt(pc.URL, url)
        easy.setopt(pc.POSTFIELDS, body)
        # "Expect:" stops libcurl asking for 100-continue; the wire is the others' otherwise.
        easy.setopt(pc.HTTPHEADER, [f"{k}: {v}" for k, v in headers.items()] + ["Expect:"])
        easy.setopt(pc.WRITEFUNCTION, transfer.write)
        self._running[easy] = transfer
        self._multi.add_handle(easy)
        try:
            return await transfer.future
        finally:
            if self._running.get(easy) is transfer:  # cancelled: still in the multi
                del self._running[easy]
                self._multi.remove_handle(easy)
                easy.close()

    # -- libcurl's callbacks: only record what to watch; socket_action runs from the loop
    def _on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        pc, loop = self._pc, self._loop
        before = self._watched.get(fd, 0)
        now = 0 if what == pc.POLL_REMOVE else what
        if before in (pc.POLL_IN, pc.POLL_INOUT) and now not in (pc.POLL_IN, pc.POLL_INOUT):
            loop.remove_reader(fd)
        if before in (pc.POLL_OUT, pc.POLL_INOUT) and now not in (pc.POLL_OUT, pc.POLL_INOUT):
            loop.remove_writer(fd)
        if now in (pc.POLL_IN, pc.POLL_INOUT) and before not in (pc.POLL_IN, pc.POLL_INOUT):
            loop.add_reader(fd, self._act, fd, pc.CSELECT_IN)
        if now in (pc.POLL_OUT, pc.POLL_INOUT) and before not in (pc.POLL_OUT, pc.POLL_INOUT):
            loop.add_writer(fd, self._act, fd, pc.CSELECT_OUT)
        if now:
            self._watched[fd] = now
        else:
            self._watched.pop(fd, None)

    def _on_timer(self, ms: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if ms >= 0:
            self._timer = self._loop.call_later(ms / 1000, self._act, self._pc.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, events: int) -> None:
        multi = self._multi
        while True:
            code, _ = multi.socket_action(fd, events)
            if code != self._pc.E_CALL_MULTI_PERFORM:
                break
        while True:
            queued, ok, failed = multi.info_read()
            for easy in ok:
                self._done(easy, None)
            for easy, errno, message in failed:
                self._done(easy, CurlFailure(f"{errno}: {message}"))
            if not queued:
                break

    def _done(self, easy: Any, failure: CurlFailure | None) -> None:
        self._multi.remove_handle(easy)
        transfer = self._running.pop(easy, None)
        status = easy.getinfo(self._pc.RESPONSE_CODE)
        easy.setopt(self._pc.WRITEFUNCTION, _discard)  # drop the transfer's references
        self._free.append(easy)
        if transfer is None or transfer.future.done():
            return
        if transfer.over:
            failure = CurlFailure(f"body over {transfer.cap} bytes")
        if failure is not None:
            transfer.future.set_exception(failure)
        else:
            transfer.future.set_result((status, b"".join(transfer.chunks)))

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for fd, what in list(self._watched.items()):
            if what in (self._pc.POLL_IN, self._pc.POLL_INOUT):
                self._loop.remove_reader(fd)
            if what in (self._pc.POLL_OUT, self._pc.POLL_INOUT):
                self._loop.remove_writer(fd)
        self._watched.clear()
        for easy in self._free:
            easy.close()
        self._free.clear()
        self._multi.close()


def _discard(data: bytes) -> None:
    return None
