"""Which webhook URLs and addresses the dispatcher may reach: the SSRF defence, for the API's
check (no DNS) and for delivery (every resolved address vetted). Refusals carry a stable
``url_*`` / ``target_*`` reason for the API and the metrics (docs/architecture.md, "Webhook
fan-out"). Delivery's lookups are bounded per workspace (``BoundedLookup``): a zone whose
nameserver never answers holds its own workspace's resolver threads, not everyone's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

from yarl import URL

__all__ = [
    "ALWAYS_BLOCKED",
    "LOOKUP_WORKSPACE",
    "MAX_URL_LENGTH",
    "BlockedTarget",
    "BoundedLookup",
    "IPAddress",
    "Lookup",
    "Resolve",
    "TargetPolicy",
    "address_category",
    "address_rejection",
    "check_address",
    "resolve_target",
    "system_lookup",
    "system_resolve",
    "url_rejection",
    "validate_url",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# host, port → the textual addresses the name resolves to (one DNS lookup).
Lookup = Callable[[str, int], Awaitable[Sequence[str]]]
# The same, blocking: the boundary to the system resolver (run on ``BoundedLookup``'s threads).
Resolve = Callable[[str, int], Sequence[str]]

#: The workspace a lookup is made for: whose share of ``BoundedLookup``'s threads it takes.
#: The dispatcher's gate sets it in the task of each attempt it admits (``EndpointGate.admit``),
#: so the connector's lookup, run in that task or one it starts, carries it.
LOOKUP_WORKSPACE: ContextVar[str] = ContextVar("webhook_lookup_workspace", default="")

MAX_URL_LENGTH: Final = 2048
# Categories that no policy flag lifts: nothing there accepts a TCP connection.
ALWAYS_BLOCKED: Final = frozenset({"unspecified", "multicast", "broadcast"})

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network
# Checked in order; the first match names the category. Anything else that
# ``ipaddress`` does not call global ends as "reserved".
_V4_RANGES: Final[tuple[tuple[_V4, str], ...]] = (
    (_V4("0.0.0.0/8"), "unspecified"),  # "this network"; 0.0.0.0 reaches the local host
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("100.64.0.0/10"), "shared"),  # carrier-grade NAT (RFC 6598)
    (_V4("169.254.0.0/16"), "link_local"),  # includes 169.254.169.254, the metadata service
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved"),
    (_V4("192.0.0.0/24"), "reserved"),  # IETF protocol assignments
    (_V4("192.0.2.0/24"), "reserved"),  # documentation (TEST-NET-1..3)
    (_V4("198.51.100.0/24"), "reserved"),
    (_V4("203.0.113.0/24"), "reserved"),
    (_V4("198.18.0.0/15"), "reserved"),  # benchmarking
    (_V4("192.88.99.0/24"), "reserved"),  # deprecated 6to4 relay anycast
)
_V6_RANGES: Final[tuple[tuple[_V6, str], ...]] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("fe80::/10"), "link_local"),
    (_V6("fec0::/10"), "private"),  # deprecated site-local
    (_V6("fc00::/7"), "unique_local"),
    (_V6("ff00::/8"), "multicast"),
    (_V6("64:ff9b:1::/48"), "private"),  # NAT64 for local use (RFC 8215)
    (_V6("100::/64"), "reserved"),  # discard-only
    (_V6("2001:db8::/32"), "reserved"),  # documentation
    (_V6("3fff::/20"), "reserved"),  # documentation (RFC 9637)
)
_NAT64: Final = _V6("64:ff9b::/96")
_V4_COMPATIBLE: Final = _V6("::/96")
_GLOBAL_UNICAST: Final = _V6("2000::/3")  # everything else is unallocated or special

# A DNS label: letters, digits, hyphens (underscores occur in real names); IDNs arrive as
# punycode from yarl.
_LABEL: Final = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
# What WHATWG parsers and inet_aton read as an IPv4 number: 127.1, 0x7f.1, 2130706433, 0177...
_NUMERIC_LABEL: Final = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """What delivery may reach. The defaults are the production ones."""

    allow_http: bool = False  # WEBHOOK_ALLOW_HTTP
    allow_private: bool = False  # WEBHOOK_ALLOW_PRIVATE_TARGETS


class BlockedTarget(Exception):
    """A URL or address that the policy refuses; ``reason`` is a catalogue-style code.

    The message holds the reason only: URLs may carry integrators' tokens in their query.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def address_category(ip: IPAddress) -> str | None:
    """The special-purpose category of ``ip``, or None for a public (global unicast) address.

    IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64, 6to4, Teredo) are
    judged by the embedded address too, so ``::ffff:127.0.0.1`` is loopback.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        for net, name in _V4_RANGES:
            if ip in net:
                return name
        return None if ip.is_global else "reserved"

    ip = ipaddress.IPv6Address(int(ip))  # drop any %scope: it never makes an address public
    for net6, name6 in _V6_RANGES:
        if ip in net6:
            return name6
    if (mapped := ip.ipv4_mapped) is not None:
        return address_category(mapped)
    if ip in _V4_COMPATIBLE:  # deprecated ::a.b.c.d, never routed as such
        return address_category(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)) or "reserved"
    if ip in _NAT64:  # translated to the embedded IPv4 address by a NAT64 gateway
        return address_category(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if (sixtofour := ip.sixtofour) is not None and (inner := address_category(sixtofour)):
        return inner
    if ip.teredo is not None:
        for endpoint in ip.teredo:  # (server, client), the client already de-obfuscated
            if inner := address_category(endpoint):
                return inner
    return None if ip in _GLOBAL_UNICAST and ip.is_global else "reserved"


def address_rejection(ip: IPAddress, policy: TargetPolicy) -> str | None:
    """``target_<category>`` when the policy refuses ``ip``, else None."""
    category = address_category(ip)
    if category is None or (policy.allow_private and category not in ALWAYS_BLOCKED):
        return None
    return f"target_{category}"


def check_address(ip: IPAddress, policy: TargetPolicy) -> None:
    """Raise ``BlockedTarget`` when the policy refuses ``ip``."""
    if reason := address_rejection(ip, policy):
        raise BlockedTarget(reason)


def _parse_address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _host_rejection(host: str, policy: TargetPolicy) -> str | None:
    """Checks on the host alone (no DNS): a literal address is judged here and now."""
    if "%" in host:  # an IPv6 zone id: only meaningful on the local link
        return "url_host_invalid"
    if ":" in host:
        ip = _parse_address(host)
        return "url_host_invalid" if ip is None else address_rejection(ip, policy)
    name = host.lower().removesuffix(".")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        return "url_host_invalid"
    if _NUMERIC_LABEL.match(labels[-1]):
        # A numeric last label makes the host an IPv4 number to every parser; only the
        # canonical dotted quad is accepted, so that we judge the address that is dialled.
        ip = _parse_address(name)
        if ip is None or str(ip) != name:
            return "url_host_invalid"
        return address_rejection(ip, policy)
    if labels[-1] == "localhost" and not policy.allow_private:  # RFC 6761: always loopback
        return "target_loopback"
    return None


def _check_url(url: str, policy: TargetPolicy) -> URL:
    if len(url) > MAX_URL_LENGTH:
        raise BlockedTarget("url_too_long")
    try:
        parsed = URL(url)
        host = parsed.raw_host
        port = parsed.port
    except (ValueError, TypeError):
        raise BlockedTarget("url_invalid") from None
    if parsed.scheme not in ("https", "http"):
        raise BlockedTarget("url_scheme_not_allowed")
    if parsed.scheme == "http" and not policy.allow_http:
        raise BlockedTarget("url_scheme_not_allowed")
    if parsed.raw_user is not None or parsed.raw_password is not None:
        raise BlockedTarget("url_credentials_not_allowed")
    if not host:
        raise BlockedTarget("url_host_missing")
    if port is None or not 0 < port < 65536:
        raise BlockedTarget("url_port_invalid")
    if reason := _host_rejection(host, policy):
        raise BlockedTarget(reason)
    return parsed


def validate_url(url: str, policy: TargetPolicy) -> URL:
    """The parsed URL when its form is acceptable, else ``BlockedTarget``.

    Absolute ``https`` (``http`` only with ``allow_http``), a host, no user or password
    (credentials would be stored and logged as part of the URL), a port in range. A literal
    address or ``localhost`` is judged at once; other names are judged on delivery, by their
    addresses. The result is what the sender dials: parsing once, with the parser aiohttp
    itself uses, leaves no room for two parsers to disagree about the host.
    """
    return _check_url(url, policy)


def url_rejection(url: str, policy: TargetPolicy) -> str | None:
    """The reason ``validate_url`` would refuse ``url``, or None: the API's create/update check."""
    try:
        _check_url(url, policy)
    except BlockedTarget as exc:
        return exc.reason
    return None


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


