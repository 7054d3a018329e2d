"""A recovered endpoint's missed events before its live ones (docs/architecture.md, "Endpoints
that heal"): where a recovery replay's delivery is taken in, and whether a live head waits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from worker.contract.webhook_endpoints import EndpointRecord, is_active
from worker.dispatcher.delivery import Pending
from worker.webhooks.endpoints import EndpointRegistry

#: How often a live head held back behind a recovery's replay looks again.
RECHECK_S = 1.0


class MissedFirst:
    """``settling``: the pairs whose head is being attempted or settled (nothing is taken in
    ahead of it). ``replays_taken``: how far this member has taken a webhook.replays partition
    in (the loop's ``ConsumeLoop.completed``); ``None``: no live head waits for it."""

    def __init__(self, endpoints: EndpointRegistry) -> None:
        self._endpoints = endpoints
        self.settling: set[str] = set()
        self.replays_taken: Callable[[int], Awaitable[int | None]] | None = None

    @staticmethod
    def missed(endpoint: EndpointRecord, replay: str | None) -> bool:
        """Whether a delivery of ``replay`` is one of the endpoint's recovery replay."""
        recovery = endpoint.recovery
        return replay is not None and recovery is not None and replay == recovery.replay_id

    def replays_end(self, partition: int, key: str) -> int | None:
        """Where ``partition`` of webhook.replays ended when the pair's endpoint's recovery
        replay was queued (``None``: no recovery of it, or none to wait for here): the
        account's missed events are on that partition number. Asked before the pair is
        claimed; synchronous, so a pair of an endpoint never recovered costs no await."""
        if self.replays_taken is None:
            return None
        endpoint_id = key.partition("/")[0]
        workspace = self._endpoints.workspace_of(endpoint_id)
        endpoint = None if workspace is None else self._endpoints.get(workspace, endpoint_id)
        recovery = None if endpoint is None else endpoint.recovery
        return None if recovery is None else recovery.replays_end.get(partition)

    async def behind(self, partition: int, end: int) -> bool:
        """Whether this member has taken webhook.replays in short of ``end``
        (``replays_end``). Positions only grow: a no stays a no."""
        if self.replays_taken is None:
            return False
        taken = await self.replays_taken(partition)
        return taken is None or taken < end

    @staticmethod
    def waits(head: Pending, endpoint: EndpointRecord | None, behind: bool) -> bool:
        """Whether ``head`` is held back: live, its endpoint active and replaying what it
        missed, or this member ``behind`` on its records."""
        return head.replay is None and is_active(endpoint) and (endpoint.replaying or behind)


__all__ = ["RECHECK_S", "MissedFirst"]
