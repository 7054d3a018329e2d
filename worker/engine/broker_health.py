"""Knowing when the cluster is unreachable: each process's ``BrokerHealth`` notes when an outage
began, a monitor probes the cluster, and past ``KAFKA_OUTAGE_TOLERANCE_S`` the process exits
(docs/operations.md, "Kafka outages"). The write path (``worker.engine.writes``) reports to it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final

from aiokafka.client import ConnectionGroup
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.protocol.metadata import MetadataRequest
from prometheus_client import CollectorRegistry, Gauge

from worker.engine.faults import ProcessFault
from worker.runtime.logs import get_logger

log = get_logger(__name__)


#: How often the monitor asks the cluster, and how long an answer may take.
PROBE_INTERVAL_S: Final = 2.0
PROBE_TIMEOUT_S: Final = 3.0
#: Pause before re-sending after a failed produce: doubling from the first to the last.
RESEND_BACKOFF_S: Final = (0.1, 1.0)

Probe = Callable[[], Awaitable[object]]


def is_outage(exc: BaseException) -> bool:
    """A Kafka error that a reachable, working cluster would not give: retried, never fatal.
    aiokafka flags these ``retriable``; ``KafkaTimeoutError`` (a batch not queued in time) is
    not flagged but means the same here."""
    return isinstance(exc, KafkaTimeoutError) or (
        isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))
    )


class BrokerOutageExceeded(ProcessFault):
    """The cluster has been unreachable for longer than the tolerance: the process ends."""


@dataclass(eq=False)
class BrokerHealth:
    """When the current outage began (``None``: the cluster answers), for one process."""

    tolerance_s: float = 300.0
    _: KW_ONLY
    name: str = "process"
    clock: Callable[[], float] = time.monotonic
    outage_started: float | None = field(default=None, init=False)
    outages: int = field(default=0, init=False)

    # -- what happened -------------------------------------------------------------------------

    def failed(self, error: BaseException | str, *, source: str = "produce") -> None:
        """A request failed for an outage reason: the outage begins now unless it already
        had."""
        if self.outage_started is None:
            self.outage_started = self.clock()
            self.outages += 1
            log.warning(
                "kafka_unreachable",
                process=self.name,
                source=source,
                error=error if isinstance(error, str) else repr(error),
                tolerance_s=self.tolerance_s,
            )

    def succeeded(self) -> None:
        """Any answer from the cluster ends the outage."""
        started = self.outage_started
        if started is not None:
            self.outage_started = None
            log.info(
                "kafka_reachable_again",
                process=self.name,
                outage_s=round(self.clock() - started, 3),
            )

    # -- what it means -------------------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        return self.outage_started is None

    def outage_seconds(self) -> float:
        """How long the current outage has lasted (0 while the cluster answers)."""
        started = self.outage_started
        return 0.0 if started is None else max(0.0, self.clock() - started)

    @property
    def exceeded(self) -> bool:
        return self.outage_started is not None and self.outage_seconds() >= self.tolerance_s

    def check(self) -> None:
        """Raise ``BrokerOutageExceeded`` (logged once, ``kafka_outage_exceeded``) past the
        tolerance."""
        if self.exceeded:
            outage_s = round(self.outage_seconds(), 1)
            log.error(
                "kafka_outage_exceeded",
                process=self.name,
                outage_s=outage_s,
                tolerance_s=self.tolerance_s,
                detail="Kafka unreachable for longer than KAFKA_OUTAGE_TOLERANCE_S; exiting so "
                "the orchestrator restarts the process",
            )
            raise BrokerOutageExceeded(
                f"Kafka unreachable for {outage_s} s (tolerance {self.tolerance_s:g} s)"
            )

    def export(self, registry: CollectorRegistry, prefix: str) -> None:
        """``<prefix>kafka_outage_seconds`` and ``<prefix>kafka_broker_reachable``, computed
        at scrape time."""
        for name, doc, value in (
            ("outage_seconds", "Seconds the current Kafka outage has lasted (0: the cluster "
             "answers)", self.outage_seconds),
            ("broker_reachable", "1 while the Kafka cluster answers, 0 during an outage",
             lambda: 1.0 if self.reachable else 0.0),
        ):  # fmt: skip
            Gauge(f"{prefix}kafka_{name}", doc, registry=registry).set_function(value)

    async def pause(self, attempt: int) -> None:
        """The wait before the ``attempt``-th re-send (0-based)."""
        low, high = RESEND_BACKOFF_S
        await asyncio.sleep(min(high, low * 2**attempt))

    # -- the probe -----------------------------------------------------------------------------

    async def monitor(self, probe: Probe, *, interval_s: float = PROBE_INTERVAL_S) -> None:
        """Probe the cluster every ``interval_s`` until cancelled; raises
        ``BrokerOutageExceeded`` once an outage outlasts the tolerance."""
        while True:
            try:
                await asyncio.wait_for(probe(), timeout=PROBE_TIMEOUT_S)
            except (KafkaError, TimeoutError, OSError) as exc:
                reason = (
                    "no answer within the probe timeout" if isinstance(exc, TimeoutError) else exc
                )
                self.failed(reason, source="probe")
            else:
                self.succeeded()
            self.check()
            await asyncio.sleep(interval_s)


def metadata_probe(client: Any, topic: str) -> Probe:
    """A metadata request for one topic through ``client`` (a started producer's
    ``AIOKafkaClient``), on the coordination connection group: a connection of its own, so
    the probe never queues behind produce requests and never breaks their connection."""
    request = MetadataRequest([topic], allow_auto_topic_creation=False)

    async def probe() -> None:
        node = client.get_random_node()
        if node is None:
            raise KafkaConnectionError("no broker known")
        await client.send(node, request, group=ConnectionGroup.COORDINATION)

    return probe
