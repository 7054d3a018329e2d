"""One dead letter as an operator sees it. Every byte of it is hostile, so nothing here raises on
a record, fields are cut and control characters escaped."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from worker.contract.messages import DECODE_REASONS, rfc3339
from worker.engine.dead_letter import (
    HEADERS_BYTES,
    HEADERS_COUNT,
    KEY_BYTES,
    KEY_SHA256,
    PARTS,
    TRUNCATED,
    VALUE_BYTES,
    VALUE_SHA256,
)
from worker.engine.faults import (
    ATTEMPTS,
    DETAIL,
    DETAIL_LIMIT,
    EXCEPTION,
    FAULT_REASONS,
    FINGERPRINT,
    PREFIX,
    REASON,
    REDRIVEN,
    SOURCE,
)

# ``dlq.reason`` of the record-fault dead letters of the worker and the dispatcher: the decode
# reasons, a handler that kept failing, an output over its size bound, bytes no decoder reads.
# Their series are created at zero so the DLQ alerts see the first one.
DLQ_REASONS: tuple[str, ...] = (*DECODE_REASONS, *FAULT_REASONS)

# The header names are the engine's (``worker.engine.faults``), which writes them. ``REDRIVEN``
# is set by a redrive on the record it re-produces: ``<dlq topic>:<partition>:<offset>``.

DELIVERY_FAILED: Final = "delivery_failed"
"""The reason shown for a failed webhook delivery, which has ``webhook.*`` headers instead of
``dlq.reason``."""

WEBHOOK_HEADERS: Final = (
    "webhook.id",
    "webhook.endpoint",
    "webhook.event_type",
    "webhook.attempts",
    "webhook.last_status",
    "webhook.last_error",
)

# Kafka's legal topic names: at most 249 of these characters.
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_NUMBER = re.compile(r"[0-9]{1,18}")
_RELATIVE = re.compile(r"(\d{1,9}(?:\.\d{1,6})?)([smhdw])")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: The detail an older worker wrote on a dead letter whose value it left out (it kept no
#: ``dlq.truncated``): the letter is not the original either.
_LEFT_OUT = re.compile(rb"\(value of [0-9]{1,18} bytes left out\)$")

# Lengths of the fields of one ``list`` line, in characters.
FIELD_CHARS: Final = 64
DETAIL_CHARS: Final = 120


@dataclass(frozen=True, slots=True)
class Position:
    """``topic:partition:offset``, the form of ``dlq.source`` and ``dlq.redriven``."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    @classmethod
    def parse(cls, raw: bytes | None) -> Position | None:
        """The position a header names, or None for anything that is not one."""
        if raw is None or len(raw) > 300:
            return None
        try:
            topic, partition, offset = raw.decode("ascii").rsplit(":", 2)
        except (UnicodeDecodeError, ValueError):
            return None
        if _TOPIC.fullmatch(topic) and _NUMBER.fullmatch(partition) and _NUMBER.fullmatch(offset):
            return cls(topic, int(partition), int(offset))
        return None


