"""The one codec of signed tokens (cursors, portal sessions): ``<prefix><payload>.<mac>``, the
MAC a truncated HMAC-SHA256 of both under a key derived per kind, so one kind's token never
verifies as another's and the configured secret itself signs nothing. Length and form are
checked before anything is decoded, the MAC (in constant time) before the payload."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["MAC_BYTES", "SignedCodec"]

MAC_BYTES: Final = 16
"""128 bits: a forgery is a guess of them."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class SignedCodec:
    """Signs and verifies one kind of token (see the module docstring)."""

    def __init__(self, secret: bytes, *, label: bytes, prefix: str, max_chars: int) -> None:
        if not secret or not label:
            raise ValueError("a signed token needs a secret and a label")
        if re.fullmatch(r"[a-z]+[0-9]+\.", prefix) is None:
            raise ValueError("a prefix is a kind and a version, then a dot: 'pts1.'")
        self._key = hmac.new(secret, b"signed token\x00" + label, hashlib.sha256).digest()
        self.prefix = prefix
        self.max_chars = max_chars
        # the payload, then the MAC: 22 characters are MAC_BYTES in base64, unpadded
        self._form = re.compile(re.escape(prefix) + r"([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]{22})")

    def __repr__(self) -> str:  # never the key
        return f"SignedCodec({self.prefix!r}, <key hidden>)"

    def digest(self, data: bytes, size: int = MAC_BYTES) -> str:
        """``data``'s keyed digest under this kind's key, ``size`` bytes in base64: a value a
        token may carry that tells nothing of ``data`` (the portal's key print)."""
        return _b64(hmac.new(self._key, data, hashlib.sha256).digest()[:size])

    def encode(self, claims: Mapping[str, Any]) -> str:
        """A token carrying ``claims`` (JSON values); ``ValueError`` when it would be longer
        than ``max_chars`` (so every token issued can be read back)."""
        payload = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
        signed = self.prefix + _b64(payload)
        token = f"{signed}.{self.digest(signed.encode())}"
        if len(token) > self.max_chars:
            raise ValueError(f"a {self.prefix!r} token would be {len(token)} characters")
        return token

    def decode(self, text: str) -> dict[str, Any] | None:
        """The claims of a token this codec signed, else ``None`` (the reason is not told)."""
        if len(text) > self.max_chars:
            return None
        form = self._form.fullmatch(text)
        if form is None:
            return None
        signed = text[: form.end(1)]
        if not hmac.compare_digest(self.digest(signed.encode()), form.group(2)):
            return None
        body = form.group(1)
        try:
            claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
            return None
        return claims if isinstance(claims, dict) else None
