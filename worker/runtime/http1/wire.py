"""What goes on the wire: where a request goes (``Target``, parsed once) and its head, with
every caller-given name and value checked so that nothing a caller passes can end a header
line or the head (no request smuggling through a header or a URL)."""

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
_BAD_VALUE: Final = frozenset("\r\n\0")
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
    if any(c < " " or c == "\x7f" for c in path) or any(c < " " for c in authority):
        raise InvalidRequest("url_invalid")
    if not path.isascii() or " " in path:
        path = quote(path, safe=_TARGET_SAFE)
    return Target(Origin(scheme == "https", host, port), path.encode("ascii"), _ascii(authority))


def parse_url(url: str) -> Target:
    """``url`` (absolute, http or https, no user or password) as a ``Target``."""
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


def encode_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, bytes]]:
    """Each header as (lower-cased name, its encoded line); raises ``InvalidRequest`` for a
    name that is no token, a value holding CR, LF or NUL, or a header the client owns."""
    lines: list[tuple[str, bytes]] = []
    for name, value in headers:
        lowered = name.lower()
        if not _TOKEN.fullmatch(name) or lowered in _OWNED:
            raise InvalidRequest("header_name_refused")
        if not _BAD_VALUE.isdisjoint(value):
            raise InvalidRequest("header_value_refused")
        lines.append((lowered, b"%s: %s\r\n" % (name.encode("ascii"), value.encode("utf-8"))))
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
    given = encode_headers(headers.items()) if headers else []
    names = {name for name, _ in given}
    parts = [method.encode("ascii"), b" ", to.path, b" HTTP/1.1\r\nHost: ", to.authority, b"\r\n"]
    parts += [line for name, line in defaults if name not in names]
    parts += [line for _, line in given]
    if body or method not in _METHODS_WITHOUT_BODY:
        parts.append(b"Content-Length: %d\r\n" % len(body))
    parts += (b"\r\n", body)
    return b"".join(parts)


def check_method(method: str) -> None:
    """Refuse what the client does not speak: a method that is no token, HEAD (its answer's
    framing differs, and no caller needs it) and CONNECT."""
    if not _TOKEN.fullmatch(method) or method in ("HEAD", "CONNECT"):
        raise InvalidRequest("method_not_supported")
