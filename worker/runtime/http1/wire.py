"""A request's target and head, every caller-given name and value checked so that nothing a caller
passes can end a header line or the head (no request smuggling)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final, NamedTuple
from urllib.parse import quote, urlsplit

from worker.runtime.http1.errors import InvalidRequest

__all__ = [
    "Origin",
    "Target",
    "check_method",
    "encode_headers",
    "parse_url",
    "request_head",
    "target",
]

_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
# The client writes these itself: a caller's copy would frame the request twice.
_OWNED: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})
# Characters sent as they are in a request target; anything else is percent-encoded.
_TARGET_SAFE: Final = "!#$%&'()*+,/:;=?@[]~-._"
_METHODS_WITHOUT_BODY: Final = frozenset({"GET", "DELETE", "OPTIONS"})


class Origin(NamedTuple):
    """A pool's key: connections are shared only between requests to the same origin."""

    https: bool
    host: str  # a name, or an address without brackets; the TLS name too
    port: int


class Target(NamedTuple):
    """A request's destination, parsed once: the origin, the request target (path and
    query) and the ``Host`` header's value."""

    origin: Origin
    path: bytes
    authority: bytes


def target(scheme: str, host: str, port: int, path_qs: str, authority: str) -> Target:
    """A ``Target`` from parts a caller already parsed (the webhook sender's vetted URL)."""
    scheme = scheme.lower()
    if scheme not in ("http", "https"):
        raise InvalidRequest("scheme_not_supported")
    if not host or not 0 < port < 65536:
        raise InvalidRequest("url_invalid")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise InvalidRequest("url_invalid") from None
    path = path_qs or "/"
    if _CONTROL.search(path) or _CONTROL.search(authority):
        raise InvalidRequest("url_invalid")
    if not path.isascii() or " " in path:
        path = quote(path, safe=_TARGET_SAFE)
    return Target(Origin(scheme == "https", host, port), path.encode("ascii"), _ascii(authority))


#: ``scheme://authority`` and a path (and query) sent as it is: printable ASCII, no fragment,
#: no empty query, which is what ``urlsplit`` and ``target`` would make of it.
_PLAIN_URL: Final = re.compile(r"([^/?#]+://[^/?#]+)(/[!-\"$->@-~]*(?:\?[!-\"$-~]+)?)")
#: Origins parsed once: ``scheme://authority`` → (origin, ``Host`` value). Callers use a
#: handful of base URLs; past ``_ORIGINS_KEPT`` an origin is parsed on every use.
_ORIGINS: dict[str, tuple[Origin, bytes]] = {}
_ORIGINS_KEPT: Final = 256


def parse_url(url: str) -> Target:
    """``url`` (absolute, http or https, no user or password) as a ``Target``; the origin of a
    plain one is parsed once (a provider's URLs share a few)."""
    plain = _PLAIN_URL.fullmatch(url)
    if plain is None:
        return _parse_url(url)
    base, path = plain.groups()
    known = _ORIGINS.get(base)
    if known is None:
        origin, _, authority = _parse_url(base + "/")
        known = (origin, authority)
        if len(_ORIGINS) < _ORIGINS_KEPT:
            _ORIGINS[base] = known
    return Target(known[0], path.encode("ascii"), known[1])


def _parse_url(url: str) -> Target:
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        raise InvalidRequest("url_invalid") from None
    if "@" in parts.netloc:
        raise InvalidRequest("url_credentials_not_supported")
    scheme = parts.scheme.lower()
    default = 443 if scheme == "https" else 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return target(scheme, host, default if port is None else port, path, parts.netloc)


def _ascii(text: str) -> bytes:
    try:
        return text.encode("ascii")
    except UnicodeEncodeError:
        return text.encode("idna")


#: Header names seen, checked and encoded once: name → (lower-cased, ``b"Name: "``). Callers
#: use a handful of fixed names; past ``_NAMES_KEPT`` a name is checked on every use.
_NAMES: dict[str, tuple[str, bytes]] = {}
_NAMES_KEPT: Final = 256


def _name(name: str) -> tuple[str, bytes]:
    known = _NAMES.get(name)
    if known is None:
        lowered = name.lower()
        if not _TOKEN.fullmatch(name) or lowered in _OWNED:
            raise InvalidRequest("header_name_refused")
        known = (lowered, name.encode("ascii") + b": ")
        if len(_NAMES) < _NAMES_KEPT:
            _NAMES[name] = known
    return known


def _value(value: str) -> bytes:
    if "\r" in value or "\n" in value or "\0" in value:
        raise InvalidRequest("header_value_refused")
    return value.encode("utf-8")


def encode_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, bytes]]:
    """Each header as (lower-cased name, its encoded line); raises ``InvalidRequest`` for a
    name that is no token, a value holding CR, LF or NUL, or a header the client owns."""
    lines: list[tuple[str, bytes]] = []
    for name, value in headers:
        lowered, prefix = _name(name)
        lines.append((lowered, prefix + _value(value) + b"\r\n"))
    return lines


def request_head(
    method: str,
    to: Target,
    defaults: list[tuple[str, bytes]],
    headers: Mapping[str, str] | None,
    body: bytes,
) -> bytes:
    """The request's bytes: request line, ``Host``, the client's default headers that the
    caller's do not replace, the caller's, ``Content-Length`` when a body is or may be sent
    (``0`` for an empty POST, as other clients send), then the body."""
    parts = [method.encode("ascii"), b" ", to.path, b" HTTP/1.1\r\nHost: ", to.authority, b"\r\n"]
    given: list[bytes] = []
    names: set[str] = set()
    if headers:
        for name, value in headers.items():
            lowered, prefix = _name(name)
            given += (prefix, _value(value), b"\r\n")
            names.add(lowered)
    parts += [line for name, line in defaults if name not in names]
    parts += given
    if body or method not in _METHODS_WITHOUT_BODY:
        parts.append(b"Content-Length: %d\r\n" % len(body))
    parts += (b"\r\n", body)
    return b"".join(parts)


def check_method(method: str) -> None:
    """Refuse what the client does not speak: a method that is no token, HEAD (its answer's
    framing differs, and no caller needs it) and CONNECT."""
    if not _TOKEN.fullmatch(method) or method in ("HEAD", "CONNECT"):
        raise InvalidRequest("method_not_supported")