def parse_at(text: str) -> tuple[int, int]:
    """``<partition>:<offset>`` of ``dlq show``; ValueError with the reason otherwise."""
    partition, sep, offset = text.strip().partition(":")
    if not (sep and _NUMBER.fullmatch(partition) and _NUMBER.fullmatch(offset)):
        raise ValueError(f"expected <partition>:<offset>, e.g. 0:42, got {text[:40]!r}")
    return int(partition), int(offset)


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """An ISO-8601 time (no zone: UTC) or a time relative to now (``90s``, ``15m``, ``1h``,
    ``2d``, ``1w``: that long ago). ValueError with the accepted forms otherwise."""
    value = text.strip()
    relative = _RELATIVE.fullmatch(value)
    if relative:
        seconds = float(relative.group(1)) * _UNITS[relative.group(2)]
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"expected an ISO-8601 time (2026-01-31T12:00:00Z) or a duration ago "
            f"(30m, 1h, 2d), got {text[:40]!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of a dead-letter topic, as read (see the module docstring)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    @classmethod
    def of(cls, record: Any) -> DeadLetter:
        """From an aiokafka ``ConsumerRecord``."""
        headers = tuple((str(k), v if v is None else bytes(v)) for k, v in record.headers or ())
        return cls(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=int(record.timestamp or 0),
            key=record.key,
            value=record.value,
            headers=headers,
        )

    @property
    def at(self) -> str:
        """``<partition>:<offset>``, the argument of ``dlq show``."""
        return f"{self.partition}:{self.offset}"

    @property
    def position(self) -> Position:
        return Position(self.topic, self.partition, self.offset)

    @property
    def time(self) -> str:
        """The record's timestamp in RFC 3339, or the raw milliseconds when no date has it."""
        try:
            return rfc3339(self.timestamp_ms / 1000)
        except (OverflowError, ValueError, OSError):
            return f"{self.timestamp_ms}ms"

    def header(self, name: str) -> bytes | None:
        """The last header of that name: the engine's ``dlq.*`` follow the original's."""
        return next((value for key, value in reversed(self.headers) if key == name), None)

    def text(self, name: str, limit: int = FIELD_CHARS) -> str | None:
        raw = self.header(name)
        return None if raw is None else printable(raw, limit)

    @property
    def reason(self) -> str | None:
        """``dlq.reason``; ``delivery_failed`` for a failed webhook delivery."""
        reason = self.text(REASON)
        if reason is None and self.header("webhook.id") is not None:
            return DELIVERY_FAILED
        return reason

    @property
    def source(self) -> Position | None:
        return Position.parse(self.header(SOURCE))

    @property
    def source_text(self) -> str | None:
        """``dlq.source`` as written, for display (it may not parse)."""
        return self.text(SOURCE, 300)

    @property
    def detail(self) -> str | None:
        detail = self.text(DETAIL, DETAIL_CHARS)
        if detail is None and self.reason == DELIVERY_FAILED:
            return self._delivery_detail()
        return detail

    def _delivery_detail(self) -> str:
        def field(name: str) -> str:
            return self.text(name, 40) or "-"

        error = self.text("webhook.last_error", 60)
        return (
            f"endpoint {field('webhook.endpoint')} {field('webhook.event_type')}, "
            f"{field('webhook.attempts')} attempts, last {field('webhook.last_status')}"
            + (f" {error}" if error else "")
        )

    @property
    def truncated(self) -> tuple[str, ...]:
        """The parts of the original this letter holds only in part (cut to fit, or left out by
        an older worker); a ``dlq.truncated`` naming nothing known reads as ``("unknown",)``."""
        raw = self.header(TRUNCATED)
        if raw is not None:
            named = raw.decode("ascii", "replace").split(",")[: len(PARTS) + 1]
            parts = tuple(p for p in PARTS if p in named)
            return parts or ("unknown",)
        detail = self.header(DETAIL)
        if not self.value and detail is not None and _LEFT_OUT.search(detail[:DETAIL_LIMIT]):
            return ("value",)
        return ()

    def original(self) -> dict[str, Any] | None:
        """What a truncated letter says of its original (sizes, SHA-256 digests, header count),
        well-formed values only; None when it says nothing."""
        if self.header(TRUNCATED) is None:
            return None
        fields = {
            "key_bytes": (KEY_BYTES, _NUMBER),
            "key_sha256": (KEY_SHA256, _SHA256),
            "value_bytes": (VALUE_BYTES, _NUMBER),
            "value_sha256": (VALUE_SHA256, _SHA256),
            "headers_count": (HEADERS_COUNT, _NUMBER),
            "headers_bytes": (HEADERS_BYTES, _NUMBER),
        }
        out: dict[str, Any] = {}
        for name, (header, pattern) in fields.items():
            raw = self.header(header)
            text = None if raw is None else raw.decode("ascii", "replace")
            if text is not None and pattern.fullmatch(text):
                out[name] = int(text) if pattern is _NUMBER else text
        return out

    def original_headers(self) -> list[tuple[str, bytes | None]]:
        """Every header not starting with ``dlq.``: what the record carried when it failed."""
        return [(k, v) for k, v in self.headers if not k.startswith(PREFIX)]

    def summary(self) -> dict[str, Any]:
        """The ``list --json`` object: every field bounded, bytes as ``blob``s."""
        webhook = {
            name.removeprefix("webhook."): self.text(name, 512)
            for name in WEBHOOK_HEADERS
            if self.header(name) is not None
        }
        source = self.source
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.time,
            "reason": self.reason,
            "key": blob(self.key, 256),
            "source": None if source is None else str(source),
            "source_header": None if source is not None else self.source_text,
            "exception": self.text(EXCEPTION),
            "fingerprint": self.text(FINGERPRINT),
            "attempts": self.text(ATTEMPTS),
            "detail": self.text(DETAIL, 1024),
            "redriven_from": self.text(REDRIVEN, 300),
            "webhook": webhook or None,
            "value_bytes": None if self.value is None else len(self.value),
            "truncated": list(self.truncated) or None,
            "original": self.original(),
        }

    def line(self) -> str:
        """One tab-separated ``list`` line: position, time, reason, key, source, exception,
        detail (cut; after ``[truncated: …]`` when the letter is not the whole original)."""
        detail = self.detail
        if self.truncated:
            detail = f"[truncated: {','.join(self.truncated)}] {detail or ''}".rstrip()
        fields = (
            self.at,
            self.time,
            self.reason,
            None if self.key is None else printable(self.key, FIELD_CHARS),
            self.source_text,
            self.text(EXCEPTION),
            detail,
        )
        return "\t".join(f or "-" for f in fields)


