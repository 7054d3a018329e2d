"""Delivery's DNS lookups are bounded per workspace (issue 31, row 6): endpoint hosts whose
nameserver never answers hold their own workspace's resolver threads, not everyone's.

The system resolver is replaced by a test double at its boundary (``socket.getaddrinfo``, or
the ``resolve`` function ``BoundedLookup`` runs on its threads): it blocks, like getaddrinfo
on a zone whose nameserver drops queries, for ``*.hang.test`` and answers 127.0.0.1 at once
for any other ``*.test`` name (``*.slow.test`` after 0.2 s). Everything above it (the thread
pool, the caps, the time-outs, aiohttp's connector, the gate) is the real code; the receiver
is on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import pytest
from aiohttp import web

from worker.dispatcher.endpoint_gate import EndpointGate, GateConfig
from worker.dispatcher.sender import ErrorKind, Sender, open_session
from worker.runtime.admission import NoRoom
from worker.webhooks.lookup import LOOKUP_WORKSPACE, BoundedLookup, system_lookup
from worker.webhooks.targets import TargetPolicy

LAX = TargetPolicy(allow_http=True, allow_private=True)
RELEASE_S = 20.0  # a blocked double gives up on its own after this (bounded, whatever happens)


class HangingZone:
    """The resolver double: ``*.hang.test`` blocks until ``release``, then fails (EAI_AGAIN);
    other ``*.test`` names answer 127.0.0.1; anything else goes to ``real``. ``calls``: the
    lookups that reached it (each on a thread of its own)."""

    def __init__(self, real: Callable[..., Any] | None = None) -> None:
        self.released = threading.Event()
        self.blocked = 0
        self.calls = 0
        self._lock = threading.Lock()
        self._real = real

    def resolve(self, host: str, port: int) -> Sequence[str]:
        with self._lock:
            self.calls += 1
        if host.endswith(".hang.test"):
            with self._lock:
                self.blocked += 1
            try:
                self.released.wait(RELEASE_S)
            finally:
                with self._lock:
                    self.blocked -= 1
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if host.endswith(".slow.test"):
            time.sleep(0.2)
        if host.endswith(".test"):
            return ["127.0.0.1"]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def getaddrinfo(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".test"):
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port or 0))
                for a in self.resolve(host, port)
            ]
        assert self._real is not None
        return self._real(host, port, *args, **kwargs)


async def looked_up_for(workspace: str, lookup: Any, host: str) -> Sequence[str]:
    LOOKUP_WORKSPACE.set(workspace)  # this task's context only, as the gate sets it
    result: Sequence[str] = await lookup(host, 443)
    return result


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.01)


async def test_a_hanging_zone_of_one_workspace_leaves_the_others_lookups_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process's ``system_lookup`` with getaddrinfo replaced: ws_a's 12 endpoint hosts
    hang; ws_b's 5 lookups answer at once. Before: all went to the loop's default pool
    (min(32, cores + 4) threads: 6 here), ws_a's lookups held every thread and ws_b's queued
    behind them until they timed out here."""
    zone = HangingZone(real=socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", zone.getaddrinfo)
    hanging = [
        asyncio.create_task(looked_up_for("ws_a", system_lookup, f"a{i}.row6-1.hang.test"))
        for i in range(12)
    ]
    try:
        await wait_for(lambda: zone.blocked >= 2)
        await asyncio.sleep(0.1)  # every one of ws_a's lookups has had its chance at a thread
        started = time.monotonic()
        answers = await asyncio.wait_for(
            asyncio.gather(
                *(looked_up_for("ws_b", system_lookup, f"b{i}.row6-1.test") for i in range(5))
            ),
            timeout=3.0,
        )
        elapsed = time.monotonic() - started
        print(f"\nws_b's 5 lookups while ws_a's 12 hang: {elapsed * 1000:.1f} ms")
        assert [list(a) for a in answers] == [["127.0.0.1"]] * 5
        assert elapsed < 1.0
        assert zone.blocked == 2, "ws_a holds its 2 threads, no more"
        assert isinstance(system_lookup, BoundedLookup)
        assert system_lookup.held("ws_a") == 2
    finally:
        zone.released.set()
        results = await asyncio.gather(*hanging, return_exceptions=True)
    # Two had ws_a's threads and failed; the other ten were refused a thread at once.
    assert sum(isinstance(r, socket.gaierror) for r in results) == 2, results
    assert sum(isinstance(r, NoRoom) for r in results) == 10, results
    await wait_for(lambda: zone.blocked == 0)


async def test_the_time_out_frees_the_caller_and_a_failing_host_fails_fast() -> None:
    """A caller waits ``timeout_s``, then a DNS error while the thread stays blocked and
    counted to its workspace; the host then fails at once from memory (no thread) until
    ``failure_ttl_s`` has passed; a host looked up twice at once is looked up once."""
    zone = HangingZone()
    now = [1000.0]
    lookup = BoundedLookup(
        threads=4,
        per_workspace=2,
        timeout_s=0.3,
        failure_ttl_s=30.0,
        resolve=zone.resolve,
        clock=lambda: now[0],
    )
    try:
        started = time.monotonic()
        with pytest.raises(socket.gaierror) as failed:
            await looked_up_for("ws_a", lookup, "x.row6-2.hang.test")
        assert failed.value.errno == socket.EAI_AGAIN
        assert 0.25 < time.monotonic() - started < 1.0
        assert (zone.calls, lookup.held("ws_a"), lookup.threads_held) == (1, 1, 1)

        with pytest.raises(socket.gaierror):
            await looked_up_for("ws_b", lookup, "X.row6-2.hang.test")  # any workspace, any case
        assert zone.calls == 1, "answered from memory"

        together = await asyncio.gather(
            looked_up_for("ws_b", lookup, "same.row6-2.slow.test"),
            looked_up_for("ws_c", lookup, "same.row6-2.slow.test"),
        )
        assert [list(a) for a in together] == [["127.0.0.1"]] * 2
        assert zone.calls == 2, "one lookup for both"

        now[0] += 31.0  # the failure is forgotten, but the host's lookup still hangs:
        with pytest.raises(socket.gaierror):  # joined, not a second thread for the host
            await looked_up_for("ws_a", lookup, "x.row6-2.hang.test")
        assert (zone.calls, lookup.held("ws_a")) == (2, 1)
    finally:
        zone.released.set()
    await wait_for(lambda: lookup.threads_held == 0)
    now[0] += 31.0  # the thread ended failing (remembered), and that is forgotten too
    with pytest.raises(socket.gaierror):
        await looked_up_for("ws_a", lookup, "x.row6-2.hang.test")
    assert zone.calls == 3
    await wait_for(lambda: lookup.threads_held == 0)
    assert lookup.held("ws_a") == 0
    lookup.close()


async def test_a_workspace_past_its_threads_is_refused_at_once_and_only_it() -> None:
    """ws_a's third lookup finds no thread of its share: refused at once (``NoRoom``, with a
    Retry-After), leaving the host unmarked (the refusal said nothing of the host); ws_b
    takes a thread at once; the thread pool never holds more than ``threads``."""
    zone = HangingZone()
    lookup = BoundedLookup(threads=3, per_workspace=2, timeout_s=0.3, resolve=zone.resolve)
    hanging = [
        asyncio.create_task(looked_up_for("ws_a", lookup, f"h{i}.row6-3.hang.test"))
        for i in range(2)
    ]
    try:
        await wait_for(lambda: zone.blocked == 2)
        started = time.monotonic()
        with pytest.raises(NoRoom) as refused:
            await looked_up_for("ws_a", lookup, "third.row6-3.test")
        assert time.monotonic() - started < 0.2, "refused at once, not at the time-out"
        assert (refused.value.reason, refused.value.retry_after_s) == ("share", 1)
        assert zone.calls == 2, "the refused lookup reached no thread"
        # Had the refusal marked the host, ws_b's lookup would fail from memory.
        assert list(await looked_up_for("ws_b", lookup, "third.row6-3.test")) == ["127.0.0.1"]
        assert zone.calls == 3
        assert lookup.threads_held <= lookup.threads
    finally:
        zone.released.set()
        await asyncio.gather(*hanging, return_exceptions=True)
    await wait_for(lambda: lookup.threads_held == 0)
    lookup.close()


async def receiver() -> AsyncGenerator[int, None]:
    app = web.Application()

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=204)

    app.router.add_post("/hook", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        server = site._server
        assert server is not None
        yield server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    finally:
        await runner.cleanup()


async def test_the_gate_names_the_workspace_of_the_attempts_lookup() -> None:
    """End to end through the dispatcher's gate and the real sender: ws_a's 8 attempts to
    hanging hosts hold ws_a's 2 threads (two end as DNS errors at the lookup's time-out, the
    other six find no thread of ws_a's: ``capacity``, the dispatcher's to defer, not the
    receiver's failure); ws_b's attempt, admitted meanwhile, is delivered at once."""
    zone = HangingZone()
    lookup = BoundedLookup(threads=4, per_workspace=2, timeout_s=1.0, resolve=zone.resolve)
    gate = EndpointGate(GateConfig(), wake=lambda *_: True)
    session = open_session(LAX, lookup=lookup)
    sender = Sender(session, timeout_s=10.0)
    serving = receiver()
    port = await anext(serving)

    async def attempt(workspace: str, endpoint: str, host: str) -> Any:
        admitted = gate.admit(
            endpoint,
            revision=1,
            rate_limit=None,
            partition=0,
            key=f"{endpoint}/acc",
            now=0.0,
            workspace_id=workspace,
        )
        assert admitted.admitted
        try:
            return await sender.post(f"http://{host}:{port}/hook", b"{}", {})
        finally:
            gate.release(endpoint, ok=None, now=0.0)

    try:
        hanging = [
            asyncio.create_task(attempt("ws_a", f"ep_a{i}", f"a{i}.row6-4.hang.test"))
            for i in range(8)
        ]
        await wait_for(lambda: zone.blocked == 2)
        started = time.monotonic()
        delivered = await asyncio.wait_for(attempt("ws_b", "ep_b", "b.row6-4.test"), 3.0)
        elapsed = time.monotonic() - started
        print(
            f"\nws_b's attempt while ws_a's 8 hang: {delivered.status} in {elapsed * 1000:.1f} ms"
        )
        assert delivered.status == 204 and elapsed < 0.5
        assert (lookup.held("ws_a"), zone.blocked) == (2, 2)
        failed = await asyncio.gather(*hanging)
        kinds = sorted(str(r.error) for r in failed)
        assert kinds == ["capacity"] * 6 + ["dns"] * 2, failed
        assert all(r.retry_after_s == 1.0 for r in failed if r.error == ErrorKind.CAPACITY)
        assert max(r.elapsed_s for r in failed) < 3.0, "each caller freed by the time-out"
    finally:
        zone.released.set()
        await session.close()
        await serving.aclose()
    await wait_for(lambda: lookup.threads_held == 0)
    lookup.close()


async def test_eight_workspaces_at_their_share_leave_threads_for_a_ninth() -> None:
    """The default pool (16 threads, 2 a workspace): eight workspaces each looking up hosts
    that hang hold no more than 14 threads (the rule keeps a quarter for workspaces holding
    none, beyond their first), so a ninth workspace's lookup is answered at once. Before,
    8 x 2 held all 16 and the ninth waited out its time-out."""
    zone = HangingZone()
    lookup = BoundedLookup(timeout_s=3.0, resolve=zone.resolve)
    hanging = [
        asyncio.create_task(looked_up_for(f"ws_{w}", lookup, f"h{i}.w{w}.row5.hang.test"))
        for w in range(8)
        for i in range(2)
    ]
    try:
        await wait_for(lambda: all(t.done() for t in hanging) or zone.blocked >= 14)
        await asyncio.sleep(0.05)  # every one of them has had its chance at a thread
        assert lookup.threads_held < lookup.threads, "the eight took every thread"
        assert lookup.threads_held == zone.blocked <= 14
        assert all(lookup.held(f"ws_{w}") >= 1 for w in range(8)), "each has its first"
        answer = await asyncio.wait_for(looked_up_for("ws_new", lookup, "new.row5.test"), 1.0)
        assert list(answer) == ["127.0.0.1"]
    finally:
        zone.released.set()
        await asyncio.gather(*hanging, return_exceptions=True)
    await wait_for(lambda: lookup.threads_held == 0)
    lookup.close()
