"""Handing a record to a dead-letter topic, the fault in its headers (docs/architecture.md,
"Failure handling"); what an operator reads back is ``worker.dlq``. A dead letter always fits
under ``MAX_RECORD_BYTES``: the original whole when it fits, else cut to fit, with
``dlq.truncated``, the original sizes and SHA-256 digests (``dlq redrive`` refuses it). A letter
the topic still refuses (its ``max.message.bytes``; not an outage) is sent again in its minimal
form, no copy of the record; one refused even then is ``DeadLetterLost``: the loop counts and
logs it and lets the record go, losing only the copy."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from itertools import accumulate, takewhile
from typing import Any, Final

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from worker.engine.broker_health import BrokerHealth
from worker.engine.faults import PREFIX, Fault, RecordRejected
from worker.engine.writes import MAX_RECORD_BYTES, Sent, enqueue, record_size
from worker.runtime.logs import get_logger

log = get_logger(__name__)

#: Header names of a truncated dead letter, after the fault's. ``dlq.truncated`` lists the
#: parts cut (``key``, ``value``, ``headers``, comma-separated); the others describe the
#: original: sizes in bytes (decimal), digests in lower-case hex. A part that was null has no
#: size or digest.
TRUNCATED: Final = "dlq.truncated"
KEY_BYTES: Final = "dlq.key_bytes"
KEY_SHA256: Final = "dlq.key_sha256"
VALUE_BYTES: Final = "dlq.value_bytes"
VALUE_SHA256: Final = "dlq.value_sha256"
HEADERS_COUNT: Final = "dlq.headers_count"
HEADERS_BYTES: Final = "dlq.headers_bytes"
#: The parts ``dlq.truncated`` names.
PARTS: Final = ("key", "value", "headers")

#: Room kept for the fault's ``dlq.*`` headers and the truncation headers (together under 2 KiB:
#: the detail is at most 1 KiB, the source a topic name of at most 249 characters).
_RESERVED: Final = 8 * 1024
#: What a dead letter holds of its original (key, value and headers together).
ORIGINAL_BYTES: Final = MAX_RECORD_BYTES - _RESERVED
#: The most of an original key a truncated dead letter keeps: a key is an account id (tens of
#: bytes), and the digest names the whole.
TRUNCATED_KEY_BYTES: Final = 1024
#: Counted per header beside its name and value (the record format's varints, at most).
_HEADER_OVERHEAD: Final = 10


#: ``dlq.detail`` of a minimal dead letter: the fault's own detail (up to 1 KiB) stays in the
#: process's log lines, not in a letter that must be as small as it can be.
MINIMAL_DETAIL: Final = "minimal dead letter: the full one was refused"

Parts = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


class DeadLetterLost(RecordRejected):
    """The dead-letter topic refused even the minimal letter: the record is let go without
    a copy (the consume loop counts and logs it, ``worker.engine.units``)."""


@dataclass(slots=True)
class LetterSent(Sent):
    """A dead letter handed to the producer. A refusal of it (``RecordRejected`` at hand-over
    or acknowledgement) is not raised at once: ``acked`` answers False and ``again`` sends
    the minimal form; a refusal of that raises ``DeadLetterLost``."""

    minimal: Parts | None = None
    """The minimal form, not yet tried (``None`` once it is the one sent)."""
    refused: RecordRejected | None = None
    """Why even the minimal form could not be handed over."""

    async def acked(self, health: BrokerHealth) -> bool:
        if self.refused is not None:
            raise DeadLetterLost(self.refused.reason, self.refused.detail) from self.refused
        try:
            return await Sent.acked(self, health)
        except RecordRejected as exc:
            if self.minimal is None:
                raise DeadLetterLost(exc.reason, exc.detail) from exc
            log.warning("dead_letter_refused", topic=self.topic, error=exc.detail)
            self.key, self.value, self.headers = self.minimal
            self.minimal = None
            self.future, self.error = None, exc
            return False  # the caller hands it over again: the minimal form

    async def again(self, producer: Any) -> Sent:
        parts = (self.key, self.value, self.headers or [])
        return await hand_over(producer, self.topic, parts, self.minimal)


async def dead_letter(
    producer: AIOKafkaProducer, topic: str, msg: ConsumerRecord[bytes, bytes], fault: Fault
) -> Sent:
    """Hand ``msg`` to the dead-letter ``topic`` with ``fault`` in its headers, cut to fit
    (the module docstring); never refused for the record's size by us, and a refusal by the
    producer or the broker falls back to the minimal form (``LetterSent``): its coordinates
    (``dlq.source``), the fault's reason, exception class, fingerprint and attempts, and the
    original's sizes and SHA-256 digests (``dlq.truncated``: every part cut); an empty key and
    value. Any ``dlq.*`` headers of an earlier dead-lettering (which a redrive carries) are
    dropped from the original's."""
    source = (msg.topic, msg.partition, msg.offset)
    full = letter_parts(msg.key, msg.value, msg.headers, fault, source)
    short = replace(fault, detail=MINIMAL_DETAIL)
    minimal = letter_parts(msg.key, msg.value, msg.headers, short, source, room=0)
    return await hand_over(producer, topic, full, minimal)


