"""Each endpoint's share of the dispatcher (attempts in flight, rate, back-off) and each
workspace's, in memory per process (docs/architecture.md, "Webhook fan-out"). A workspace's
attempts in flight are its connections of the dispatcher's pool, taken through the one
admission rule ("Admission"): workspaces at their share leave a reserve to the others, and no
attempt waits in the HTTP client for the pool as a whole. Admitting an attempt also names its
workspace to its DNS lookup (``lookup.LOOKUP_WORKSPACE``). An endpoint's entry lives while it
holds something (``EndpointGate._drop_if_idle``, ``_sweep``)."""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from worker.dispatcher.metrics import WebhookMetrics
from worker.runtime.admission import Admission as SlotPool
from worker.runtime.admission import Share, Slot
from worker.runtime.logs import get_logger
from worker.webhooks.lookup import LOOKUP_WORKSPACE

log = get_logger(__name__)

DeferReason = Literal["capacity", "backoff", "rate"]
Waker = Callable[[int, str, float], bool]
"""(partition, pair key, at) → whether the pair was made due at ``at`` (``DeliveryStore.wake``)."""

#: How long a woken pair keeps the slot it was woken for before another may be woken.
WAKE_HOLD_S = 2.0
#: The longest fallback wait of a queued pair.
MAX_PARK_S = 3600.0
#: Endpoint entries the gate may hold before it first sweeps out those it need not keep; a
#: sweep happens when the entries double since the last one (``EndpointGate._sweep``).
SWEEP_FLOOR = 64


@dataclass(frozen=True, slots=True)
class GateConfig:
    """``max_in_flight``: attempts one endpoint may have under way at once (per process);
    ``workspace_max_in_flight``: all the endpoints of one workspace together, within its share
    of ``max_connections`` (the HTTP pool). ``backoff_after``: failed attempts in a row that
    make an endpoint back off. ``park_s``: the fallback wait of the first pair in line (a wake
    normally comes first); pairs further back wait proportionally longer."""

    max_in_flight: int = 32
    workspace_max_in_flight: int = 64
    max_connections: int = 256
    backoff_after: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    park_s: float = 30.0

    def connection_share(self) -> Share:
        """The rule's numbers for the dispatcher's connections: ``Share.split`` of
        ``max_connections`` over four workspaces (a quarter kept for workspaces holding none),
        a workspace's share at most ``workspace_max_in_flight``. Four workspaces at their
        share (48 each of 256 by default) leave 64 connections to every other workspace,
        whose first attempt is always admitted while one is free."""
        split = Share.split(self.max_connections, owners=4)
        return Share.capped(
            self.max_connections, min(self.workspace_max_in_flight, split.per_owner)
        )

    def backoff(self, failures: int) -> float:
        """The pause after ``failures`` failed attempts in a row (``>= backoff_after``)."""
        doublings = min(max(failures - self.backoff_after, 0), 32)
        return min(self.backoff_max_s, self.backoff_base_s * 2.0**doublings)


@dataclass(frozen=True, slots=True)
class Admission:
    """May the pair attempt now? If not, when to look again, and why."""

    admitted: bool
    until: float = 0.0
    reason: DeferReason | None = None