@dataclass(frozen=True, slots=True)
class Filter:
    """What ``list`` and ``redrive`` select; an empty field selects everything."""

    reasons: frozenset[str] = frozenset()
    keys: frozenset[bytes] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    source_topics: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        *,
        reasons: Iterable[str] = (),
        keys: Iterable[str] = (),
        since: datetime | None = None,
        until: datetime | None = None,
        source_topics: Iterable[str] = (),
    ) -> Filter:
        return cls(
            reasons=frozenset(reasons),
            keys=frozenset(k.encode() for k in keys),
            since_ms=None if since is None else int(since.timestamp() * 1000),
            until_ms=None if until is None else int(until.timestamp() * 1000),
            source_topics=frozenset(source_topics),
        )

    def __call__(self, letter: DeadLetter) -> bool:
        if self.since_ms is not None and letter.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and letter.timestamp_ms >= self.until_ms:
            return False
        if self.reasons and letter.reason not in self.reasons:
            return False
        if self.keys and letter.key not in self.keys:
            return False
        if self.source_topics:
            source = letter.source
            if source is None or source.topic not in self.source_topics:
                return False
        return True


# --- rendering ------------------------------------------------------------------------------


def printable(raw: bytes, limit: int, *, newlines: bool = False) -> str:
    """``raw`` for a terminal: UTF-8 text with control and invisible characters escaped, or
    ``hex:…`` when it is not UTF-8; cut to ``limit`` characters with a trailing ``…``."""
    head = raw[: limit * 4 + 4]
    text = _utf8(raw, head)
    if text is None:
        cut = raw[: limit // 2]
        return "hex:" + cut.hex() + ("…" if len(cut) < len(raw) else "")
    shown = escape(text[:limit], newlines=newlines)
    return shown + ("…" if len(text) > limit or len(head) < len(raw) else "")


def _utf8(raw: bytes, cut: bytes) -> str | None:
    """The text of ``cut``, the first bytes of ``raw``, when the whole of ``raw`` is UTF-8
    (a character cut in two at the end dropped); None when it is not."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return cut.decode("utf-8", errors="ignore")


def escape(text: str, *, newlines: bool = False) -> str:
    """Control, format and other non-printable characters as ``\\x1b``-style escapes
    (newlines and tabs kept with ``newlines``)."""
    if text.isprintable():
        return text
    keep = "\n\t" if newlines else ""
    return "".join(
        c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def blob(raw: bytes | None, limit: int | None) -> dict[str, Any] | None:
    """Bytes for JSON: ``{"utf8": …}`` when they are UTF-8, else ``{"base64": …}``, with the
    full ``size`` and whether ``limit`` (bytes; None: no limit) cut them."""
    if raw is None:
        return None
    cut = raw if limit is None else raw[:limit]
    text = _utf8(raw, cut)
    body = {"utf8": text} if text is not None else {"base64": base64.b64encode(cut).decode()}
    return {**body, "size": len(raw), "truncated": len(cut) < len(raw)}


def value_text(raw: bytes | None, limit: int | None) -> tuple[str, str]:
    """(label, body) of a value for ``dlq show``: UTF-8 text (control characters escaped) or
    base64, cut to ``limit`` bytes (None: all)."""
    if raw is None:
        return "null", ""
    cut = raw if limit is None else raw[:limit]
    more = f", first {len(cut)} shown; --full prints all" if len(cut) < len(raw) else ""
    text = _utf8(raw, cut)
    if text is None:
        encoded = base64.b64encode(cut).decode("ascii")
        lines = [encoded[i : i + 76] for i in range(0, len(encoded), 76)]
        return f"{len(raw)} bytes, not UTF-8, base64{more}", "\n".join(lines)
    return f"{len(raw)} bytes, UTF-8{more}", escape(text, newlines=True)


def show_text(letter: DeadLetter, *, limit: int | None) -> str:
    """Everything about one dead letter, for a terminal: headers in order, then the value."""
    header_limit = None if limit is None else min(limit, 1024)
    rows = [
        f"record     {letter.topic} {letter.at}",
        f"time       {letter.time}",
        f"reason     {letter.reason or '-'}",
        f"source     {letter.source_text or '-'}",
        "key        " + ("null" if letter.key is None else printable(letter.key, 1024)),
    ]
    if letter.truncated:
        rows.append(
            f"truncated  {', '.join(letter.truncated)}: only part of the original record is "
            "kept; it cannot be redriven"
        )
        rows += [f"  original {name}: {value}" for name, value in (letter.original() or {}).items()]
    rows.append(f"headers    {len(letter.headers)}")
    rows += [
        f"  {printable(k.encode(), 256)}: " + ("null" if v is None else _shown(v, header_limit))
        for k, v in letter.headers
    ]
    label, body = value_text(letter.value, limit)
    rows.append(f"value      {label}")
    if body:
        rows.append(body)
    return "\n".join(rows)


def _shown(raw: bytes, limit: int | None) -> str:
    return printable(raw, len(raw) if limit is None else limit)


def show_json(letter: DeadLetter, *, limit: int | None) -> dict[str, Any]:
    header_limit = None if limit is None else min(limit, 1024)
    return {
        **letter.summary(),
        "key": blob(letter.key, limit),
        "headers": [[k, blob(v, header_limit)] for k, v in letter.headers],
        "value": blob(letter.value, limit),
    }
