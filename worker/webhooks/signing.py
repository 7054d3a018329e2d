"""Standard Webhooks signatures (``v1,`` HMAC-SHA256 per live secret), so integrators can
verify deliveries with any of the specification's libraries; nothing here logs a secret."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets as _random
from collections.abc import Sequence
from typing import Final

__all__ = [
    "MIN_SECRET_BYTES",
    "SECRET_BYTES",
    "SECRET_PREFIX",
    "InvalidSecret",
    "generate_secret",
    "headers",
    "sign",
]

SECRET_PREFIX: Final = "whsec_"
SECRET_BYTES: Final = 32  # what we generate
MIN_SECRET_BYTES: Final = 24  # the specification's lower bound
MAX_SECRET_BYTES: Final = 64  # and its upper one


class InvalidSecret(ValueError):
    """A secret that is not ``whsec_`` + base64 of 24 to 64 bytes (its value is not shown)."""


def generate_secret() -> str:
    """A fresh endpoint secret: ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(_random.token_bytes(SECRET_BYTES)).decode("ascii")


def _key(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidSecret(f"a webhook secret starts with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSecret("a webhook secret is base64 after its prefix") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise InvalidSecret(
            f"a webhook secret holds {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes"
        )
    return key


# Printable ASCII without spaces: it travels as a header value, and without '.' the signed
# content "{id}.{timestamp}.{body}" cannot be split in two ways. One match per attempt.
_SAFE_ID: Final = re.compile(r"[!-\-/-~]+")


def _check_id(webhook_id: str) -> None:
    if _SAFE_ID.fullmatch(webhook_id) is None:
        raise ValueError("webhook_id must be non-empty printable ASCII without spaces or '.'")


def sign(secrets: Sequence[str], webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,<base64 HMAC-SHA256>`` per secret.

    ``timestamp`` is whole seconds since the epoch, the value of ``webhook-timestamp``; the
    body must be signed exactly as sent (the same bytes).
    """
    if isinstance(secrets, str):  # a lone str is a Sequence[str] of characters
        raise TypeError("secrets is a sequence of secrets, not one secret")
    if not secrets:
        raise ValueError("at least one secret is needed to sign")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError("timestamp must be whole non-negative seconds since the epoch")
    _check_id(webhook_id)
    content = f"{webhook_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.digest(_key(s), content, hashlib.sha256)).decode("ascii")
        for s in secrets
    )


def headers(secrets: Sequence[str], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one signed JSON delivery (``webhook-id``/``-timestamp``/``-signature``)."""
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secrets, webhook_id, timestamp, body),
        "content-type": "application/json",
    }
