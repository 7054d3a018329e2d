"""Delivery's DNS lookups, bounded: the system resolver run on threads of its own, shared out
per workspace by the one admission rule (``worker.runtime.admission``), with a time-out and
failing names answered from memory, so a zone whose nameserver never answers holds its own
workspace's resolver threads, not everyone's (docs/architecture.md, "Webhook fan-out",
"Admission"). What the answers may be is ``worker.webhooks.targets``'s."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import InitVar, dataclass
from typing import Final

from worker.runtime.admission import Admission, Share, Slot

__all__ = [
    "LOOKUP_WORKSPACE",
    "BoundedLookup",
    "Lookup",
    "Resolve",
    "system_lookup",
    "system_resolve",
]

# host, port → the textual addresses the name resolves to (one DNS lookup).
Lookup = Callable[[str, int], Awaitable[Sequence[str]]]
# The same, blocking: the boundary to the system resolver (run on ``BoundedLookup``'s threads).
Resolve = Callable[[str, int], Sequence[str]]

#: The workspace a lookup is made for: whose share of ``BoundedLookup``'s threads it takes.
#: The dispatcher's gate sets it in the task of each attempt it admits (``EndpointGate.admit``),
#: so the connector's lookup, run in that task or one it starts, carries it.
LOOKUP_WORKSPACE: ContextVar[str] = ContextVar("webhook_lookup_workspace", default="")


def system_resolve(host: str, port: int) -> Sequence[str]:
    """The operating system's resolver (getaddrinfo): blocks, for as long as it takes."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
    return [str(info[4][0]) for info in infos]


#: ``BoundedLookup``'s defaults: threads in all, threads one workspace holds at most, how long
#: a caller waits, how long a failing host is answered from memory, how many are remembered.
LOOKUP_THREADS: Final = 16
LOOKUP_THREADS_PER_WORKSPACE: Final = 2
LOOKUP_TIMEOUT_S: Final = 5.0
LOOKUP_FAILURE_TTL_S: Final = 30.0
LOOKUP_FAILURES_KEPT: Final = 4096