@dataclass(slots=True)
class _Endpoint:
    endpoint_id: str = ""
    revision: int = 0
    workspace: str = ""
    held: list[Slot] = field(default_factory=list)
    failures: int = 0
    failing_since: float | None = None
    blocked_until: float = 0.0
    rate_limit: int | None = None
    tokens: float = 0.0
    refilled_at: float = 0.0
    # The line: pairs not yet woken, first come first (key -> partition). A woken pair leaves
    # it for ``woken`` (key -> (until, partition)), and comes back to its front when its wake
    # runs out or the slot it was woken for was taken: each wake is at the line's front, so
    # neither costs a walk past the pairs woken before it.
    waiters: OrderedDict[str, int] = field(default_factory=OrderedDict)
    woken: dict[str, tuple[float, int]] = field(default_factory=dict)
    wakes_end: float = math.inf
    """No wake runs out before this (the earliest ``until`` of ``woken``, or earlier)."""

    @property
    def in_flight(self) -> int:
        """Attempts under way: each holds one connection slot of its workspace."""
        return len(self.held)

    @property
    def backing_off(self) -> bool:
        return self.blocked_until > 0.0

    def at_rest(self, now: float) -> bool:
        """Nothing here a fresh entry would not have: no attempt under way, no pair in line
        or woken, no failures (so no back-off and no failing-since), and a full rate-limit
        bucket."""
        if self.held or self.waiters or self.woken or self.failures or self.blocked_until > 0.0:
            return False
        if self.rate_limit is None:
            return True
        return self.tokens + (now - self.refilled_at) * self.rate_limit >= self.rate_limit


_AT_REST = _Endpoint()
"""What the gate knows of an endpoint it holds no entry for (read only)."""


