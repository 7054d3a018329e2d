"""Tracing, logging and metrics around the executor's handlers, as a middleware over what a record
came to (``Handled``); a query is only counted and timed: its 404 is an answer."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

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


class Instrumentation:
    """Runs a handler with its command in context, then records what it came to."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        #: The count and duration series of each (command type, verdict), looked up once:
        #: both are fixed sets (``COMMAND_TYPES``, ``Verdict``).
        self._series: dict[tuple[str, str], tuple[Any, Any]] = {}

    def _count(self, command_type: str, verdict: str, started: float) -> None:
        """One command of ``command_type`` came to ``verdict``: counted and timed."""
        series = self._series.get((command_type, verdict))
        if series is None:
            series = self._series[(command_type, verdict)] = (
                self.metrics.commands.labels(command_type, verdict),
                self.metrics.command_seconds.labels(command_type),
            )
        series[0].inc()
        series[1].observe(time.perf_counter() - started)

    async def run(
        self,
        msg: ConsumerRecord[bytes, bytes],
        command: Command | DecodeFailure,
        handler: Callable[[], Awaitable[Handled]],
        *,
        started: float | None = None,
    ) -> Handled:
        """``handler``'s result, instrumented. ``started`` is when the record was taken up (the
        duration counts from it; by default, from now). The span is the caller's: a command's
        CONSUMER span, none for a record let go after its retries."""
        if started is None:
            started = time.perf_counter()
        if isinstance(command, DecodeFailure | GetAuthState):
            handled = await handler()
            self._record(msg, handled, started)
            return handled
        span = trace.get_current_span() if tracing.recording() else None
        if span is not None and span.is_recording():
            span.set_attributes(
                {
                    "passkey.command.type": command.type,
                    "passkey.account_id": command.account_id,
                    "passkey.command_id": command.command_id,
                }
            )
        with log_context(
            account_id=command.account_id,
            command_id=command.command_id,
            request_id=request_id_of(command),
            partition=msg.partition,
            offset=msg.offset,
        ):
            handled = await handler()
            self._record(msg, handled, started)
        return handled

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

    def _record(self, msg: ConsumerRecord[bytes, bytes], handled: Handled, started: float) -> None:
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
