"""The front-end's HTTP/1.1 connection: uvicorn's httptools protocol plus the limits uvicorn lacks
(docs/operations.md, "Front-door limits"). Refusals below the app are plain text with
``Connection: close``, then a linger, so the client reads the answer, not a reset.

Over 500 lines: one connection's life is one class, whose parts share its state."""

from __future__ import annotations

import asyncio
import http
import ipaddress
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, cast

from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from worker.runtime.admission import Admission, NoRoom, Share, Slot

LINGER_S: Final = 1.0
"""How long a refused connection's input is drained before it is closed."""

MAX_LINGERING: Final = 64
"""Refused connections draining at once per server: past it a refusal is written and the
connection closed without the linger, so refusals cannot hold sockets beyond every count."""

MAX_PIPELINED: Final = 16
"""Requests read ahead of the one being answered on a connection (HTTP/1.1 pipelining). At
the bound the connection is not read further (``pause_reading``) and the rest of the last read
is held unparsed until an answer makes room: the connection holds at most this many parsed
requests plus one read (``READ_BYTES``), never a whole flood's worth."""

READ_BYTES: Final = 8 * 1024
"""The most one read brings in, so the most unparsed input a paused connection holds."""

PIPELINED_BYTES: Final = 8 * 1024
"""The most input parsed ahead of the request being answered: past it the connection is read no
further until its pipeline is empty."""

WRITE_TIMEOUT_S: Final = 30.0
"""Longest a peer may leave its answers unread: from the moment the unsent answer bytes pass
the transport's high-water mark (64 KiB), or from a close with answer bytes still unsent, to
the moment they drain; then the connection is aborted (reason ``write_timeout``)."""

