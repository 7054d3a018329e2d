"""Endpoint signing secrets encrypted at rest (AES-256-GCM, ``v1:`` + base64 of nonce,
ciphertext and tag) under ``WEBHOOK_SECRETS_KEY``, each bound to its endpoint id, so a
copied ciphertext fails to open instead of lending another endpoint the secret."""

from __future__ import annotations

import base64
import binascii
import os
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "KEY_BYTES",
    "InvalidSecretsKey",
    "SecretsBox",
    "UndecryptableSecret",
    "generate_key",
]

KEY_BYTES: Final = 32
_VERSION: Final = "v1:"
_NONCE_BYTES: Final = 12  # GCM's standard nonce; random is safe far beyond our volume
_TAG_BYTES: Final = 16


class InvalidSecretsKey(ValueError):
    """WEBHOOK_SECRETS_KEY is not base64 of 32 bytes (the value is never shown)."""


class UndecryptableSecret(Exception):
    """A stored secret that this key cannot open: wrong key, tampered text, another
    endpoint's ciphertext, or not a sealed value at all."""


def generate_key() -> str:
    """A new WEBHOOK_SECRETS_KEY: base64 of 32 random bytes."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


class SecretsBox:
    """Seals and opens endpoint secrets; holds the key and never shows it."""

    __slots__ = ("_aead",)

    def __init__(self, key: str) -> None:
        try:
            raw = base64.b64decode(key.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidSecretsKey("WEBHOOK_SECRETS_KEY must be base64") from None
        if len(raw) != KEY_BYTES:
            raise InvalidSecretsKey(f"WEBHOOK_SECRETS_KEY must decode to {KEY_BYTES} bytes")
        self._aead = AESGCM(raw)

    def __repr__(self) -> str:
        return "SecretsBox(key=<redacted>)"

    __str__ = __repr__

    def __reduce__(self) -> str | tuple[object, ...]:
        raise TypeError("a SecretsBox cannot be pickled: it would write its key out")

    def encrypt(self, plaintext: str, associated_data: bytes) -> str:
        """``plaintext`` sealed and bound to ``associated_data`` (the endpoint id)."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, plaintext.encode("utf-8"), associated_data)
        return _VERSION + base64.b64encode(nonce + sealed).decode("ascii")

    def decrypt(self, token: str, associated_data: bytes) -> str:
        """The plaintext of ``token`` if it was sealed by this key for ``associated_data``."""
        if not token.startswith(_VERSION):
            raise UndecryptableSecret("not a v1 sealed secret")
        try:
            raw = base64.b64decode(token.removeprefix(_VERSION), validate=True)
        except (binascii.Error, ValueError):
            raise UndecryptableSecret("sealed secret is not valid base64") from None
        if len(raw) < _NONCE_BYTES + _TAG_BYTES:
            raise UndecryptableSecret("sealed secret is too short")
        try:
            opened = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], associated_data)
        except InvalidTag:
            raise UndecryptableSecret(
                "sealed secret does not open: wrong key, tampered, or another endpoint's"
            ) from None
        try:
            return opened.decode("utf-8")
        except UnicodeDecodeError:  # only a forger holding the key could get here
            raise UndecryptableSecret("sealed secret is not UTF-8 text") from None
