"""One keep-alive HTTP/1.1 connection parsed by httptools: one exchange at a time, each phase timed,
head and body capped (docs/architecture.md, "Outbound HTTP")."""

from __future__ import annotations

import asyncio
import ssl
from typing import Final, cast

import httptools

from worker.runtime.http1.errors import HttpTimeout, PeerClosed, ProtocolError

__all__ = ["HEAD_CAP", "Connection", "Exchange"]

HEAD_CAP: Final = 64 * 1024
"""Bytes of status lines and header fields an answer may have before its body (informational
answers included); more is a protocol error."""

_PREFIX: Final = b"HTTP/"  # llhttp also reads RTSP/ and ICE/ answers: not ours

# status, header fields as sent, the body kept (at most the cap), whether more followed
Exchange = tuple[int, list[tuple[bytes, bytes]], bytes, bool]


class _Stop(Exception):
    """Raised in a parser callback once the exchange is settled, to stop the parser."""


class Connection(asyncio.Protocol):
    """A connection the pool lends to one request at a time; ``open`` turns false as soon as
    the transport is lost or anything unexpected arrives while idle."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        # Header values with control bytes (not CR, LF: llhttp still refuses those, nor NUL:
        # ``on_header`` does) and obsolete line folding are read, as other clients read them:
        # a value we cannot use is ignored by its reader, the answer's status still counts.
        self._parser.set_dangerous_leniencies(lenient_headers=True)
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.reusable = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[Exchange] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._phase = "headers"
        self._timed_to_deadline = False  # the timer runs out at ``_deadline`` itself
        self._deadline = 0.0
        self._body_s = 0.0
        self._cap = 0
        self._head_left = 0
        self._prefix = b""
        self._status = 0
        self._fields: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._size = 0
        self._answered = False  # an answer byte arrived
        self._headers_done = False
        self._informational = False
        self._framed = False  # Content-Length or chunked: the end is known without a close

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.open = True

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # unasked bytes: whatever the peer is, not a server of ours
            self.abort()
            return
        self._answered = True
        if len(self._prefix) < len(_PREFIX):
            self._prefix += data[: len(_PREFIX) - len(self._prefix)]
            if not _PREFIX.startswith(self._prefix):
                self._fail(ProtocolError("not_http"))
                return
        if not self._headers_done:
            if len(data) > self._head_left:
                head, data = data[: self._head_left], data[self._head_left :]
                self._head_left = 0
                if not self._feed(head):
                    return
                if not self._headers_done:
                    self._fail(ProtocolError("head_too_large"))
                    return
            else:
                self._head_left -= len(data)
        self._feed(data)

    def eof_received(self) -> bool | None:
        return None  # close: a half-closed connection is not reused

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.reusable = False
        if self._waiter is None:
            return
        if self._headers_done and not self._framed and (exc is None or _tls_eof(exc)):
            self._finish(False)  # a body delimited by the close
            return
        reason = type(exc).__name__ if exc is not None else "closed"
        self._fail(PeerClosed(reason, before_answer=not self._answered))

    # -- httptools callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._waiter is None:  # a second answer to one request
            self.abort()
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        if b"\0" in value:
            self._fail(ProtocolError("malformed_head"))
            raise _Stop
        self._fields.append((name, value))
        lowered = name.lower()
        if lowered == b"content-length" or (
            lowered == b"transfer-encoding" and value.rstrip().lower().endswith(b"chunked")
        ):
            self._framed = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if not 100 <= status <= 599:  # three digits, yet no HTTP status (RFC 9110)
            self._fail(ProtocolError("status_out_of_range"))
            raise _Stop
        if status == 101:  # never asked for: the connection would stop being HTTP
            self._fail(ProtocolError("unexpected_upgrade"))
            raise _Stop
        if status < 200:  # 100 Continue, 103 Early Hints: not the answer, skipped
            self._informational = True
            return
        self._status = status
        self._headers_done = True
        self._arm(self._body_s, "body")

    def on_body(self, body: bytes) -> None:
        if self._waiter is None:
            return
        room = self._cap - self._size
        if len(body) > room:  # past the cap: keep what fits, drop the connection
            if room > 0:
                self._chunks.append(body[:room])
            self._size = self._cap
            self._finish(True)
            self.abort()
            raise _Stop
        self._chunks.append(body)
        self._size += len(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            self._fields = []
            self._framed = False
            return
        self.reusable = self._parser.should_keep_alive()
        self._finish(False)

    # -- the exchange -------------------------------------------------------------------------
    def exchange(
        self, request: bytes, *, cap: int, headers_s: float, body_s: float, deadline: float
    ) -> asyncio.Future[Exchange]:
        """Write ``request``; the future is its answer, or a failure ``HttpError``. Each
        phase ends at its time-out or at ``deadline`` (the loop's clock), whichever is first.
        The caller must not reuse the connection unless ``reusable`` after the answer."""
        assert self.transport is not None and self._waiter is None
        waiter: asyncio.Future[Exchange] = self._loop.create_future()
        self._waiter = waiter
        self._cap, self._body_s, self._deadline = cap, body_s, deadline
        self._head_left, self._prefix = HEAD_CAP, b""
        self._status, self._fields, self._chunks, self._size = 0, [], [], 0
        self._answered = self._headers_done = self._informational = self._framed = False
        self.reusable = False
        self._arm(headers_s, "headers")
        self.transport.write(request)
        return waiter

    def abort(self) -> None:
        """Drop the connection at once (nothing left to flush that matters)."""
        self.open = False
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    def _feed(self, data: bytes) -> bool:
        """Parse ``data``; false once the exchange is settled (nothing more to parse)."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Stop):
                self._fail(exc)
            return False
        except httptools.HttpParserError as exc:
            done = self._headers_done
            failure = ProtocolError("malformed_body" if done else "malformed_head", in_body=done)
            failure.__cause__ = exc
            self._fail(failure)
            return False
        return self._waiter is not None

    def _arm(self, seconds: float, phase: str) -> None:
        """Time ``phase`` out after ``seconds`` or at the deadline, whichever is first. A
        timer already running out at the deadline is kept when the next phase would too (the
        usual case: each phase's own limit is longer than the exchange's whole time-out), so
        an exchange arms one timer, not one per phase."""
        self._phase = phase
        left = self._deadline - self._loop.time()
        if seconds >= left and self._timed_to_deadline and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timed_to_deadline = seconds >= left
        self._timer = self._loop.call_later(max(0.0, min(seconds, left)), self._expired)

    def _expired(self) -> None:
        self._timer = None
        self._fail(HttpTimeout("body" if self._phase == "body" else "headers"))

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timed_to_deadline = False

    def _finish(self, truncated: bool) -> None:
        self._disarm()
        waiter, self._waiter = self._waiter, None
        if truncated:
            self.reusable = False
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, self._fields, b"".join(self._chunks), truncated))

    def _fail(self, failure: Exception) -> None:
        self._disarm()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(failure)
        self.abort()


def _tls_eof(exc: Exception) -> bool:
    """A TLS peer that closed without close_notify: many servers do, after the last byte."""
    return isinstance(exc, ssl.SSLEOFError)
