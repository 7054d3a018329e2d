"""Probing an endpoint the dispatcher disabled (docs/architecture.md, "Endpoints that heal"):
the member holding the partition its operational events are keyed to sends it a signed
``endpoint.probe`` when ``recovery.next_probe_at`` is due; any answer but a 2xx doubles the
wait (up to ``max_s``, for ``for_s``), a 2xx re-enables it (``endpoint.enabled``, reason
``recovered``) with ``recovery.replaying`` set: that member then queues the events it missed
since ``disabled_at`` under one replay id (the same after a crash or its time budget: no new
ids), progress on the replay board, and clears it with where webhook.replays then ended
(``replays_end``). Each probe is a delivery-log entry; probes and replays: admission rule."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Final

from worker.contract.delivery_log import DeliveryLogEntry
from worker.contract.messages import rfc3339
from worker.contract.operational_events import enabled_record, probe_body
from worker.contract.webhook_endpoints import (
    EVENT_ENDPOINT_PROBE,
    EndpointRecord,
    ProbeAnswer,
)
from worker.dispatcher.disabling import ProbeConfig
from worker.dispatcher.dispatch_ports import Ports
from worker.dispatcher.sender import ErrorKind, attempt_record
from worker.runtime.admission import Admission, NoRoom, Share, Slot
from worker.runtime.logs import get_logger
from worker.webhooks.replay_scan import (
    PROGRESS_EVERY_S,
    REPLAY_TIMEOUT_S,
    ReplayProgress,
    ReplayScan,
    ReplayState,
    following,
    progress_record,
    recovery_replay_id,
)

log = get_logger(__name__)

#: Probes one workspace may have under way at once in one process.
PER_WORKSPACE: Final = 2


class Prober:
    """Looks for due probes every ``tick_s`` (``run``); ``owns`` says whether an endpoint's
    probing is this process's."""

    def __init__(
        self,
        *,
        ports: Ports,
        owns: Callable[[str], bool],
        config: ProbeConfig,
        scan: ReplayScan | None = None,
        progress: Callable[[ReplayProgress], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.time,
        replay_budget_s: float = REPLAY_TIMEOUT_S,
    ) -> None:
        self._ports = ports
        self._endpoints = ports.endpoints
        self._writer = ports.writer
        self._owns = owns
        self.config = config
        self._scan = scan  # none: a re-enabled endpoint is not replayed what it missed
        self._progress = progress
        self._clock = clock
        self.replay_budget_s = replay_budget_s
        self.tick_s = min(5.0, config.first_s / 2)
        self.slots = Admission("webhook-probes", Share.capped(config.max_in_flight, PER_WORKSPACE))
        # Recoveries' replays: one a workspace, as the front-end runs them.
        self.replays = Admission("webhook-recoveries", Share.capped(config.max_in_flight, 1))
        # Endpoints with a probe under way here: at most the pool's capacity.
        self._running: dict[str, asyncio.Task[None]] = {}

    def due(self, now: float) -> list[EndpointRecord]:
        """This process's disabled endpoints whose next probe is due or that have no probing
        yet, and its re-enabled ones whose replay is still to queue; none already under way."""

        def due(e: EndpointRecord) -> bool:
            if e.replaying:
                return self._scan is not None
            if e.status != "disabled" or not e.auto_recover:
                return False
            return e.recovery is None or (e.recovery.next_probe_at or now + 1) <= now

        records = self._endpoints.records()
        return [e for e in records if due(e) and e.id not in self._running and self._owns(e.id)]

    def sweep(self) -> None:
        """Start the due probes and replays there is room for (the rest wait for the next
        sweep)."""
        for endpoint in self.due(self._clock()):
            probe = endpoint.status == "disabled"
            try:
                slot = (self.slots if probe else self.replays).take(endpoint.workspace_id)
            except NoRoom:
                continue
            task = asyncio.create_task((self._probe if probe else self._replay)(endpoint))
            self._running[endpoint.id] = task
            task.add_done_callback(functools.partial(self._ended, endpoint.id, slot))

    def _ended(self, endpoint_id: str, slot: Slot, _: object) -> None:
        self._running.pop(endpoint_id, None)
        slot.release()

    async def run(self) -> None:
        """Sweep until cancelled; the probes under way are cancelled with it (their
        endpoints are due again, on this or the next owner)."""
        try:
            while True:
                self.sweep()
                await asyncio.sleep(self.tick_s)
        finally:
            tasks = list(self._running.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._scan is not None:
                await self._scan.aside.drain()  # consumers whose start a cancel cut short

    async def _probe(self, endpoint: EndpointRecord) -> None:
        try:
            if endpoint.recovery is None:  # disabled before probing existed: probed from now
                started = self.config.start(endpoint, self._clock())
                await self._writer.update(endpoint, recovery=started)
            else:
                await self._send_probe(endpoint)
        except Exception as exc:  # a write that failed: still due, the next sweep tries again
            log.error("endpoint_probe_failed", endpoint_id=endpoint.id, error=repr(exc))

    async def _send_probe(self, endpoint: EndpointRecord) -> None:
        recovery = endpoint.recovery
        assert recovery is not None
        n, at = recovery.probes + 1, self._clock()
        probe_id, body = probe_body(endpoint, rfc3339(recovery.disabled_at), n, rfc3339(at))
        try:
            secrets = self._writer.signing_secrets(endpoint)
            headers = self._ports.sign(secrets, probe_id, int(at), body.encode())
            answer = await self._ports.sender.post(endpoint.url, body.encode(), headers)
            if answer.status is None and answer.error == ErrorKind.CAPACITY:
                return  # nothing sent (no slot of ours): due again at the next sweep
            record = attempt_record(at, answer)
        except Exception as exc:  # a secret that does not decrypt: a failed probe
            log.error("endpoint_probe_crashed", endpoint_id=endpoint.id, error=type(exc).__name__)
            answer, record = None, attempt_record(at, None, str(ErrorKind.INTERNAL))
        ok = answer is not None and answer.ok
        status = None if answer is None else answer.status
        error = None if ok else record.error_kind or f"http_{status}"
        now = self._clock()
        current = self._endpoints.get(endpoint.workspace_id, endpoint.id)
        if current is None or current.status != "disabled" or current.recovery != recovery:
            return  # changed meanwhile (activated, deleted, another probe): this one is moot
        answered = ProbeAnswer(at=rfc3339(at), status=status, error=error)
        entry = DeliveryLogEntry(  # the probe, a delivery of its own in the endpoint's log
            webhook_id=probe_id, endpoint_id=current.id, workspace_id=current.workspace_id,
            account_id="", event_type=EVENT_ENDPOINT_PROBE, event_id=probe_id, attempts=1,
            state="delivered" if ok else "failed", last_status=status, last_error=error,
            updated_at=rfc3339(now), attempt=record, body=body, occurred_at=answered.at,
        )  # fmt: skip
        await self._ports.publisher.log([entry])
        after = {"probes": n, "last_probe": answered}
        if ok:
            if self._ports.announcer is not None:  # before the write, as a disable is announced
                await self._ports.announcer.announce(enabled_record(current, reason="recovered"))
            after |= {"next_probe_at": None, "recovered_at": now}
            if self._scan is not None:  # its replay, queued by the next sweep
                rid = recovery_replay_id(current.id, recovery.disabled_at)
                after |= {"replay_id": rid, "replaying": True}
            await self._writer.update(
                current,
                status="active",
                disabled_reason=None,
                recovery=recovery.model_copy(update=after),
            )
            log.warning("endpoint_recovered", endpoint_id=current.id, probes=n)
            return
        wait = min(self.config.max_s, 2 * recovery.interval_s)
        # Probed long enough (``for_s``): no next probe, its owner activates it.
        end = now + wait > recovery.disabled_at + self.config.for_s
        after |= {"interval_s": wait, "next_probe_at": None if end else now + wait}
        await self._writer.update(current, recovery=recovery.model_copy(update=after))

    async def _replay(self, endpoint: EndpointRecord) -> None:
        """Queue what ``endpoint`` missed since it was disabled, then clear ``replaying``. A
        failure or a stop leaves it set: the next sweep, here or on the next owner, scans
        again under the same replay id; past ``replay_budget_s`` it notes where it stopped
        (``resume``) and the next sweep reads on from there."""
        recovery = endpoint.recovery
        assert recovery is not None and recovery.replay_id is not None and self._scan
        rid, since = recovery.replay_id, datetime.fromtimestamp(recovery.disabled_at, UTC)
        counts, created = [0, 0, 0], self._clock()

        async def note(state: ReplayState) -> None:
            record = progress_record(rid, endpoint, since, state, created, counts, recovery=True)
            if self._progress is not None:
                await self._progress(record)

        follower = asyncio.create_task(
            following(lambda: note("running"), PROGRESS_EVERY_S, lambda: False)
        )
        try:
            budget = time.monotonic() + self.replay_budget_s
            left = await self._scan.run(
                rid, endpoint, since, counts, start=recovery.resume, deadline=budget
            )
            follower.cancel()
            # Done: where webhook.replays ends now, past every record queued, cleared with
            # ``replaying`` in one write; each member's live deliveries wait until its own
            # consumption passes its partition's end (docs/architecture.md).
            ends = {} if left else await self._scan.ends()
            current = self._endpoints.get(endpoint.workspace_id, endpoint.id)
            if current is not None and current.recovery == recovery:
                after = {"resume": left, "replaying": bool(left), "replays_end": ends}
                await self._writer.update(current, recovery=recovery.model_copy(update=after))
            ended = "endpoint_recovery_replay_paused" if left else "endpoint_recovery_replayed"
            log.warning(ended, endpoint_id=endpoint.id, events=counts[0])
            with contextlib.suppress(Exception):  # a board that missed it reads it as stalled
                await note("running" if left else "done")
        except Exception as exc:
            log.error("endpoint_recovery_replay_failed", endpoint_id=endpoint.id, error=repr(exc))
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)


__all__ = ["PER_WORKSPACE", "Prober"]
