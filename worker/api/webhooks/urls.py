"""The form of a webhook ``url`` as one regular expression (the schema's ``pattern``), checked in
linear time: run on a whole URL, its path, query and fragment let a backtracking engine split a
run of ``?`` two ways at every position."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["url_form_allowed", "url_pattern", "url_rule_text"]

_LABEL: Final = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_LAST_LABEL: Final = r"[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# The lookahead bounds the whole name to DNS's 253 characters.
_NAME: Final = rf"(?=[A-Za-z0-9_.-]{{1,253}}(?:[:/?#]|$))(?:{_LABEL}\.)*{_LAST_LABEL}"
_OCTET: Final = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4: Final = rf"(?:22[0-3]|2[01][0-9]|1[0-9]{{2}}|[1-9][0-9]?)(?:\.{_OCTET}){{3}}"
_H16: Final = r"[0-9A-Fa-f]{1,4}"
# The first group spelt out, in 2000-3fff, neither 2002 (6to4) nor 2001 followed by a zero
# group (Teredo); then eight groups in all, or fewer around one "::".
_IPV6_FIRST: Final = r"(?!2002|2001:(?:0{1,4})?[:\]])[23][0-9A-Fa-f]{3}"
_IPV6_REST: Final = "|".join(
    [
        rf"(?::{_H16}){{7}}",
        *(rf"(?::{_H16}){{{n}}}::(?:{_H16}(?::{_H16}){{0,{5 - n}}})?" for n in range(6)),
        rf"(?::{_H16}){{6}}::",
    ]
)
_IPV6: Final = rf"\[{_IPV6_FIRST}(?:{_IPV6_REST})\]"
_PORT: Final = (
    r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
)
_PCHAR: Final = r"(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})"
_TAIL: Final = rf"(?:/{_PCHAR}*)?(?:\?{_PCHAR}*)?(?:#{_PCHAR}*)?"


def url_pattern(*, allow_http: bool) -> str:
    """The pattern (ECMA-262 and Python alike, anchored) of a webhook URL's form."""
    scheme = "https?" if allow_http else "https"
    return rf"^{scheme}://(?:{_NAME}|{_IPV4}|{_IPV6})(?::{_PORT})?{_TAIL}$"


_AUTHORITY: Final = re.compile(rf"(?:{_NAME}|{_IPV4}|{_IPV6})(?::{_PORT})?")
_AUTHORITY_MAX: Final = 253 + len(":65535")
"""The longest authority of the form: a 253-character name and a port (an address is
shorter), checked before the pattern runs, so it only ever runs on that many characters."""
_PLAIN: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~!$&'()*+,;=:@/?-"
)
"""``_PCHAR``'s characters; ``%`` starts an escape of two hex digits."""
_HEX: Final = frozenset("0123456789ABCDEFabcdef")


def _pchars(text: str) -> bool:
    """Whether ``text`` is ``_PCHAR*``: one pass, each piece between two ``%`` looked at
    once."""
    first, *escaped = text.split("%")
    if not _PLAIN.issuperset(first):
        return False
    for piece in escaped:
        if len(piece) < 2 or piece[0] not in _HEX or piece[1] not in _HEX:
            return False
        if not _PLAIN.issuperset(piece[2:]):
            return False
    return True


def url_form_allowed(url: str, *, allow_http: bool) -> bool:
    """Whether ``url`` matches ``url_pattern`` as a whole, in time linear in its length.

    The pattern's parts, in order: the scheme; the authority, which runs to the first ``/``,
    ``?`` or ``#`` (none of them is in a host or a port) and is matched against the pattern's
    own host and port (bounded: at most ``_AUTHORITY_MAX`` characters); then
    ``(?:/P*)?(?:[?]P*)?(?:#P*)?``, which is the same language as ``(?:[/?]P*)?(?:#P*)?`` since
    ``P`` admits ``/`` and ``?`` but not ``#``: the part before the first ``#`` starts with
    ``/`` or ``?`` and the rest of it, and everything after that ``#``, is ``P*``."""
    for scheme in ("https://", "http://") if allow_http else ("https://",):
        if url.startswith(scheme):
            rest = url[len(scheme) :]
            break
    else:
        return False
    end = len(rest)
    for delimiter in "/?#":
        found = rest.find(delimiter, 0, end)
        if found >= 0:
            end = found
    if end > _AUTHORITY_MAX or _AUTHORITY.fullmatch(rest, 0, end) is None:
        return False
    before, hash_, fragment = rest[end:].partition("#")
    # ``before`` is empty or starts with "/" or "?" (where the authority ended).
    return _pchars(before[1:]) and (not hash_ or _pchars(fragment))


def url_rule_text(*, allow_http: bool) -> str:
    """The form in words, for error messages and the document."""
    scheme = "https" + (" or http" if allow_http else "")
    return (
        f"an absolute {scheme} URL in ASCII: a DNS name (its last label starting with a"
        " letter), a dotted IPv4 address or a bracketed global IPv6 address, an optional port,"
        " and a path, query and fragment of RFC 3986 characters (others percent-encoded)"
    )
