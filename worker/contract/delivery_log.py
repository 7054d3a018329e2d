"""What the delivery log keeps of one HTTP attempt (``AttemptRecord``): when, the answer's
status, how long it took, the first bytes of the answer's body and why no status came back,
so ``GET .../deliveries/{delivery_id}`` can show every attempt (docs/architecture.md, "The
delivery log an integrator reads"). The body is the receiver's, so hostile: it is cut to
``EXCERPT_BYTES`` bytes before anything else and kept as text, undecodable bytes escaped
(``\\xNN``), never as bytes a reader would have to interpret."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from pydantic import BaseModel, ConfigDict, Field

from worker.contract.messages import rfc3339

if TYPE_CHECKING:  # the sender imports the delivery model, which imports this
    from worker.webhooks.sender import DeliveryResult

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


def attempt_record(
    started_at: float, answer: DeliveryResult | None, error_kind: str | None = None
) -> AttemptRecord:
    """The record of one attempt from what the sender answered (``None``: the attempt
    raised before an answer, ``error_kind`` says how)."""
    if answer is None:
        return AttemptRecord(at=rfc3339(started_at), error_kind=error_kind)
    text, cut = excerpt(answer.body, truncated=answer.truncated)
    return AttemptRecord(
        at=rfc3339(started_at),
        status=answer.status,
        latency_ms=max(0, round(answer.elapsed_s * 1000)),
        response_excerpt=text or None,
        response_truncated=cut,
        error_kind=None if answer.error is None else str(answer.error)[:64],
    )


__all__ = ["EXCERPT_BYTES", "EXCERPT_CHARS", "AttemptRecord", "attempt_record", "excerpt"]
