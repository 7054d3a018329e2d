"""The random request and command ids of the front-end (UUID version 4, the command id being
what a reply is matched by), drawn from a buffer of OS randomness instead of ``uuid.uuid4``."""

from __future__ import annotations

import os
from typing import Final

__all__ = ["new_command_id", "new_request_id", "random_uuid4"]

_CHUNK: Final = 4096
_VERSION_MASK: Final = ~(0xF000 << 64) & ~(0xC000 << 48)
_VERSION_BITS: Final = (4 << 76) | (0x8000 << 48)


class _Buffer:
    """OS randomness (``os.urandom``) read a few kilobytes at a time; each id takes the next
    16 bytes. ``uuid.uuid4`` reads the OS's source once per id and checks its arguments in
    Python; these ids are as random, and never handed out twice: a forked child drops the
    parent's buffer. Used from the event loop's thread only (not locked)."""

    __slots__ = ("data", "offset")

    def __init__(self) -> None:
        self.data = b""
        self.offset = 0

    def take16(self) -> bytes:
        offset = self.offset
        if offset + 16 > len(self.data):
            self.data = os.urandom(_CHUNK)
            offset = 0
        self.offset = offset + 16
        return self.data[offset : offset + 16]

    def drop(self) -> None:
        self.data = b""
        self.offset = 0


_buffer: Final = _Buffer()
os.register_at_fork(after_in_child=_buffer.drop)


def random_uuid4() -> int:
    """A UUID version 4 (RFC 4122 variant) as its 128-bit integer."""
    return (int.from_bytes(_buffer.take16()) & _VERSION_MASK) | _VERSION_BITS


def new_command_id() -> str:
    """``str(uuid.uuid4())``: 8-4-4-4-12 lower-case hex digits."""
    h = f"{random_uuid4():032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_request_id() -> str:
    """``req_`` and ``uuid.uuid4().hex``."""
    return f"req_{random_uuid4():032x}"
