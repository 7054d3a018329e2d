"""Endpoint secrets at rest: AES-GCM under WEBHOOK_SECRETS_KEY, bound to the endpoint id."""

from __future__ import annotations

import base64
import logging
import pickle

import pytest

from worker.webhooks.secrets_box import (
    InvalidSecretsKey,
    SecretsBox,
    UndecryptableSecret,
    generate_key,
)
from worker.webhooks.signing import generate_secret

ENDPOINT = b"ep_01HZX3"


@pytest.fixture
def key() -> str:
    return generate_key()


def test_generated_key_is_base64_of_32_bytes() -> None:
    key = generate_key()
    assert len(base64.b64decode(key, validate=True)) == 32
    assert generate_key() != key


def test_round_trip(key: str) -> None:
    box = SecretsBox(key)
    secret = generate_secret()
    sealed = box.encrypt(secret, ENDPOINT)
    assert sealed.startswith("v1:")
    assert secret not in sealed
    assert box.decrypt(sealed, ENDPOINT) == secret
    assert SecretsBox(key).decrypt(sealed, ENDPOINT) == secret  # a new box, the same key


def test_unicode_and_empty_plaintexts(key: str) -> None:
    box = SecretsBox(key)
    for text in ("", "Zoë ✓ 秘密"):
        assert box.decrypt(box.encrypt(text, ENDPOINT), ENDPOINT) == text


def test_each_encryption_uses_a_fresh_nonce(key: str) -> None:
    box = SecretsBox(key)
    sealed = {box.encrypt("same", ENDPOINT) for _ in range(100)}
    assert len(sealed) == 100
    nonces = {base64.b64decode(s[3:])[:12] for s in sealed}
    assert len(nonces) == 100


def test_wrong_key_is_refused(key: str) -> None:
    sealed = SecretsBox(key).encrypt("whsec_x", ENDPOINT)
    with pytest.raises(UndecryptableSecret, match="wrong key"):
        SecretsBox(generate_key()).decrypt(sealed, ENDPOINT)


def test_ciphertext_cannot_move_to_another_endpoint(key: str) -> None:
    box = SecretsBox(key)
    sealed = box.encrypt("whsec_x", ENDPOINT)
    with pytest.raises(UndecryptableSecret):
        box.decrypt(sealed, b"ep_OTHER")
    with pytest.raises(UndecryptableSecret):
        box.decrypt(sealed, b"")


def test_every_flipped_bit_is_detected(key: str) -> None:
    box = SecretsBox(key)
    raw = bytearray(base64.b64decode(box.encrypt("whsec_abc", ENDPOINT)[3:]))
    for i in range(len(raw)):
        for bit in (0x01, 0x80):
            tampered = bytearray(raw)
            tampered[i] ^= bit
            with pytest.raises(UndecryptableSecret):
                box.decrypt("v1:" + base64.b64encode(bytes(tampered)).decode(), ENDPOINT)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "whsec_plaintext",
        "v2:" + base64.b64encode(bytes(40)).decode(),
        "v1:",
        "v1:not base64!",
        "v1:" + base64.b64encode(bytes(27)).decode(),  # shorter than nonce + tag
        "v1:" + base64.b64encode(bytes(28)).decode(),  # nonce + tag, all zero
    ],
)
def test_malformed_tokens_are_refused(key: str, token: str) -> None:
    with pytest.raises(UndecryptableSecret):
        SecretsBox(key).decrypt(token, ENDPOINT)


def test_truncated_and_extended_tokens_are_refused(key: str) -> None:
    box = SecretsBox(key)
    raw = base64.b64decode(box.encrypt("whsec_abc", ENDPOINT)[3:])
    for variant in (raw[:-1], raw + b"\x00"):
        with pytest.raises(UndecryptableSecret):
            box.decrypt("v1:" + base64.b64encode(variant).decode(), ENDPOINT)


@pytest.mark.parametrize(
    "bad_key",
    [
        "",
        "not base64!",
        base64.b64encode(bytes(16)).decode(),
        base64.b64encode(bytes(31)).decode(),
        base64.b64encode(bytes(33)).decode(),
    ],
)
def test_bad_keys_are_refused_without_echoing_them(bad_key: str) -> None:
    with pytest.raises(InvalidSecretsKey) as caught:
        SecretsBox(bad_key)
    if bad_key:
        assert bad_key not in str(caught.value)


def test_key_never_shows(key: str, caplog: pytest.LogCaptureFixture) -> None:
    box = SecretsBox(key)
    raw = base64.b64decode(key)
    shown = [repr(box), str(box), f"{box}", f"{box!r}"]
    logging.getLogger("test").warning("box %s %r", box, box)
    shown.append(caplog.text)
    for text in shown:
        assert key not in text
        assert raw.hex() not in text
    assert repr(box) == "SecretsBox(key=<redacted>)"
    assert not hasattr(box, "__dict__")  # no attribute to dump the key through vars()
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(box)


def test_errors_never_show_the_plaintext_or_token(key: str) -> None:
    box = SecretsBox(key)
    secret = generate_secret()
    sealed = box.encrypt(secret, ENDPOINT)
    with pytest.raises(UndecryptableSecret) as caught:
        SecretsBox(generate_key()).decrypt(sealed, ENDPOINT)
    assert sealed[3:] not in str(caught.value)
    assert secret not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