async def hand_over(producer: Any, topic: str, parts: Parts, minimal: Parts | None) -> LetterSent:
    """``parts`` to the producer; the ``minimal`` form at once when the producer refuses
    them; a ``LetterSent`` holding the refusal when it refuses that too. Every dead letter
    goes through here: an input record's (``dead_letter``) and a failed delivery's."""
    while True:
        key, value, headers = parts
        try:
            sent = await enqueue(producer, topic, value, key=key, headers=headers)
        except RecordRejected as exc:
            if minimal is None:
                return LetterSent(None, topic, value, key, None, headers, exc, refused=exc)
            log.warning("dead_letter_refused", topic=topic, error=exc.detail)
            parts, minimal = minimal, None
            continue
        return LetterSent(
            sent.future, topic, value, key, None, headers, sent.error, minimal=minimal
        )


def letter_parts(
    key: bytes | None,
    value: bytes | None,
    original: Any,
    fault: Fault,
    source: tuple[str, int, int],
    *,
    room: int = ORIGINAL_BYTES,
) -> Parts:
    """The key, value and headers of the dead letter of a record (``key``, ``value``, its
    headers ``original``) that failed with ``fault`` at ``source``: the original whole when
    it fits in ``room`` bytes, else cut to fit with the truncation headers."""
    kept = _original_headers(original)
    header_sizes = [_header_size(k, v) for k, v in kept]
    key_size, value_size = len(key or b""), len(value or b"")
    whole = key_size + value_size + sum(header_sizes) <= room
    if whole:
        new_key, new_value, new_headers = key, value, kept
    else:
        new_key = None if key is None else key[: min(TRUNCATED_KEY_BYTES, room)]
        rest = max(0, room - len(new_key or b""))
        value_room, headers_room = _shares(value_size, sum(header_sizes), rest)
        new_value = None if value is None else value[:value_room]
        fitting = takewhile(lambda used: used <= headers_room, accumulate(header_sizes))
        new_headers = kept[: len(list(fitting))]  # the first ones, as many as fit
    headers = [*new_headers, *fault.headers(source)]
    if not whole:
        headers += _truncation_headers(
            key, value, kept, sum(header_sizes), new_key, new_value, new_headers
        )
    # A record with neither key nor value (or one whose bytes could not be read) is kept as an
    # empty value: the producer refuses a record with neither.
    if new_key is None and new_value is None:
        new_value = b""
    size = record_size(new_value, new_key, headers)
    if size > MAX_RECORD_BYTES and room > 0:  # the fault's headers alone are far below it
        return letter_parts(key, value, original, fault, source, room=0)
    return new_key, new_value, headers


def _original_headers(original: Any) -> list[tuple[str, bytes]]:
    """The original's headers but any ``dlq.*``; a null value (the record format allows
    one) is kept as empty bytes, which is what every writer here can send."""
    return [
        (str(k), b"" if v is None else bytes(v))
        for k, v in original or ()
        if not str(k).startswith(PREFIX)
    ]


def _header_size(name: str, value: bytes) -> int:
    return len(name.encode("utf-8", "surrogatepass")) + len(value) + _HEADER_OVERHEAD


def _shares(value_size: int, headers_size: int, room: int) -> tuple[int, int]:
    """``room`` split between the value and the headers: the smaller whole when it takes at
    most half, the rest to the other; else half each."""
    if value_size + headers_size <= room:
        return value_size, headers_size
    half = room // 2
    if headers_size <= half:
        return room - headers_size, headers_size
    if value_size <= half:
        return value_size, room - value_size
    return half, room - half


def _truncation_headers(
    key: bytes | None,
    value: bytes | None,
    original: list[tuple[str, bytes]],
    original_bytes: int,
    new_key: bytes | None,
    new_value: bytes | None,
    new_headers: list[tuple[str, bytes]],
) -> list[tuple[str, bytes]]:
    cut = [
        part
        for part, was_cut in (
            ("key", key is not None and new_key != key),
            ("value", value is not None and new_value != value),
            ("headers", len(new_headers) < len(original)),
        )
        if was_cut
    ]
    headers = [(TRUNCATED, ",".join(cut).encode())]
    if key is not None:
        headers += [(KEY_BYTES, str(len(key)).encode()), (KEY_SHA256, _sha256(key))]
    if value is not None:
        headers += [(VALUE_BYTES, str(len(value)).encode()), (VALUE_SHA256, _sha256(value))]
    headers += [
        (HEADERS_COUNT, str(len(original)).encode()),
        (HEADERS_BYTES, str(original_bytes).encode()),
    ]
    return headers


def _sha256(raw: bytes) -> bytes:
    return hashlib.sha256(raw).hexdigest().encode()


__all__ = [
    "HEADERS_BYTES",
    "HEADERS_COUNT",
    "KEY_BYTES",
    "KEY_SHA256",
    "MINIMAL_DETAIL",
    "ORIGINAL_BYTES",
    "PARTS",
    "TRUNCATED",
    "TRUNCATED_KEY_BYTES",
    "VALUE_BYTES",
    "VALUE_SHA256",
    "DeadLetterLost",
    "LetterSent",
    "dead_letter",
    "letter_parts",
]