class BoundedLookup:
    """A ``Lookup`` that runs ``resolve`` (getaddrinfo) on ``threads`` threads of its own, not
    the event loop's default pool, which every other blocking call of the process shares.

    A thread blocked in getaddrinfo cannot be cancelled, so what bounds the harm is who holds
    the threads: a lookup takes a thread for the workspace in ``LOOKUP_WORKSPACE``, and a
    workspace holds at most ``per_workspace`` of them, counted until the thread returns
    (callers that gave up included); beyond that its lookups wait, and only its own. A caller
    waits ``timeout_s`` at most (for a thread and for the answer), then fails with a DNS
    error (``socket.gaierror``, EAI_AGAIN) while the thread runs on. A host looked up while a
    lookup of it runs joins that one instead of taking a thread; a host whose lookup failed
    or outlasted ``timeout_s`` fails at once for ``failure_ttl_s`` (at most ``failures_kept``
    hosts are remembered, the oldest forgotten first). A caller that gave up while waiting
    for a thread does not mark the host: that says nothing of it.

    Safe to share between event loops (state under a thread lock; waiters are woken on their
    own loop). Counters: ``lookups`` (threads started), ``joined``, ``failed_fast`` (answered
    from the memory of failures), ``timed_out``; ``threads_held`` and ``held(workspace)``.
    """

    def __init__(
        self,
        *,
        threads: int = LOOKUP_THREADS,
        per_workspace: int = LOOKUP_THREADS_PER_WORKSPACE,
        timeout_s: float = LOOKUP_TIMEOUT_S,
        failure_ttl_s: float = LOOKUP_FAILURE_TTL_S,
        failures_kept: int = LOOKUP_FAILURES_KEPT,
        resolve: Resolve = system_resolve,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if threads < 1 or per_workspace < 1 or timeout_s <= 0 or failures_kept < 1:
            raise ValueError("threads, per_workspace, timeout_s and failures_kept must be > 0")
        self.threads = threads
        self.per_workspace = per_workspace
        self.timeout_s = timeout_s
        self.failure_ttl_s = failure_ttl_s
        self._failures_kept = failures_kept
        self._resolve = resolve
        self._clock = clock
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._held: dict[str, int] = {}
        self._threads_held = 0
        self._running: dict[str, concurrent.futures.Future[Sequence[str]]] = {}
        self._failed: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.lookups = 0
        self.joined = 0
        self.failed_fast = 0
        self.timed_out = 0

    @property
    def threads_held(self) -> int:
        """Threads running a lookup now, whether or not anyone still waits for it."""
        return self._threads_held

    def held(self, workspace_id: str) -> int:
        """Threads the workspace's lookups hold now."""
        return self._held.get(workspace_id, 0)

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        workspace = LOOKUP_WORKSPACE.get()
        name = host.lower()
        self._fail_if_failing(name, host)
        running = False
        try:
            async with asyncio.timeout(self.timeout_s):
                with self._lock:
                    future = self._running.get(name)
                if future is None:
                    await self._take_thread(workspace)
                    future = self._start(name, host, port, workspace)
                else:
                    self.joined += 1
                running = True
                return list(await _on_this_loop(future))
        except TimeoutError:
            if running:  # the host outlasted the time-out, not the wait for a thread
                self.timed_out += 1
                self._remember_failure(name, socket.EAI_AGAIN)
            raise socket.gaierror(
                socket.EAI_AGAIN, f"lookup of {host!r} gave no answer in {self.timeout_s}s"
            ) from None

    def _fail_if_failing(self, name: str, host: str) -> None:
        with self._lock:
            failed = self._failed.get(name)
            if failed is not None and failed[0] <= self._clock():
                del self._failed[name]
                failed = None
        if failed is not None:
            self.failed_fast += 1
            raise socket.gaierror(failed[1], f"lookup of {host!r} failed recently")

    def _remember_failure(self, name: str, errno: int) -> None:
        if self.failure_ttl_s <= 0:
            return
        with self._lock:
            self._failed[name] = (self._clock() + self.failure_ttl_s, errno)
            self._failed.move_to_end(name)
            while len(self._failed) > self._failures_kept:
                self._failed.popitem(last=False)

    async def _take_thread(self, workspace: str) -> None:
        """Reserve a thread for ``workspace``, waiting while it holds its share or all are
        held (the caller's time-out bounds the wait)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if (
                    self._held.get(workspace, 0) < self.per_workspace
                    and self._threads_held < self.threads
                ):
                    self._held[workspace] = self._held.get(workspace, 0) + 1
                    self._threads_held += 1
                    return
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
            try:
                await waiter
            finally:
                with self._lock, contextlib.suppress(ValueError):
                    self._waiters.remove((loop, waiter))

    def _start(
        self, name: str, host: str, port: int, workspace: str
    ) -> concurrent.futures.Future[Sequence[str]]:
        """Run the lookup on the thread reserved for it; or, when a lookup of the host was
        started while this one waited for its thread, give the thread back and join that."""
        with self._lock:
            running = self._running.get(name)
            if running is not None:
                self._give_back(workspace)
            elif self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.threads, thread_name_prefix="webhook-dns"
                )
            executor = self._executor
        if running is not None:
            self._wake_all()
            self.joined += 1
            return running
        assert executor is not None
        # Never queued inside the executor: a thread was reserved for it.
        future = executor.submit(self._resolve, host, port)
        self.lookups += 1
        with self._lock:
            self._running[name] = future
        future.add_done_callback(lambda f: self._ended(name, workspace, f))
        return future

    def _ended(
        self, name: str, workspace: str, future: concurrent.futures.Future[Sequence[str]]
    ) -> None:
        """On the lookup's thread: give the thread back, remember a failure, wake waiters."""
        error = future.exception()
        if isinstance(error, OSError):
            self._remember_failure(name, error.errno or socket.EAI_FAIL)
        with self._lock:
            if self._running.get(name) is future:
                del self._running[name]
            if error is None:
                self._failed.pop(name, None)
            self._give_back(workspace)
        self._wake_all()

    def _give_back(self, workspace: str) -> None:
        """A reserved thread is free again (called under the lock)."""
        held = self._held.get(workspace, 0) - 1
        if held > 0:
            self._held[workspace] = held
        else:
            self._held.pop(workspace, None)
        self._threads_held -= 1

    def _wake_all(self) -> None:
        """Every lookup waiting for a thread looks again, on its own loop."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there
                loop.call_soon_threadsafe(_wake, waiter)

    def close(self) -> None:
        """Stop accepting lookups' threads (those blocked still end on their own)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


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


async def resolve_target(
    host: str, port: int, policy: TargetPolicy, lookup: Lookup = system_lookup
) -> list[IPAddress]:
    """The addresses ``host`` resolves to, after one lookup, if the policy accepts EVERY one.

    All must pass, not just one: which of several addresses a client dials is not ours to
    choose (happy eyeballs, retries), and a name that mixes public and private addresses is
    an attack or a misconfiguration. An empty answer is an ``OSError`` (a DNS failure).
    """
    addresses: list[IPAddress] = []
    for text in await lookup(host, port):
        ip = _parse_address(text)
        if ip is None:
            raise BlockedTarget("target_unparseable_address")
        check_address(ip, policy)
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise OSError(f"no address found for {host!r}")
    return addresses