class EndpointGate:
    """The per-endpoint admission of attempts, in one dispatcher process."""

    def __init__(
        self,
        config: GateConfig,
        *,
        wake: Waker,
        metrics: WebhookMetrics | None = None,
        rng: random.Random | None = None,
        known: Callable[[str], bool] | None = None,
    ) -> None:
        """``known``: whether an endpoint id is still in the registry (``None``: all are);
        a deleted endpoint's entry goes once no attempt of it is under way."""
        self.config = config
        self._wake = wake
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._known = known
        self._endpoints: dict[str, _Endpoint] = {}
        self._backing_off = 0
        self._connections = SlotPool("webhook connections", config.connection_share())
        # Each workspace's endpoints that had pairs put in line (pruned once their line is
        # empty, when a release looks): a release wakes other endpoints' lines from these.
        self._workspace_endpoints: dict[str, set[str]] = {}
        # Each workspace's endpoints that were given a wake (those still holding one are what
        # ``_workspace_free`` counts): a few, not every endpoint of a big workspace.
        self._waking: dict[str, set[str]] = {}
        self._sweep_at = SWEEP_FLOOR

    def connections(self, workspace_id: str) -> int:
        """Connection slots the workspace's attempts hold now."""
        return self._connections.held(workspace_id)

    def waiting(self, endpoint_id: str) -> int:
        """Pairs in the endpoint's line, those woken and not yet come included."""
        e = self._endpoints.get(endpoint_id, _AT_REST)
        return len(e.waiters) + len(e.woken)

    def failing_since(self, endpoint_id: str) -> float | None:
        """Since when every attempt to the endpoint failed (in this process), or None."""
        return self._endpoints.get(endpoint_id, _AT_REST).failing_since

    def admit(
        self,
        endpoint_id: str,
        *,
        revision: int,
        rate_limit: int | None,
        partition: int,
        key: str,
        now: float,
        workspace_id: str = "",
    ) -> Admission:
        """Take a slot of the endpoint (and of its workspace) for the pair ``key`` (the caller
        then must ``release`` it), or queue the pair and say until when it waits.

        An admitted attempt's DNS lookup counts against ``workspace_id``'s threads of the
        resolver: the caller's task (which makes the attempt) carries it from here on."""
        e = self._of(endpoint_id, revision, now)
        e.rate_limit = rate_limit
        if e.workspace != workspace_id:
            self._workspace_endpoints.get(e.workspace, set()).discard(endpoint_id)
            self._waking.get(e.workspace, set()).discard(endpoint_id)
            e.workspace = workspace_id
            if e.waiters or e.woken:
                self._workspace_endpoints.setdefault(workspace_id, set()).add(endpoint_id)
            if e.woken:
                self._waking.setdefault(workspace_id, set()).add(endpoint_id)
        was_woken = e.woken.pop(key, None) is not None
        reason, ready_at = self._refusal(e, key, now, was_woken)
        if reason is None:
            e.waiters.pop(key, None)
            e.held.append(self._connections.take(e.workspace))  # room checked (_refusal)
            self._wake_next(e, now)
            LOOKUP_WORKSPACE.set(e.workspace)
            return Admission(True)
        return self._line(e, key, partition, now, reason, ready_at, was_woken=was_woken)

    def line_up(
        self, endpoint_id: str, revision: int, workspace: str, partition: int, key: str, now: float
    ) -> float | None:
        """Put a new pair of an endpoint with no slot for it (its attempts and woken pairs at
        its cap or its workspace's, or others in line first) in line as ``admit`` would, and
        say until when it waits; ``None``: ``admit`` decides (it may have room, or its entry
        is not as ``admit`` leaves it). The pair is woken in turn, no follow-up asks first."""
        e = self._endpoints.get(endpoint_id)
        if e is None or (e.revision, e.workspace) != (revision, workspace):
            return None
        if key in e.woken or now < e.blocked_until:
            return None
        self._expire_wakes(e, now)
        if e.in_flight + len(e.woken) < self._cap(e) and self._workspace_free(e, now) > 0:
            if key in e.waiters or not e.waiters:
                return None
            self._wake_next(e, now)  # others wait and there is room: they go first
        return self._line(e, key, partition, now, "capacity", None, was_woken=False).until

    def _line(
        self,
        e: _Endpoint,
        key: str,
        partition: int,
        now: float,
        reason: DeferReason,
        ready_at: float | None,
        *,
        was_woken: bool,
    ) -> Admission:
        """The pair waits in the endpoint's line: until when, and why."""
        endpoint_id = e.endpoint_id
        if was_woken:
            # It was woken for a slot someone else took: first in line again.
            e.waiters[key] = partition
            e.waiters.move_to_end(key, last=False)
        elif key not in e.waiters:
            e.waiters[key] = partition
        self._workspace_endpoints.setdefault(e.workspace, set()).add(endpoint_id)
        if self._metrics is not None:
            self._metrics.child(self._metrics.deferrals, reason).inc()
        if ready_at is not None and next(iter(e.waiters)) == key and (was_woken or not e.woken):
            return Admission(False, ready_at, reason)
        return Admission(False, now + self._park(e), reason)

    def _park(self, e: _Endpoint) -> float:
        """The fallback wait of a queued pair: longer the further back in line it is (a wake
        comes in turn), so a long line does not come back all at once."""
        line = (len(e.waiters) + len(e.woken)) / max(self._cap(e), 1)
        return min(MAX_PARK_S, self.config.park_s * (1.0 + line)) * self._rng.uniform(1.0, 1.5)

    def _refusal(
        self, e: _Endpoint, key: str, now: float, was_woken: bool
    ) -> tuple[DeferReason | None, float | None]:
        """Why the endpoint has no room for ``key`` now (None: it has), and when it will."""
        if now < e.blocked_until:
            return "backoff", e.blocked_until
        self._expire_wakes(e, now)
        if e.in_flight + len(e.woken) >= self._cap(e) or self._workspace_free(e, now) <= 0:
            return "capacity", None
        if not was_woken and key not in e.waiters and e.waiters:
            # Others wait already and there is room: they go first (woken now), and this one
            # queues behind them.
            self._wake_next(e, now)
            return "capacity", None
        if self._pool_room(e.workspace) <= 0:
            # The connections free are the reserve of workspaces holding none (or there are
            # none): no release of this workspace's frees one, so it looks again shortly.
            return "capacity", now + self._connections.retry_after_s
        if e.rate_limit is not None:
            self._refill(e, now)
            if e.tokens < 1.0:
                return "rate", now + (1.0 - e.tokens) / e.rate_limit
            e.tokens -= 1.0
        return None, None

    def _refill(self, e: _Endpoint, now: float) -> None:
        assert e.rate_limit is not None
        e.tokens = min(float(e.rate_limit), e.tokens + (now - e.refilled_at) * e.rate_limit)
        e.refilled_at = now

    def _cap(self, e: _Endpoint) -> int:
        return 1 if e.backing_off else self.config.max_in_flight

    def _workspace_free(self, e: _Endpoint, now: float) -> int:
        """Slots the endpoint's workspace has left of its share: its attempts under way and
        its woken pairs (at any endpoint of it; expired wakes dropped on the way) count
        against it. Only the endpoints given a wake are looked at, at most the share of them:
        the cost does not grow with the workspace's endpoints."""
        waking = self._waking.get(e.workspace, set())
        woken = 0
        for endpoint_id in list(waking):
            x = self._endpoints.get(endpoint_id)
            if x is not None and x.workspace == e.workspace:
                self._expire_wakes(x, now)
                woken += len(x.woken)
            if x is None or x.workspace != e.workspace or not x.woken:
                waking.discard(endpoint_id)
        used = self._connections.held(e.workspace) + woken
        return self._connections.share.per_owner - used

    def _pool_room(self, workspace: str) -> int:
        """Connection slots the rule would give ``workspace`` now, one after another (its share
        aside): a workspace holding none may take its first from the reserve."""
        share, in_use = self._connections.share, self._connections.in_use
        beyond = max(0, share.capacity - in_use - share.reserve)
        if self._connections.held(workspace) == 0 and in_use < share.capacity:
            return max(1, beyond)
        return beyond

    def release(
        self,
        endpoint_id: str,
        *,
        ok: bool | None,
        now: float,
        retry_after_s: float | None = None,
    ) -> None:
        """An admitted attempt ended: ``ok`` True (2xx), False (failed), None (not made)."""
        e = self._endpoints.get(endpoint_id)
        if e is None:
            return
        if e.held:
            e.held.pop().release()
        if ok:
            if e.backing_off:
                log.info("endpoint_recovered", endpoint_id=endpoint_id, failures=e.failures)
            self._clear_failures(e)
        elif ok is False:
            e.failures += 1
            if e.failing_since is None:
                e.failing_since = now
            pause = 0.0
            if e.failures >= self.config.backoff_after:
                pause = self.config.backoff(e.failures)
            if retry_after_s is not None:
                pause = max(pause, min(retry_after_s, self.config.backoff_max_s))
            if pause > 0.0:
                if not e.backing_off:
                    log.warning(
                        "endpoint_backing_off",
                        endpoint_id=endpoint_id,
                        failures=e.failures,
                        pause_s=round(pause, 3),
                    )
                    self._set_backing_off(+1)
                e.blocked_until = max(e.blocked_until, now + pause)
        self._wake_next(e, now)
        # The slot freed is the workspace's too: its other endpoints' lines may go on, those
        # with a pair not yet woken, until it has no room left (the rest are not looked at: a
        # release costs the same in a workspace of a thousand endpoints as in one of two).
        lined = self._workspace_endpoints.get(e.workspace)
        room = self._workspace_free(e, now)  # its expired wakes dropped first
        if lined and room > 0:
            for other in sorted(lined):
                x = self._endpoints.get(other)
                if x is None or x.workspace != e.workspace or not (x.waiters or x.woken):
                    lined.discard(other)  # its line is empty: not looked at again
                    continue
                if room <= 0 or self._pool_room(e.workspace) <= 0:
                    break
                if other != endpoint_id and x.waiters:
                    self._wake_next(x, now)
                    room = self._workspace_free(e, now)
        self._drop_if_idle(endpoint_id, now)

    def forget(self, endpoint_id: str, key: str, now: float) -> None:
        """The pair has nothing to attempt any more: it leaves the line (and passes on a wake
        it was given)."""
        e = self._endpoints.get(endpoint_id)
        if e is None:
            return
        e.waiters.pop(key, None)
        if e.woken.pop(key, None) is not None:
            self._wake_next(e, now)
        self._drop_if_idle(endpoint_id, now)

    def _of(self, endpoint_id: str, revision: int, now: float) -> _Endpoint:
        e = self._endpoints.get(endpoint_id)
        if e is None:
            if len(self._endpoints) >= self._sweep_at:
                self._sweep(now)
            e = self._endpoints[endpoint_id] = _Endpoint(endpoint_id, revision)
        elif revision > e.revision:
            # A changed endpoint (a new URL, re-activated): its failures are history.
            e.revision = revision
            self._clear_failures(e)
        return e

    def _clear_failures(self, e: _Endpoint) -> None:
        if e.backing_off:
            self._set_backing_off(-1)
        e.failures = 0
        e.failing_since = None
        e.blocked_until = 0.0

    def _drop_if_idle(self, endpoint_id: str, now: float) -> None:
        """Forget the endpoint's entry when keeping it changes nothing (``at_rest``), or when
        the endpoint is deleted and no attempt of it is under way (its pairs' follow-ups find
        it gone and fail their heads without the gate)."""
        e = self._endpoints.get(endpoint_id)
        if e is None:
            return
        if not e.at_rest(now) and (e.in_flight or self._known is None or self._known(endpoint_id)):
            return
        del self._endpoints[endpoint_id]
        if e.backing_off:
            self._set_backing_off(-1)
        self._waking.get(e.workspace, set()).discard(endpoint_id)
        peers = self._workspace_endpoints.get(e.workspace)
        if peers is not None:
            peers.discard(endpoint_id)
            if not peers:
                del self._workspace_endpoints[e.workspace]
                self._waking.pop(e.workspace, None)

    def _sweep(self, now: float) -> None:
        """Drop every entry ``_drop_if_idle`` would; the next sweep comes when what is left
        has doubled (at least ``SWEEP_FLOOR``), so entries stay within twice those of
        endpoints in the registry or busy, at amortised constant cost per new entry."""
        for endpoint_id in list(self._endpoints):
            self._drop_if_idle(endpoint_id, now)
        self._sweep_at = max(SWEEP_FLOOR, 2 * len(self._endpoints))

    def _wake_next(self, e: _Endpoint, now: float) -> None:
        """Wake the first waiting pairs for the room the endpoint has (each woken pair holds
        its slot until it comes, at most ``WAKE_HOLD_S``): now, or when a pause or the next
        rate-limit token ends."""
        self._expire_wakes(e, now)  # first: a pair whose wake ran out is in line again
        if not e.waiters:
            return
        free = self._cap(e) - e.in_flight - len(e.woken)
        if free <= 0:
            return  # a busy endpoint's every admit and release: its workspace not looked at
        at = max(now, e.blocked_until)
        free = min(free, self._workspace_free(e, now), self._pool_room(e.workspace))
        if e.rate_limit is not None:
            self._refill(e, now)
            if e.tokens < 1.0:
                at = max(at, now + (1.0 - e.tokens) / e.rate_limit)
                free = min(free, 1)
            else:
                free = min(free, int(e.tokens))
        while free > 0 and e.waiters:
            key, partition = e.waiters.popitem(last=False)
            if self._wake(partition, key, at):  # else gone from this process: out of line
                until = at + WAKE_HOLD_S
                e.woken[key] = (until, partition)
                e.wakes_end = min(e.wakes_end, until)
                self._waking.setdefault(e.workspace, set()).add(e.endpoint_id)
                free -= 1

    def _expire_wakes(self, e: _Endpoint, now: float) -> None:
        """Wakes that ran out give their slots back; their pairs are first in line again."""
        if now < e.wakes_end:
            return
        ended = [(k, partition) for k, (until, partition) in e.woken.items() if until <= now]
        for key, partition in reversed(ended):
            del e.woken[key]
            e.waiters[key] = partition
            e.waiters.move_to_end(key, last=False)
        e.wakes_end = min((until for until, _ in e.woken.values()), default=math.inf)

    def _set_backing_off(self, delta: int) -> None:
        self._backing_off += delta
        if self._metrics is not None:
            self._metrics.endpoints_backing_off.set(self._backing_off)


__all__ = ["Admission", "DeferReason", "EndpointGate", "GateConfig", "Waker"]
