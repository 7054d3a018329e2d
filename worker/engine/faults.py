"""Which faults stay with one record (retried, then dead-lettered) and which end the process
(a restart is their only cure: ``is_process_fault``), and how a record is dead-lettered
(docs/architecture.md, "Failure handling", whose table lists both kinds)."""

from __future__ import annotations

import hashlib
import traceback
from dataclasses import dataclass
from typing import Final

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ProducerFenced,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
)

#: Header names of a dead letter; the original record's headers come first, unchanged.
REASON: Final = "dlq.reason"
DETAIL: Final = "dlq.detail"
SOURCE: Final = "dlq.source"
EXCEPTION: Final = "dlq.exception"
FINGERPRINT: Final = "dlq.fingerprint"
ATTEMPTS: Final = "dlq.attempts"
REDRIVEN: Final = "dlq.redriven"
PREFIX: Final = "dlq."

#: ``dlq.reason`` of a record whose handling failed (the decode reasons are
#: ``worker.contract.messages.DECODE_REASONS``; the dispatcher's undecodable events are
#: ``undecodable``; a record the Kafka client itself cannot parse is ``unreadable``, kept by
#: offset only).
FAULT_REASONS: Final = (
    "handler_failed",
    "output_too_large",
    "output_rejected",
    "undecodable",
    "unreadable",
)

DETAIL_LIMIT: Final = 1024


class ProcessFault(RuntimeError):
    """A fault of the process, not of a record: the consume loop ends and the process exits."""


class RecordRejected(Exception):
    """The broker (or our own bound, checked before producing) refuses a record we built:
    too large, or invalid. Sending the same bytes again fails the same way, so the unit of
    work that built it fails at once, with ``reason``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


_PROCESS_FAULTS: Final = (
    ProcessFault,
    MemoryError,
    ProducerFenced,
    UnknownTopicOrPartitionError,
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)


def is_process_fault(exc: BaseException) -> bool:
    """True when ``exc`` must end the process rather than fail one record."""
    return isinstance(exc, _PROCESS_FAULTS) or not isinstance(exc, Exception)


def is_permanent(exc: BaseException) -> bool:
    """True when retrying the record cannot help (the same bytes fail the same way)."""
    return isinstance(exc, RecordRejected | RecursionError)


def fingerprint(exc: BaseException) -> str:
    """16 hex digits naming where and how ``exc`` was raised: its class and the functions of
    its traceback (no line numbers, no message), so one bug groups under one fingerprint
    across records and releases that only moved lines."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = "|".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.name}" for f in frames[-8:])
    digest = hashlib.sha256(f"{type(exc).__qualname__}|{where}".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Fault:
    """Why a record is dead-lettered. ``reason`` is a low-cardinality label (metrics, the
    ``dlq.reason`` header, the CLI's filter); ``detail`` is for a human, at most 1 KiB."""

    reason: str
    detail: str
    exception: str | None = None
    fingerprint: str | None = None
    attempts: int = 1

    @classmethod
    def of(cls, exc: BaseException, *, attempts: int) -> Fault:
        """The fault of a unit of work that raised ``exc`` on its last attempt."""
        if isinstance(exc, RecordRejected):
            reason, detail = f"output_{exc.reason}", exc.detail
        else:
            reason, detail = "handler_failed", f"{type(exc).__name__}: {exc}"
        return cls(
            reason=reason,
            detail=_short(detail),
            exception=type(exc).__qualname__,
            fingerprint=fingerprint(exc),
            attempts=attempts,
        )

    def logged(self) -> dict[str, str | None]:
        """What a log line about the fault names (its ``detail`` may quote input)."""
        return {"reason": self.reason, "exception": self.exception, "fingerprint": self.fingerprint}

    def headers(self, source: tuple[str, int, int]) -> list[tuple[str, bytes]]:
        topic, partition, offset = source
        extra = [
            (REASON, self.reason.encode()),
            (DETAIL, self.detail.encode("utf-8", "replace")[:DETAIL_LIMIT]),
            (SOURCE, f"{topic}:{partition}:{offset}".encode()),
            (ATTEMPTS, str(self.attempts).encode()),
        ]
        if self.exception is not None:
            extra.append((EXCEPTION, self.exception.encode()))
        if self.fingerprint is not None:
            extra.append((FINGERPRINT, self.fingerprint.encode()))
        return extra


def _short(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters: exception messages may quote whole inputs."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


__all__ = [
    "ATTEMPTS",
    "DETAIL",
    "EXCEPTION",
    "FAULT_REASONS",
    "FINGERPRINT",
    "PREFIX",
    "REASON",
    "REDRIVEN",
    "SOURCE",
    "Fault",
    "ProcessFault",
    "RecordRejected",
    "fingerprint",
    "is_permanent",
    "is_process_fault",
]
