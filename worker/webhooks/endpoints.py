"""The endpoint registry every front-end and dispatcher keeps from the compacted endpoints topic
(its record: ``worker.contract.webhook_endpoints``); the highest ``revision`` wins, so a writer
reads its own write at once. Every lookup names a workspace (docs/architecture.md, "Webhook
fan-out")."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Final

from pydantic import ValidationError

from worker.contract.messages import valid_id
from worker.contract.webhook_endpoints import EndpointRecord, decode_endpoint
from worker.engine.tail import TopicTail
from worker.runtime.logs import get_logger

log = get_logger(__name__)

#: Endpoint ids the registry remembers as deleted (for a replay naming one, which then needs no
#: catch-up read); the oldest is forgotten first. Only ids by the id rule (≤ 128 characters) are
#: remembered: a tombstone's key is whatever its writer put there.
GONE_REMEMBERED: Final = 4096


class EndpointRegistry:
    """Every endpoint by id and by workspace, at the highest revision seen.

    ``apply`` takes a record from the topic or from the writer that just produced it; ``delete``
    a tombstone. Records older than what is held are ignored, so the order in which the writer
    and the tail deliver the same records does not matter.
    """

    def __init__(self, *, gone_remembered: int = GONE_REMEMBERED) -> None:
        self._by_id: dict[str, EndpointRecord] = {}
        self._by_workspace: dict[str, dict[str, EndpointRecord]] = {}
        # A writer's own deletions: endpoint id → the revision the deletion superseded.
        self._deleted: dict[str, int] = {}
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._gone_max = gone_remembered

    def apply(self, record: EndpointRecord) -> bool:
        """Hold ``record`` unless a newer revision (or a later deletion) is held already."""
        held = self._by_id.get(record.id)
        if held is not None and held.revision >= record.revision:
            return False
        if self._deleted.get(record.id, 0) >= record.revision:
            return False
        self._by_id[record.id] = record
        self._by_workspace.setdefault(record.workspace_id, {})[record.id] = record
        self._gone.pop(record.id, None)
        return True

    def delete(self, endpoint_id: str, *, revision: int | None = None) -> None:
        """Forget an endpoint. ``revision`` (the writer's own deletion) keeps older records
        replayed later by the tail from bringing it back; a tombstone read from the topic
        is final and clears that marker."""
        held = self._by_id.pop(endpoint_id, None)
        if held is not None:
            peers = self._by_workspace.get(held.workspace_id, {})
            peers.pop(endpoint_id, None)
            if not peers:
                self._by_workspace.pop(held.workspace_id, None)
        if revision is None:
            self._deleted.pop(endpoint_id, None)
        elif held is not None:
            self._deleted[endpoint_id] = revision
        if valid_id(endpoint_id):
            self._gone[endpoint_id] = None
            self._gone.move_to_end(endpoint_id)
            while len(self._gone) > self._gone_max:
                self._gone.popitem(last=False)

    def known(self, endpoint_id: str) -> bool:
        """Whether this registry has read anything of ``endpoint_id``: it holds it (in whatever
        workspace) or saw it deleted lately (the last ``GONE_REMEMBERED``). A lookup that finds
        nothing for a known id is final; for an unknown one the registry may be behind."""
        return endpoint_id in self._by_id or endpoint_id in self._gone

    def records(self) -> list[EndpointRecord]:
        """Every endpoint held (the dispatcher's probing looks for disabled ones)."""
        return list(self._by_id.values())

    def get(self, workspace_id: str, endpoint_id: str) -> EndpointRecord | None:
        """The endpoint if ``workspace_id`` owns it; ``None`` otherwise (missing or not yours)."""
        record = self._by_id.get(endpoint_id)
        if record is None or record.workspace_id != workspace_id:
            return None
        return record

    def count(self, workspace_id: str) -> int:
        """How many endpoints the workspace has (deleted ones are gone from the registry)."""
        return len(self._by_workspace.get(workspace_id, {}))

    def of_workspace(self, workspace_id: str) -> list[EndpointRecord]:
        """The workspace's endpoints, oldest first."""
        held = self._by_workspace.get(workspace_id, {}).values()
        return sorted(held, key=lambda r: (r.created_at, r.id))

    def workspace_of(self, endpoint_id: str) -> str | None:
        """The workspace that owns the endpoint. For the dispatcher's own bookkeeping (old-form
        delivery states name no owner per endpoint), never for answering a caller."""
        record = self._by_id.get(endpoint_id)
        return None if record is None else record.workspace_id

    def subscribers(self, workspace_id: str, event_type: str) -> list[EndpointRecord]:
        """Active endpoints of the workspace that take ``event_type``."""
        return [
            r
            for r in self._by_workspace.get(workspace_id, {}).values()
            if r.status == "active" and r.subscribes(event_type)
        ]


class EndpointsTail(TopicTail):
    """The registry kept current from ``webhook.endpoints`` (group-less, every partition)."""

    def __init__(self, consumer: Any, topic: str) -> None:
        super().__init__(consumer, topic, name="webhook-endpoints")
        self.registry = EndpointRegistry()
        #: (partition, offset) of the first record of each live endpoint this tail read: the
        #: order of creates within a partition (the front-end's endpoint quota).
        self.positions: dict[str, tuple[int, int]] = {}

    def handle(self, records: Iterable[Any]) -> None:
        for msg in records:
            if msg.value is None:
                if msg.key:
                    endpoint_id = msg.key.decode("utf-8", "replace")
                    self.positions.pop(endpoint_id, None)
                    self.registry.delete(endpoint_id)
                continue
            try:
                record = decode_endpoint(msg.value)
            except ValidationError:
                log.error("endpoint_record_undecodable", partition=msg.partition, offset=msg.offset)
                continue
            self.positions.setdefault(record.id, (msg.partition, msg.offset))
            self.registry.apply(record)


__all__ = ["GONE_REMEMBERED", "EndpointRegistry", "EndpointsTail"]
