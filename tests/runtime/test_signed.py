"""``SignedCodec``: a token reads back to its claims, and everything else is refused without
being decoded: a changed payload or MAC, a truncated or over-long token, another version or
kind (another label under the same secret), another secret, characters outside base64url, a
payload that is not a JSON object."""

from __future__ import annotations

import base64
import json

import pytest

from worker.runtime.signed import SignedCodec

SECRET = b"s" * 32
CLAIMS = {"a": "acc_1", "s": [0, 17], "w": "ws_a"}


def codec(
    prefix: str = "evc2.", label: bytes = b"cursor", secret: bytes = SECRET, max_chars: int = 512
) -> SignedCodec:
    return SignedCodec(secret, label=label, prefix=prefix, max_chars=max_chars)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_a_token_reads_back_to_its_claims_in_its_compact_form() -> None:
    token = codec().encode(CLAIMS)
    prefix, payload, mac = token.split(".")
    assert prefix == "evc2" and len(mac) == 22
    assert (
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        == json.dumps(CLAIMS, separators=(",", ":"), sort_keys=True).encode()
    )
    assert "=" not in token
    assert codec().decode(token) == CLAIMS


def test_tampered_truncated_and_malformed_tokens_are_refused() -> None:
    token = codec().encode(CLAIMS)
    prefix, payload, mac = token.split(".")
    changed = b64(json.dumps({**CLAIMS, "s": [0, 0]}, separators=(",", ":")).encode())
    flipped = "B" if mac[0] == "A" else "A"
    # the same 16 bytes with other (ignored) low bits in the last character: a lax decoder
    # reads the same MAC, but it is not the form this codec writes
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    sloppy = mac[:-1] + alphabet[alphabet.index(mac[-1]) + 1]
    assert base64.urlsafe_b64decode(sloppy + "==") == base64.urlsafe_b64decode(mac + "==")
    refused = [
        f"{prefix}.{changed}.{mac}",  # another payload, the old MAC
        f"{prefix}.{payload}.{flipped}{mac[1:]}",  # another MAC
        token[:-1],  # truncated MAC
        token[:-23],  # no MAC
        f"{prefix}.{payload[:-2]}.{mac}",  # truncated payload
        f"{prefix}.{payload}{mac}",  # no separator
        f"{token}.{mac}",  # one part too many
        f"{prefix}.{payload}.{mac}\n",
        f"{prefix}.{payload}!.{mac}",  # not base64url
        f"{prefix}.{payload.replace(payload[0], '+', 1)}.{mac}",  # standard base64, not url-safe
        f"{prefix}.{payload}=.{mac}",  # padding
        f"{prefix}.\u00e9{payload}.{mac}",  # not ASCII
        f"{payload}.{mac}",  # no prefix
        "",
        ".",
        "evc2..",
        f"{prefix}.{payload}.{sloppy}",
    ]
    for bad in refused:
        assert codec().decode(bad) is None, bad


def test_an_over_long_token_is_refused_before_it_is_read() -> None:
    """A token over ``max_chars`` is refused whatever it holds, even well signed; and a codec
    never issues one it could not read back."""
    long_claims = {"x": "y" * 300}
    roomy = codec(max_chars=1024).encode(long_claims)
    assert codec(max_chars=1024).decode(roomy) == long_claims
    assert codec(max_chars=len(roomy) - 1).decode(roomy) is None
    assert codec().decode("evc2." + "A" * 100_000 + "." + "B" * 22) is None
    with pytest.raises(ValueError, match="characters"):
        codec(max_chars=100).encode(long_claims)


def test_another_version_kind_or_secret_is_refused() -> None:
    """Each kind signs under its own label: a cursor is never a portal token, under the same
    secret, even with its prefix changed to the other kind's; nor is another version's token,
    nor a token of another secret."""
    cursor = codec().encode(CLAIMS)
    portal = codec(prefix="pts1.", label=b"portal session")
    assert portal.decode(cursor) is None
    assert portal.decode("pts1." + cursor.removeprefix("evc2.")) is None
    assert codec().decode(portal.encode(CLAIMS)) is None
    next_version = codec(prefix="evc3.")
    assert next_version.decode(cursor) is None
    assert codec().decode(next_version.encode(CLAIMS)) is None
    assert codec(secret=b"t" * 32).decode(cursor) is None


def test_a_well_signed_payload_that_is_no_json_object_is_refused() -> None:
    """Signed by the codec's own key (forged here with its ``digest``), a payload that is no
    JSON, not UTF-8, or a JSON value other than an object reads as nothing."""
    c = codec()
    for raw in (b"[1,2]", b'"text"', b"7", b"null", b"{not json", b"\xff\xfe\x00", b""):
        signed = "evc2." + b64(raw)
        token = f"{signed}.{c.digest(signed.encode())}"
        assert c.decode(token) is None, raw


def test_the_key_is_never_shown_and_a_codec_needs_a_secret_label_and_versioned_prefix() -> None:
    assert "s" * 8 not in repr(codec()) and "hidden" in repr(codec())
    with pytest.raises(ValueError, match="a secret and a label"):
        SignedCodec(b"", label=b"x", prefix="evc2.", max_chars=100)
    with pytest.raises(ValueError, match="a secret and a label"):
        SignedCodec(SECRET, label=b"", prefix="evc2.", max_chars=100)
    for prefix in ("", "evc.", "evc2", "2.", "e.v2."):
        with pytest.raises(ValueError, match="a prefix is"):
            SignedCodec(SECRET, label=b"x", prefix=prefix, max_chars=100)


def test_a_digest_depends_on_the_kind_and_its_size() -> None:
    assert codec().digest(b"d", 12) == codec().digest(b"d", 12)
    assert len(codec().digest(b"d", 12)) == 16
    assert codec().digest(b"d") != codec(label=b"other").digest(b"d")
