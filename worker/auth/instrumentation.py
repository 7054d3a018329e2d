"""Tracing, logging and metrics around the executor's handlers, as a middleware over what a record
came to (``Handled``); a query is only counted and timed: its 404 is an answer."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal

from aiokafka.structs import ConsumerRecord
from opentelemetry import trace

from worker.auth.flow import Verdict
from worker.auth.metrics import WorkerMetrics
from worker.contract.catalogue import ServiceError
from worker.contract.messages import Command, DecodeFailure, GetAuthState, request_id_of
from worker.runtime import tracing
from worker.runtime.logs import get_logger, log_context

# The lines are the executor's: they keep its logger name, which dashboards and searches use.
log = get_logger("worker.auth.execute")


@dataclass(frozen=True, slots=True)
class Decided:
    """A command (or a query) decided on its home partition, its outputs acknowledged."""

    command: Command
    verdict: Verdict
    error: ServiceError | None = None


@dataclass(frozen=True, slots=True)
class Forwarded:
    """A command that arrived off its key's home partition and was forwarded there."""

    command: Command
    home: int


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """A record sent to the DLQ: ``invalid`` (not a command, or misrouted) or ``failed`` (its
    handling failed for good). ``type`` is the command's, or ``unknown`` for a record that is
    not one."""

    type: str
    outcome: Literal["invalid", "failed"]


Handled = Decided | Forwarded | DeadLettered


@dataclass(frozen=True, slots=True)
class Expired:
    """A follow-up step that ended its flow failed: the deadline passed without a final
    status."""

    account_id: str


#: The scope of a record handled without its ids in the log context.
_BARE: Final[contextlib.nullcontext[None]] = contextlib.nullcontext()


class Instrumentation:
    """A handler's command in context (``scope``), then what it came to (``record``)."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def _count(self, command_type: str, verdict: str, started: float) -> None:
        """One command of ``command_type`` came to ``verdict``: counted and timed."""
        metrics = self.metrics
        metrics.child(metrics.commands, command_type, verdict).inc()
        metrics.child(metrics.command_seconds, command_type).observe(time.perf_counter() - started)

    def scope(
        self, msg: ConsumerRecord[bytes, bytes], command: Command | DecodeFailure
    ) -> log_context | contextlib.nullcontext[None]:
        """The block a record's handler runs in: a command's ids on the caller's span (a
        command's CONSUMER span, none for a record let go after its retries) and in the log
        context of everything logged meanwhile; a query, or a record that is no command, runs
        bare. A context, not a coroutine around the handler: a frame fewer on every resume."""
        if isinstance(command, DecodeFailure | GetAuthState):
            return _BARE
        span = trace.get_current_span() if tracing.recording() else None
        if span is not None and span.is_recording():
            span.set_attributes(
                {
                    "passkey.command.type": command.type,
                    "passkey.account_id": command.account_id,
                    "passkey.command_id": command.command_id,
                }
            )
        return log_context(
            account_id=command.account_id,
            command_id=command.command_id,
            request_id=request_id_of(command),
            partition=msg.partition,
            offset=msg.offset,
        )

    async def run_follow_up(
        self, partition: int, account_id: str, step: Callable[[], Awaitable[Expired | None]]
    ) -> None:
        """A follow-up step in a trace of its own (nothing carried a context to it), with its
        account in the log context."""
        with (
            tracing.span(
                "follow_up", parent=tracing.ROOT, attributes={"passkey.account_id": account_id}
            ),
            log_context(account_id=account_id, partition=partition),
        ):
            if await step() is not None:
                self.metrics.follow_up_expired.inc()
                log.info("follow_up_expired")

    def record(self, msg: ConsumerRecord[bytes, bytes], handled: Handled, started: float) -> None:
        """What ``msg`` came to, counted (timed from ``started``, when it was taken up) and
        logged; inside ``scope``."""
        metrics = self.metrics
        match handled:
            case Decided(command=GetAuthState() as query, verdict=verdict):
                self._count(query.type, verdict, started)
            case Decided(command=command, verdict=verdict, error=error):
                span = trace.get_current_span() if tracing.recording() else None
                if span is not None and span.is_recording():
                    span.set_attribute("passkey.verdict", verdict)
                    if error is not None:
                        span.set_attribute("passkey.error.code", error.code)
                self._count(command.type, verdict, started)
                if error is not None:
                    log.info("command_failed", code=error.code)
            case Forwarded(command=command, home=home):
                metrics.forwarded.labels(command.type).inc()
                # A query is forwarded too, without its command in the log context.
                log.debug(
                    "command_forwarded",
                    account_id=command.account_id,
                    command_id=command.command_id,
                    partition=msg.partition,
                    offset=msg.offset,
                    home=home,
                )
            case DeadLettered(type=kind, outcome=outcome):
                metrics.commands.labels(kind, outcome).inc()
