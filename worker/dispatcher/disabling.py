"""Disabling an endpoint that keeps failing: one that answered 410 Gone, or has failed for
``disable_after_s`` with no success here meanwhile, is disabled with a note in its delivery log
(docs/architecture.md, "Webhook fan-out"), and announced first as an ``endpoint.disabled``
event to the workspace's other endpoints (``worker.contract.operational_events``). Its
record starts its probing (``ProbeConfig.start``, ``worker.dispatcher.probing``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.contract.delivery_log import NOTE_ENDPOINT_DISABLED
from worker.contract.messages import rfc3339
from worker.contract.operational_events import EndpointFailure, disabled_record
from worker.contract.webhook_endpoints import EndpointRecord, Recovery
from worker.dispatcher.delivery import Settled
from worker.dispatcher.dispatch_ports import Ports
from worker.dispatcher.endpoint_gate import SWEEP_FLOOR, EndpointGate
from worker.dispatcher.instrumentation import log
from worker.dispatcher.metrics import WebhookMetrics


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    """The probing schedule of a disabled endpoint: ``first_s`` after it was disabled,
    doubling after each failed probe up to ``max_s``, for ``for_s``; ``max_in_flight`` probes
    at once per process (``WEBHOOK_PROBE_*``)."""

    first_s: float = 300.0
    max_s: float = 6 * 3600.0
    for_s: float = 7 * 86_400.0
    max_in_flight: int = 16

    def start(self, endpoint: EndpointRecord, now: float) -> Recovery:
        """The probing of ``endpoint`` disabled at ``now``. A recovery that did not hold
        (re-enabled by a probe less than ``for_s`` ago) goes on from twice its last wait, its
        ``recovered_at`` kept, so each flap of a receiver doubles it again."""
        prior = endpoint.recovery
        wait, recovered = self.first_s, None
        if prior and prior.recovered_at is not None and now - prior.recovered_at < self.for_s:
            wait, recovered = min(self.max_s, 2 * prior.interval_s), prior.recovered_at
        return Recovery(
            disabled_at=now, interval_s=wait, next_probe_at=now + wait, recovered_at=recovered
        )


class Disabling:
    """Successes per endpoint, and the decision to disable one after a failed attempt."""

    def __init__(
        self,
        *,
        ports: Ports,
        gate: EndpointGate,
        metrics: WebhookMetrics,
        known: Callable[[str], bool],
        disable_after_s: float,
        probing: ProbeConfig | None = None,
    ) -> None:
        self._ports = ports
        self._probing = probing or ProbeConfig()
        self._gate = gate
        self.metrics = metrics
        self._known = known
        self.disable_after_s = disable_after_s
        self.last_success: dict[str, float] = {}
        """When each endpoint last had a delivery succeed here: only endpoints still in the
        registry, within ``disable_after_s`` (``succeeded``)."""
        self._success_sweep_at = SWEEP_FLOOR

    def succeeded(self, endpoint_id: str, now: float) -> None:
        """Note a success. A time older than ``disable_after_s`` weighs as none in
        ``maybe_disable``, and a deleted endpoint's not at all: once the map has doubled since
        the last sweep (at least ``SWEEP_FLOOR``), both are swept out, so it holds at most
        about twice the endpoints of the registry."""
        self.last_success[endpoint_id] = now
        if len(self.last_success) <= self._success_sweep_at:
            return
        horizon = now - self.disable_after_s
        for held, at in list(self.last_success.items()):
            if at <= horizon or not self._known(held):
                del self.last_success[held]
        self._success_sweep_at = max(SWEEP_FLOOR, 2 * len(self.last_success))

    async def maybe_disable(self, endpoint: EndpointRecord, settled: Settled, now: float) -> None:
        """Disable ``endpoint`` if what ``settled`` came to says it keeps failing."""
        reason = None
        # Failing since the earliest evidence: the pair's own (kept in its record) or the
        # endpoint's as a whole (this process's attempts to any of its pairs).
        evidence = (settled.state.failing_since, self._gate.failing_since(endpoint.id))
        since = min((t for t in evidence if t), default=None)
        if settled.outcome == "gone":
            reason = "the endpoint answered 410 Gone"
        elif since is not None and now - since >= self.disable_after_s:
            last_ok = self.last_success.get(endpoint.id, 0.0)
            if now - last_ok >= self.disable_after_s:
                reason = f"failing for {self.disable_after_s / 86400:g} days"
        if reason is None:
            return
        try:
            if self._ports.announcer is not None:
                # Before the write: announced under the id of the revision it writes, so a
                # crash in between announces the same id again on the next try.
                await self._ports.announcer.announce(_disabled(endpoint, reason, settled, since))
            await self._ports.writer.disable(endpoint, reason, self._probing.start(endpoint, now))
        except Exception as exc:  # the next failure tries again; never fatal for a lane
            log.error("endpoint_disable_failed", endpoint_id=endpoint.id, error=repr(exc))
            return
        self.metrics.disabled.inc()
        log.warning(
            "endpoint_disabled",
            endpoint_id=endpoint.id,
            workspace_id=endpoint.workspace_id,
            reason=reason,
        )
        await self._ports.publisher.log_note(
            endpoint_id=endpoint.id,
            workspace_id=endpoint.workspace_id,
            note=NOTE_ENDPOINT_DISABLED,
            detail=reason,
            now=now,
        )


def _disabled(endpoint: EndpointRecord, reason: str, settled: Settled, since: float | None) -> Any:
    """The ``endpoint.disabled`` announcement: the failure that decided it."""
    finished = settled.finished
    last = finished or settled.state.head()  # the delivery that ended, or the one retrying
    failures = []
    if last is not None:
        at = None if finished is None else rfc3339(finished.finished_at)
        failures.append(
            EndpointFailure(
                at=at, status=last.last_status, error=last.last_error, attempts=last.attempts
            )
        )
    return disabled_record(
        endpoint,
        reason,
        failing_since=None if since is None else rfc3339(since),
        failures=failures,
    )