_HEAD_END: Final = b"\n\r\n"
"""Every request head ends with ``\\r\\n\\r\\n`` (llhttp requires the CRs): its last byte is
the last byte of a ``\\n\\r\\n``, which is what ``_slice_end`` counts (a superset)."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The per-connection limits (``API_MAX_HEADER_BYTES`` and the rest; docs/operations.md,
    "Front-door limits")."""

    max_head_bytes: int
    max_headers: int
    head_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_connections_per_client: int = 0
    max_pipelined: int = MAX_PIPELINED
    write_timeout_s: float = WRITE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_pipelined < 1:
            raise ValueError("max_pipelined must be at least 1: the request being read")


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a refused head."""


Refusal = Callable[[str], None]
"""Called with the reason of each refusal (the metric's label)."""


def connection_share(limits: ConnectionLimits) -> Share:
    """A quarter of the connections (never so many that one address could not reach its share)
    is kept for addresses holding none, so addresses at their share leave room for new ones."""
    capacity = limits.max_connections
    per_client = limits.max_connections_per_client
    if per_client <= 0:
        return Share(capacity=capacity, per_owner=capacity)
    per_owner = min(per_client, capacity)
    return Share(capacity, per_owner, reserve=min(capacity // 4, capacity - per_owner))


class _Policy:
    """One server's limits, refusal counter and connection slots."""

    def __init__(self, limits: ConnectionLimits, on_refusal: Refusal) -> None:
        self.limits = limits
        self.on_refusal = on_refusal
        self.slots = Admission("connections", connection_share(limits), retry_after_s=1.0)
        self.lingering = 0

    def owner(self, client: tuple[str, int] | None) -> str:
        if self.limits.max_connections_per_client <= 0 or client is None:
            return "*"
        return client_key(client[0])


def client_key(host: str) -> str:
    """An IPv6 client counts by its /64 (one host is commonly given a whole /64), an IPv4-mapped
    one as its IPv4 address."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))


def _next_head_end(data: bytes, pos: int) -> int:
    """The first index from ``pos`` at which a request head may end, or -1. A head begun in
    an earlier read may end at a read's first two bytes; those count when ``pos`` is there."""
    if pos == 0 and data[:1] == b"\n":
        return 0
    if pos <= 1 and data[:2] == b"\r\n":
        return 1
    found = data.find(_HEAD_END, max(pos - 2, 0))
    return -1 if found < 0 else found + 2


def _slice_end(data: bytes, start: int, room: int) -> int:
    """The end of the longest ``data[start:end]`` in which at most ``room`` (at least 1)
    request heads can end: one ``find`` per head, so a slice holding bodies or few heads is
    fed to the parser in one go."""
    pos = start
    for _ in range(room):
        end = _next_head_end(data, pos)
        if end < 0:
            return len(data)
        pos = end + 1
    end = _next_head_end(data, pos)
    return len(data) if end < 0 else end


def plain_response(status: int, *, retry_after_s: int | None = None) -> bytes:
    phrase = http.HTTPStatus(status).phrase
    body = f"{phrase}\n".encode()
    retry = b"" if retry_after_s is None else b"retry-after: %d\r\n" % retry_after_s
    return (
        b"HTTP/1.1 %d %s\r\n" % (status, phrase.encode())
        + b"content-type: text/plain; charset=utf-8\r\n"
        + b"content-length: %d\r\n" % len(body)
        + retry
        + b"connection: close\r\n\r\n"
        + body
    )


class _Flow(FlowControl):
    """uvicorn's flow control, except that reading stays paused while the protocol holds
    input or its pipeline is full (uvicorn resumes it after every answer and on every
    ``receive``)."""

    def __init__(self, transport: asyncio.Transport, holding: Callable[[], bool]) -> None:
        super().__init__(transport)
        self._holding = holding

    def resume_reading(self) -> None:
        if not self._holding():
            super().resume_reading()


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the module's limits (one subclass per server:
    ``limited_protocol``)."""

    policy: ClassVar[_Policy]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = self.policy.limits
        self._head_left = self.limits.max_head_bytes
        self._heads_read = 0
        # A phase's deadline is armed at the end of the first read that leaves it unfinished,
        # so a request read in one go costs no timer.
        self._reading_head = False
        self._in_body = False
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False
        # Input read but not parsed yet (the pipeline was full): ``_input[_input_at:]``.
        self._input = b""
        self._input_at = 0
        # Input parsed since the pipeline was last empty: ``PIPELINED_BYTES`` bounds it.
        self._ahead = 0
        self._pump_scheduled = False
        self._write_timer: asyncio.TimerHandle | None = None
        self._slot: Slot | None = None
        self._lingering = False
        # The request being answered (uvicorn's ``cycle`` is the last one read).
        self._answering: RequestResponseCycle | None = None

    # -- connection --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _Flow(transport, self._holding)
        try:
            self._slot = self.policy.slots.take(self.policy.owner(self.client))
        except NoRoom as refused:
            full = refused.reason == "full"
            self._refuse(503, "connection_limit" if full else "client_connection_limit")
            return
        self._reading_head = True
        self._arm_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        # uvicorn marks the last request read as disconnected; with requests pipelined, the
        # one being answered is another (waiting in ``drain``, it would write to the closed
        # transport: uvloop raises).
        self._answer_abandoned()
        self._cancel_timer()
        self._stop_lingering()
        self._cancel_write_deadline()
        self._release_client_slot()
        self._input = b""
        self._input_at = 0
        super().connection_lost(exc)

    def _release_client_slot(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    # -- reading: pipelining within its bound -------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._input_at < len(self._input):
            # Reading is paused while input is held; should a read come in anyway, keep it.
            self._input = self._input[self._input_at :] + data
        else:
            self._input = data
        self._input_at = 0
        self._pump()

    def _holding(self) -> bool:
        return self._input_at < len(self._input) or len(self.pipeline) >= self.limits.max_pipelined

    def _pump(self) -> None:
        """Parse held input in slices in which at most as many heads can end as the pipeline
        has room for; at the bound, keep the rest and pause reading until an answer is out."""
        self._pump_scheduled = False
        data = self._input
        while self._input_at < len(data) and not self._refused and not self.transport.is_closing():
            room = self.limits.max_pipelined - len(self.pipeline)
            if room <= 0:
                break
            start = self._input_at
            end = _slice_end(data, start, room)
            if not self.pipeline:
                self._ahead = 0
            elif self._ahead >= PIPELINED_BYTES:
                break
            else:
                end = min(end, start + PIPELINED_BYTES - self._ahead)
            self._ahead += end - start
            self._input_at = end
            self._parse(data if start == 0 and end == len(data) else memoryview(data)[start:end])
        if self._refused or self.transport.is_closing() or self._input_at >= len(self._input):
            self._input = b""
            self._input_at = 0
        if self._refused or self.transport.is_closing():
            return
        if self._holding():
            self.flow.pause_reading()
        elif self.cycle is None or len(self.cycle.body) <= HIGH_WATER_LIMIT:
            # uvicorn pauses while a request is pipelined and resumes after the answer; the
            # bound is ``max_pipelined`` here (a large body keeps uvicorn's own pause).
            self.flow.resume_reading()
        self._arm_timer()

    def _parse(self, data: bytes | memoryview) -> None:
        """Feed the parser, a head never more than the head budget at a time."""
        view: bytes | memoryview = data
        while view and not self._refused:
            if self._in_body or len(view) <= self._head_left:
                if not self._in_body:
                    self._head_left -= len(view)
                self._feed(view)
                break
            # Over the budget: feed up to it; if the head ends in there, go on with the rest.
            view = memoryview(view)
            chunk, view = view[: self._head_left], view[self._head_left :]
            self._head_left = 0
            heads = self._heads_read
            self._feed(chunk)
            if self._heads_read == heads and not self._refused and not self.transport.is_closing():
                # The budget is spent and the head goes on.
                self._refuse(431, "header_too_large")

    def _feed(self, data: bytes | memoryview) -> None:
        if self.transport.is_closing() or self._refused:
            return
        super().data_received(data if isinstance(data, bytes) else bytes(data))

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a head the parser rejects, unless the head was refused (a
        callback raised ``_Refused``): the refusal is then the connection's one answer."""
        if not self._refused:
            super().send_400_response(msg)
            self._write_deadline_if_unsent()

    # -- parser callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True

    def on_headers_complete(self) -> None:
        self._cancel_timer()
        self._heads_read += 1
        self._reading_head = False
        self._in_body = True
        if len(self.headers) > self.limits.max_headers:
            self._refuse(431, "too_many_headers")
            raise _Refused  # stops the parser: no app is started for this head
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self._in_body = False
        self._head_left = self.limits.max_head_bytes
        super().on_message_complete()
        idle = self.cycle.response_complete and not self.pipeline
        if idle and self.timeout_keep_alive_task is None and not self.transport.is_closing():
            # Answered before its body ended: uvicorn armed the keep-alive timer at the answer,
            # and the body's later bytes cancelled it. Idle from now on: arm it again.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._answering = cycle
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        """uvicorn's (start the next pipelined request), then the held input is parsed as the
        pipeline has room again, from the loop rather than inside the answer's ``send``."""
        super().on_response_complete()
        if self.transport.is_closing():
            self._write_deadline_if_unsent()
            return
        if self._input_at < len(self._input) and not self._pump_scheduled:
            self._pump_scheduled = True
            self.loop.call_soon(self._pump)

    # -- writing: answers the peer leaves unread ---------------------------------------------

    def pause_writing(self) -> None:
        """The transport holds more unsent answer bytes than its high-water mark: the peer
        has until the write deadline to read them."""
        super().pause_writing()
        self._arm_write_deadline()

    def resume_writing(self) -> None:
        if not self.transport.is_closing():
            self._cancel_write_deadline()
        elif self.transport.get_write_buffer_size() == 0:
            # Aborted (by the write deadline or a reset): uvloop resumes the writer before
            # ``connection_lost``, and the answer under way must not write to the closed
            # transport (uvloop raises). A closing transport still sending keeps its answer.
            self._answer_abandoned()
        super().resume_writing()

    def _answer_abandoned(self) -> None:
        cycle = self._answering
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self._close()

    def _close(self) -> None:
        """A closing transport waits for its unsent bytes: the write deadline bounds it."""
        self.transport.close()
        self._write_deadline_if_unsent()

    def _write_deadline_if_unsent(self) -> None:
        if self.transport.get_write_buffer_size() > 0:
            self._arm_write_deadline()

    def _arm_write_deadline(self) -> None:
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(
                self.limits.write_timeout_s, self._write_expired
            )

    def _cancel_write_deadline(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_expired(self) -> None:
        self._write_timer = None
        self.policy.on_refusal("write_timeout")
        self._refused = True
        self._input = b""
        self._input_at = 0
        self._cancel_timer()
        self._answer_abandoned()
        self.transport.abort()

    # -- time-outs and refusals --------------------------------------------------------------

    def _arm_timer(self) -> None:
        if self._timer is not None:
            return
        if self._reading_head:
            self._timer = self.loop.call_later(self.limits.head_timeout_s, self._expired)
        elif self._in_body:
            self._timer = self.loop.call_later(self.limits.body_timeout_s, self._expired)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._refused:
            return
        if not self._reading_head and not self._in_body:
            return
        if self._reading_head:
            self._refuse(408, "head_timeout")
            return
        # The body is late. An app still reading it answers 408 at its own deadline (now);
        # one that has answered already is done with the connection.
        self.policy.on_refusal("body_timeout")
        self._refused = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
        else:
            self._close()

    def _refuse(self, status: int, reason: str) -> None:
        """Answer ``status`` below the app and close: at once when no response is under way,
        else after it (``keep_alive`` off); input from now on is dropped."""
        self.policy.on_refusal(reason)
        self._refused = True
        self._cancel_timer()
        self._input = b""
        self._input_at = 0
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            return
        self.connections.discard(self)
        self._release_client_slot()
        self.flow.resume_reading()  # the linger drains what the client still sends
        retry = 1 if status == 503 else None
        self.transport.write(plain_response(status, retry_after_s=retry))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self.policy.lingering >= MAX_LINGERING:
            self._close()
            return
        self.policy.lingering += 1
        self._lingering = True
        self._timer = self.loop.call_later(LINGER_S, self._lingered)

    def _lingered(self) -> None:
        self._timer = None
        self._stop_lingering()
        self._close()

    def _stop_lingering(self) -> None:
        if self._lingering:
            self._lingering = False
            self.policy.lingering -= 1


class _Reads(threading.local):
    """One read buffer per thread (each loop's reads run one at a time, each handed on as
    bytes before the next), so an idle connection holds none."""

    def __init__(self) -> None:
        self.buffer = bytearray(READ_BYTES)


_READS: Final = _Reads()


class BoundedReads(asyncio.BufferedProtocol):
    """Reads of at most ``READ_BYTES`` handed to the connection's ``LimitedHttpProtocol``: a
    buffered protocol is the one way to set the read size on both loops."""

    http_class: ClassVar[type[LimitedHttpProtocol]]

    def __init__(self, **uvicorn_args: Any) -> None:
        self.http = self.http_class(**uvicorn_args)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.http.connection_made(cast(asyncio.Transport, transport))

    def connection_lost(self, exc: Exception | None) -> None:
        self.http.connection_lost(exc)

    def eof_received(self) -> None:
        self.http.eof_received()

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()

    def get_buffer(self, sizehint: int) -> bytearray:
        return _READS.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.http.data_received(bytes(memoryview(_READS.buffer)[:nbytes]))


def limited_protocol(limits: ConnectionLimits, on_refusal: Refusal) -> type[asyncio.Protocol]:
    """The protocol class for one server (uvicorn's ``Config(http=...)``)."""
    http_class = type(
        "LimitedHttpProtocol", (LimitedHttpProtocol,), {"policy": _Policy(limits, on_refusal)}
    )
    reads = type("BoundedReads", (BoundedReads,), {"http_class": http_class})
    return cast(type[asyncio.Protocol], reads)
