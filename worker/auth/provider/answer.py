"""A provider's answer, bounded before anything reads it (size, decompression, JSON depth), so an
unusable body is empty and the status decides (docs/architecture.md, "Bounded remote answers")."""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from multidict import CIMultiDict, CIMultiDictProxy

__all__ = [
    "ACCEPT_ENCODING",
    "DEFAULT_BODY_CAP",
    "MAX_JSON_DEPTH",
    "ProviderAnswer",
    "decoded_body",
    "load_json",
]

DEFAULT_BODY_CAP: Final = 64 * 1024
"""Bytes of a provider answer read, and decompressed (``PROVIDER_BODY_CAP_BYTES``)."""
MAX_JSON_DEPTH: Final = 32
"""Nesting levels a provider's JSON may have; the contract's bodies have two."""
ACCEPT_ENCODING: Final = "gzip, deflate"
"""The only content codings asked for, and the only ones decoded."""

_ZLIB_OR_GZIP: Final = 32 + zlib.MAX_WBITS  # detects a zlib or a gzip header
_RAW_DEFLATE: Final = -zlib.MAX_WBITS  # "deflate" sent without the zlib wrapper, as some do
# A string (its closing quote optional, so an unterminated one is consumed, not retried from
# every later quote: linear time on any input), or a bracket.
_JSON_NESTING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


@dataclass(frozen=True, slots=True)
class ProviderAnswer:
    """One HTTP answer of a provider, already bounded: ``body`` decoded and at most the cap
    (empty when unusable); ``headers`` as sent (``Content-Encoding`` and ``Content-Length``
    describe the wire, not ``body``)."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.headers, CIMultiDictProxy | CIMultiDict):
            object.__setattr__(self, "headers", CIMultiDictProxy(CIMultiDict(self.headers)))

    @property
    def ok(self) -> bool:
        """A 2xx status: the only answers whose body may hold an auth state."""
        return 200 <= self.status < 300


def decoded_body(raw: bytes, *, truncated: bool, coding: str | None, cap: int) -> bytes:
    """The body the adapter may parse, at most ``cap`` bytes once decompressed; empty when
    unusable (cut at the cap, an unknown or chained coding, a corrupt stream)."""
    if truncated or len(raw) > cap:
        return b""
    name = (coding or "").strip().lower()
    if name in ("", "identity"):
        return raw
    if name not in ("gzip", "x-gzip", "deflate"):
        return b""
    decoded = _inflate(raw, _ZLIB_OR_GZIP, cap)
    if decoded is None and name == "deflate":
        decoded = _inflate(raw, _RAW_DEFLATE, cap)
    return decoded or b""


def _inflate(raw: bytes, wbits: int, cap: int) -> bytes | None:
    try:
        stream = zlib.decompressobj(wbits)
        out = stream.decompress(raw, cap + 1)  # never more than the cap plus one byte
    except zlib.error:
        return None
    if len(out) > cap or not stream.eof:
        return None
    return out


def load_json(data: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> object:
    """``data`` parsed as JSON, or None when it is not JSON within ``max_depth`` levels; never
    raises (the depth is checked before parsing, which would exhaust its recursion)."""
    try:
        if _too_deep(data, max_depth):
            return None
        return json.loads(data)
    except Exception:  # a hostile body is only ever "unreadable"
        return None


def _too_deep(data: bytes, max_depth: int) -> bool:
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    depth = 0
    for token in _JSON_NESTING.finditer(data):
        mark = token.group()
        if mark in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                return True
        elif mark in (b"]", b"}"):
            depth -= 1
    return False