@dataclass(eq=False, kw_only=True)
class BoundedLookup:
    """A ``Lookup`` that runs ``resolve`` (getaddrinfo) on ``threads`` threads of its own, not
    the event loop's default pool, which every other blocking call of the process shares.

    A thread blocked in getaddrinfo cannot be cancelled, so what bounds the harm is who holds
    the threads: a lookup takes a thread for the workspace in ``LOOKUP_WORKSPACE`` through
    the admission rule (``threads`` slots, at most ``per_workspace`` for one workspace, and a
    quarter kept for workspaces holding none, ``Share.capped``), held until the thread
    returns (callers that gave up included). A lookup with no thread for its workspace is
    refused at once (``NoRoom``, with a ``Retry-After``): nothing waits for a thread, and the
    caller (the webhook sender) defers its attempt instead of failing the receiver. A caller
    waits ``timeout_s`` at most for the answer, then fails with a DNS error
    (``socket.gaierror``, EAI_AGAIN) while the thread runs on. A host looked up while a
    lookup of it runs joins that one instead of taking a thread; a host whose lookup failed
    or outlasted ``timeout_s`` fails at once for ``failure_ttl_s`` (at most
    ``LOOKUP_FAILURES_KEPT`` hosts are remembered, the oldest forgotten first). A lookup
    refused a thread does not mark the host: that says nothing of it.

    Safe to share between event loops (state, the admission included, under a thread lock).
    """

    threads: int = LOOKUP_THREADS
    per_workspace: InitVar[int] = LOOKUP_THREADS_PER_WORKSPACE
    timeout_s: float = LOOKUP_TIMEOUT_S
    failure_ttl_s: float = LOOKUP_FAILURE_TTL_S
    resolve: Resolve = system_resolve
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self, per_workspace: int) -> None:
        if self.threads < 1 or per_workspace < 1 or self.timeout_s <= 0:
            raise ValueError("threads, per_workspace and timeout_s must be > 0")
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._threads = Admission(
            "webhook lookup threads", Share.capped(self.threads, per_workspace), retry_after_s=1.0
        )
        self._running: dict[str, concurrent.futures.Future[Sequence[str]]] = {}
        self._failed: OrderedDict[str, tuple[float, int]] = OrderedDict()

    @property
    def threads_held(self) -> int:
        """Threads running a lookup now, whether or not anyone still waits for it."""
        return self._threads.in_use

    def held(self, workspace_id: str) -> int:
        """Threads the workspace's lookups hold now."""
        with self._lock:
            return self._threads.held(workspace_id)

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        workspace = LOOKUP_WORKSPACE.get()
        name = host.lower()
        self._fail_if_failing(name, host)
        future = self._start(name, host, port, workspace)  # NoRoom: no thread for it now
        try:
            async with asyncio.timeout(self.timeout_s):
                return list(await _on_this_loop(future))
        except TimeoutError:
            self._remember_failure(name, socket.EAI_AGAIN)
            raise socket.gaierror(
                socket.EAI_AGAIN, f"lookup of {host!r} gave no answer in {self.timeout_s}s"
            ) from None

    def _fail_if_failing(self, name: str, host: str) -> None:
        with self._lock:
            failed = self._failed.get(name)
            if failed is not None and failed[0] <= self.clock():
                del self._failed[name]
                failed = None
        if failed is not None:
            raise socket.gaierror(failed[1], f"lookup of {host!r} failed recently")

    def _remember_failure(self, name: str, errno: int) -> None:
        if self.failure_ttl_s <= 0:
            return
        with self._lock:
            self._failed[name] = (self.clock() + self.failure_ttl_s, errno)
            self._failed.move_to_end(name)
            while len(self._failed) > LOOKUP_FAILURES_KEPT:
                self._failed.popitem(last=False)

    def _start(
        self, name: str, host: str, port: int, workspace: str
    ) -> concurrent.futures.Future[Sequence[str]]:
        """Join the running lookup of the host, or run one on a thread taken for
        ``workspace`` (``NoRoom`` when the rule gives it none: refused at once)."""
        with self._lock:
            running = self._running.get(name)
            if running is None:
                slot = self._threads.take(workspace)
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=self.threads, thread_name_prefix="webhook-dns"
                    )
                executor = self._executor
        if running is not None:
            return running
        # Never queued inside the executor: a thread was taken for it.
        try:
            future = executor.submit(self.resolve, host, port)
        except BaseException:  # closed meanwhile: the thread taken is given back
            with self._lock:
                slot.release()
            raise
        with self._lock:
            self._running[name] = future
        future.add_done_callback(lambda f: self._ended(name, slot, f))
        return future

    def _ended(
        self, name: str, slot: Slot, future: concurrent.futures.Future[Sequence[str]]
    ) -> None:
        """On the lookup's thread: give the thread back, remember a failure."""
        error = future.exception()
        if isinstance(error, OSError):
            self._remember_failure(name, error.errno or socket.EAI_FAIL)
        with self._lock:
            if self._running.get(name) is future:
                del self._running[name]
            if error is None:
                self._failed.pop(name, None)
            slot.release()

    def close(self) -> None:
        """Stop accepting lookups' threads (those blocked still end on their own)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)


def _on_this_loop(
    future: concurrent.futures.Future[Sequence[str]],
) -> asyncio.Future[Sequence[str]]:
    """An asyncio future of the running loop settled with ``future``: giving it up (a
    time-out) leaves ``future`` running and nothing unretrieved behind."""
    loop = asyncio.get_running_loop()
    mine: asyncio.Future[Sequence[str]] = loop.create_future()

    def settle(done: concurrent.futures.Future[Sequence[str]]) -> None:
        if mine.done():
            return
        error = done.exception()
        if error is not None:
            mine.set_exception(error)
        else:
            mine.set_result(done.result())

    def ended(done: concurrent.futures.Future[Sequence[str]]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, done)

    future.add_done_callback(ended)
    return mine


system_lookup: Lookup = BoundedLookup()
"""The process's lookup for delivery: the system resolver behind ``BoundedLookup``'s bounds."""
