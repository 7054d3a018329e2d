"""Our Standard Webhooks signatures, checked with the specification's reference verifier
(the ``standardwebhooks`` package), including two overlapping secrets during a rotation."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from worker.webhooks.signing import SECRET_PREFIX, InvalidSecret, generate_secret, headers, sign

BODY = json.dumps({"type": "auth.status", "data": {"id": "a1", "status": "confirmed"}}).encode()


def _now() -> int:
    return int(time.time())


def test_generated_secret_is_prefixed_base64_of_32_random_bytes() -> None:
    secret = generate_secret()
    assert secret.startswith(SECRET_PREFIX)
    assert len(base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)) == 32
    assert len({generate_secret() for _ in range(50)}) == 50


def test_headers_verify_with_the_reference_library() -> None:
    secret = generate_secret()
    sent = headers([secret], "msg_2b5f0c", _now(), BODY)
    assert set(sent) == {"webhook-id", "webhook-timestamp", "webhook-signature", "content-type"}
    assert sent["content-type"] == "application/json"
    assert Webhook(secret).verify(BODY, sent) == json.loads(BODY)


def test_signature_header_has_one_v1_entry_per_secret() -> None:
    old, new = generate_secret(), generate_secret()
    value = sign([old, new], "msg_1", 1_700_000_000, BODY)
    entries = value.split(" ")
    assert len(entries) == 2
    assert all(e.startswith("v1,") and len(base64.b64decode(e[3:])) == 32 for e in entries)
    assert sign([old], "msg_1", 1_700_000_000, BODY) == entries[0]
    assert sign([new], "msg_1", 1_700_000_000, BODY) == entries[1]


def test_each_of_two_overlapping_secrets_verifies_during_rotation() -> None:
    old, new = generate_secret(), generate_secret()
    sent = headers([old, new], "msg_rot", _now(), BODY)
    for secret in (old, new):
        Webhook(secret).verify(BODY, sent, json_parse=False)
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(BODY, sent)


def test_signature_matches_the_reference_signer() -> None:
    secret = generate_secret()
    timestamp = 1_700_000_000
    ours = sign([secret], "msg_ref", timestamp, BODY)
    theirs = Webhook(secret).sign("msg_ref", datetime.fromtimestamp(timestamp, UTC), BODY.decode())
    assert ours == theirs


def test_the_specifications_example_vector() -> None:
    # The worked example of the Standard Webhooks specification (and of svix's docs).
    value = sign(
        ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        b'{"test": 2432232314}',
    )
    assert value == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.parametrize("field", ["body", "id", "timestamp", "signature"])
def test_tampering_is_rejected_for_each_secret(field: str) -> None:
    old, new = generate_secret(), generate_secret()
    now = _now()
    sent = headers([old, new], "msg_tamper", now, BODY)
    body = BODY
    if field == "body":
        body = BODY.replace(b"confirmed", b"cancelled")
    elif field == "id":
        sent["webhook-id"] = "msg_tampes"
    elif field == "timestamp":
        sent["webhook-timestamp"] = str(now + 1)  # still fresh, so only the HMAC can tell
    else:
        flipped = []
        for entry in sent["webhook-signature"].split(" "):
            mac = bytearray(base64.b64decode(entry.removeprefix("v1,")))
            mac[0] ^= 1
            flipped.append("v1," + base64.b64encode(bytes(mac)).decode())
        sent["webhook-signature"] = " ".join(flipped)
    for secret in (old, new):
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(body, sent)


def test_a_stale_timestamp_is_rejected_by_the_receiver() -> None:
    secret = generate_secret()
    sent = headers([secret], "msg_old", _now() - 3600, BODY)
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(BODY, sent)


def test_body_is_signed_as_bytes() -> None:
    secret = generate_secret()
    body = json.dumps({"name": "Zoë ✓"}, ensure_ascii=False).encode()
    sent = headers([secret], "msg_utf8", _now(), body)
    Webhook(secret).verify(body, sent, json_parse=False)


@pytest.mark.parametrize(
    "secret",
    [
        "",
        "whsec_",
        "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0",  # no prefix
        "whsec_not base64!",
        "whsec_" + base64.b64encode(b"x" * 23).decode(),  # too short
        "whsec_" + base64.b64encode(b"x" * 65).decode(),  # too long
    ],
)
def test_invalid_secrets_are_refused_without_echoing_them(secret: str) -> None:
    with pytest.raises(InvalidSecret) as caught:
        sign([secret], "msg_1", 1, BODY)
    if secret.removeprefix(SECRET_PREFIX):
        assert secret.removeprefix(SECRET_PREFIX) not in str(caught.value)


def test_24_and_64_byte_secrets_are_accepted() -> None:
    for size in (24, 64):
        secret = SECRET_PREFIX + base64.b64encode(b"k" * size).decode()
        sent = headers([secret], "msg_size", _now(), BODY)
        Webhook(secret).verify(BODY, sent, json_parse=False)


@pytest.mark.parametrize(
    "webhook_id", ["", "msg.1", "msg 1", "msg\n1", "msg\u00e91", "msg\x7f", "msg_1\n", "\t"]
)
def test_unsafe_webhook_ids_are_refused(webhook_id: str) -> None:
    with pytest.raises(ValueError, match="webhook_id"):
        sign([generate_secret()], webhook_id, 1, BODY)


def test_every_printable_character_but_the_dot_may_be_in_a_webhook_id() -> None:
    printable = "".join(chr(c) for c in range(ord("!"), ord("~") + 1) if chr(c) != ".")
    assert sign([generate_secret()], printable, 1, BODY).startswith("v1,")


@pytest.mark.parametrize("timestamp", [-1, True, 1.5])
def test_timestamp_must_be_whole_seconds(timestamp: object) -> None:
    with pytest.raises(ValueError, match="timestamp"):
        sign([generate_secret()], "msg_1", timestamp, BODY)  # type: ignore[arg-type]


def test_no_secret_or_a_lone_string_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        sign([], "msg_1", 1, BODY)
    with pytest.raises(TypeError):
        sign(generate_secret(), "msg_1", 1, BODY)
