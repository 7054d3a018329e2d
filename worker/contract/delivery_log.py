"""The webhook delivery log's records, written by the dispatcher and read by the front-end:
one delivery's state (``DeliveryLogEntry``, batched per endpoint), its stable ``webhook_id``,
the replay request (``Replay``) and each attempt (``AttemptRecord``), so ``GET
.../deliveries/{delivery_id}`` can show every one (docs/architecture.md, "The delivery log an
integrator reads"). An answer's body is the receiver's, so hostile: cut to ``EXCERPT_BYTES``
first and kept as text, undecodable bytes escaped (``\\xNN``), never bytes to interpret."""

from __future__ import annotations

import hashlib
from typing import Annotated, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from worker.contract.messages import TopicRecord

EXCERPT_BYTES: Final = 256
"""Bytes of an answer's body the log keeps per attempt (the sender reads at most its own cap,
``DEFAULT_BODY_CAP``, of which this is the start)."""
EXCERPT_CHARS: Final = 4 * EXCERPT_BYTES
"""The longest excerpt as text: each byte escaped is four characters (``\\xNN``)."""


class AttemptRecord(BaseModel):
    """One attempt of one delivery, as written with the log entry of its outcome."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    at: str = Field(description="When the attempt started (RFC 3339).")
    status: int | None = Field(default=None, description="The answer's HTTP status, if any.")
    latency_ms: int | None = Field(
        default=None, description="From sending the request to the end of the read answer."
    )
    response_excerpt: str | None = Field(
        default=None,
        max_length=EXCERPT_CHARS,
        description=f"The first {EXCERPT_BYTES} bytes of the answer's body as text: UTF-8,"
        " any byte that is not valid UTF-8 escaped as `\\xNN`. The receiver's bytes: shown"
        " as text, never interpreted.",
    )
    response_truncated: bool = Field(
        default=False, description="The answer's body was longer than the excerpt."
    )
    error_kind: str | None = Field(
        default=None,
        max_length=64,
        description="Why no status came back: blocked, dns, connect, tls, timeout, protocol,"
        " internal.",
    )


def excerpt(body: bytes, *, truncated: bool = False) -> tuple[str, bool]:
    """The first ``EXCERPT_BYTES`` of ``body`` as text, and whether anything was cut."""
    cut = body[:EXCERPT_BYTES]
    text = cut.decode("utf-8", "backslashreplace")
    return text[:EXCERPT_CHARS], truncated or len(body) > EXCERPT_BYTES


def webhook_id(event_id: str, endpoint_id: str) -> str:
    """One id per (event, endpoint), for ever: every retry, replay and redelivery reuses it."""
    digest = hashlib.sha256(f"{event_id}\0{endpoint_id}".encode()).hexdigest()
    return f"msg_{digest[:32]}"


NOTE_ENDPOINT_DISABLED: Final = "endpoint.disabled"
"""The ``event_type`` of the delivery-log note written when the dispatcher disables an
endpoint (410, or failing for the configured period)."""


class DeliveryLogEntry(TopicRecord):
    """One state of one delivery on the delivery log (key: endpoint id; latest wins)."""

    type: Literal["webhook_delivery"] = "webhook_delivery"
    webhook_id: str
    endpoint_id: str
    workspace_id: str
    account_id: str
    event_type: str
    event_id: str
    version: int | None = None
    attempts: int
    state: Literal["pending", "delivered", "failed"]
    last_status: int | None = None
    last_error: str | None = None
    next_attempt_at: str | None = None
    updated_at: str
    replay: str | None = None
    # Added for the integrator's log (absent from older entries, read as None):
    attempt: AttemptRecord | None = None
    """The attempt this entry is the outcome of (none: taken in, refused, failed unattempted)."""
    body: str | None = None
    """The exact body signed and sent: what a resend sends again."""
    occurred_at: str | None = None


LOG_BATCH_MAX: Final = 200
"""Entries one delivery-log record holds at most."""
LOG_UNACKED_MAX: Final = 4 * LOG_BATCH_MAX
"""Successes' entries the dispatcher may have under way with no writer waiting for them (each
holds its event's offset until acknowledged); past it, a pair that settles waits for its own."""
LOG_BATCH_BYTES: Final = 512 * 1024
"""About the most bytes of entries one delivery-log record holds (an entry carries its body,
at most ``MAX_RECORD_BYTES``, and an attempt's excerpt): far below the broker's record
limit. A batch is sent once it is over."""


class DeliveryLogBatch(TopicRecord):
    """Entries of one endpoint's delivery log written within one flush window, oldest first
    (key: endpoint id), in one record instead of one each; latest wins per webhook-id as for
    single entries."""

    type: Literal["webhook_delivery_batch"] = "webhook_delivery_batch"
    endpoint_id: str
    entries: tuple[DeliveryLogEntry, ...] = Field(min_length=1, max_length=LOG_BATCH_MAX)

    @model_validator(mode="after")
    def _one_endpoint(self) -> Self:
        if any(e.endpoint_id != self.endpoint_id for e in self.entries):
            raise ValueError("every entry must be of the record's endpoint")
        return self


_LOG_RECORD: TypeAdapter[DeliveryLogEntry | DeliveryLogBatch] = TypeAdapter(
    Annotated[DeliveryLogEntry | DeliveryLogBatch, Field(discriminator="type")]
)


def decode_log(value: bytes) -> tuple[DeliveryLogEntry, ...]:
    """A delivery-log value in either form as its entries, oldest first; raises
    ``pydantic.ValidationError`` for anything else."""
    record = _LOG_RECORD.validate_json(value)
    return record.entries if isinstance(record, DeliveryLogBatch) else (record,)


class Replay(TopicRecord):
    """A ``POST .../replay`` request for one event and one endpoint (on the replay topic,
    key: account id, so it reaches the lane of the account like the event itself did).
    ``source`` ``webhook``: ``event`` is an ``EventCopy`` (a resend or a test send,
    ``worker.api.webhooks.sends``), not a record of auth.status / auth.errors."""

    type: Literal["webhook_replay"] = "webhook_replay"
    replay_id: str = Field(max_length=64)
    endpoint_id: str
    workspace_id: str
    source: Literal["status", "errors", "webhook"]
    event: str


def decode_replay(value: bytes) -> Replay:
    return Replay.model_validate_json(value)


__all__ = [
    "EXCERPT_BYTES",
    "EXCERPT_CHARS",
    "LOG_BATCH_BYTES",
    "LOG_BATCH_MAX",
    "NOTE_ENDPOINT_DISABLED",
    "AttemptRecord",
    "DeliveryLogBatch",
    "DeliveryLogEntry",
    "Replay",
    "decode_log",
    "decode_replay",
    "excerpt",
    "webhook_id",
]
