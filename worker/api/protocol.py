"""The front-end's HTTP/1.1 connection: uvicorn's httptools protocol plus the head-size,
header-count, time-out and connection limits uvicorn lacks (docs/operations.md, "Front-door
limits"; why: docs/architecture.md, "The front-end"). Refusals below the app are plain text
with ``Connection: close``, then a linger, so the client reads the answer, not a reset."""

from __future__ import annotations

import asyncio
import http
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

LINGER_S: Final = 1.0
"""How long a refused connection's input is drained before it is closed."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The per-connection limits (settings ``API_MAX_HEADER_BYTES`` and the rest)."""

    max_head_bytes: int
    max_headers: int
    head_timeout_s: float
    body_timeout_s: float
    max_connections: int


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a refused head."""


Refusal = Callable[[str], None]
"""Called with the reason of each refusal (the metric's label)."""


@dataclass(frozen=True, slots=True)
class _Policy:
    limits: ConnectionLimits
    on_refusal: Refusal


def plain_response(status: int, *, retry_after_s: int | None = None) -> bytes:
    """A complete, minimal HTTP/1.1 response that closes the connection."""
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


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the module's limits; ``limited_protocol`` makes the
    subclass a server uses (uvicorn instantiates the class itself, once per connection)."""

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
        # What is being read: a head (from the connection's start or a request's first byte),
        # a body (from the end of its head), or nothing. The phase's deadline is armed at the
        # end of the first read that leaves it unfinished, so a request read in one go costs
        # no timer.
        self._reading_head = False
        self._in_body = False
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False

    # -- connection --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "connection_limit")
            return
        self._reading_head = True
        self._arm_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
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
        if not self._refused:
            self._arm_timer()

    def _feed(self, data: bytes | memoryview) -> None:
        """``HttpToolsProtocol.data_received``, minus what a refusal already answered."""
        if self.transport.is_closing() or self._refused:
            return
        super().data_received(data if isinstance(data, bytes) else bytes(data))

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a head the parser rejects, unless the head was refused (a
        callback raised ``_Refused``): the refusal is then the connection's one answer."""
        if not self._refused:
            super().send_400_response(msg)

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

    # -- time-outs and refusals --------------------------------------------------------------

    def _arm_timer(self) -> None:
        """One timer at a time: the head's deadline while a head is read, else the body's."""
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
            self.transport.close()

    def _refuse(self, status: int, reason: str) -> None:
        """Answer ``status`` below the app and close: at once when no response is under way,
        else after it (``keep_alive`` off); input from now on is dropped."""
        self.policy.on_refusal(reason)
        self._refused = True
        self._cancel_timer()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            return
        self.connections.discard(self)  # no longer served: not counted against the limit
        retry = 1 if status == 503 else None
        self.transport.write(plain_response(status, retry_after_s=retry))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)


def limited_protocol(limits: ConnectionLimits, on_refusal: Refusal) -> type[LimitedHttpProtocol]:
    """The protocol class for one server (uvicorn's ``Config(http=...)``)."""
    return type(
        "LimitedHttpProtocol", (LimitedHttpProtocol,), {"policy": _Policy(limits, on_refusal)}
    )
