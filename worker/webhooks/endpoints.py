"""Webhook endpoints: the record on the compacted endpoints topic, the API's changes to it and
the registry every front-end and dispatcher keeps; the highest ``revision`` wins, so a writer
reads its own write at once. Every lookup names a workspace (docs/architecture.md, "Webhook
fan-out")."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.contract.endpoint_ceilings import DESCRIPTION_MAX_CHARS_CEILING, URL_MAX_CHARS_CEILING
from worker.contract.messages import ID_PATTERN, Identifier, valid_id
from worker.engine.tail import TopicTail
from worker.runtime.logs import get_logger

log = get_logger(__name__)

EVENT_STATUS_CHANGED: Final = "account.auth_status_changed"
EVENT_ERROR: Final = "account.auth_error"
#: Operational events (``worker.webhooks.operational``): about the workspace's endpoints.
EVENT_ENDPOINT_DISABLED: Final = "endpoint.disabled"
EVENT_ENDPOINT_ENABLED: Final = "endpoint.enabled"
EVENT_TYPES: Final = (
    EVENT_STATUS_CHANGED,
    EVENT_ERROR,
    EVENT_ENDPOINT_DISABLED,
    EVENT_ENDPOINT_ENABLED,
)

EventType = Literal[
    "account.auth_status_changed", "account.auth_error", "endpoint.disabled", "endpoint.enabled"
]
EndpointStatus = Literal["active", "inactive", "disabled"]
#: The current secret and the previous one.
MAX_SIGNING_SECRETS: Final = 2
# The record accepts up to the ceilings; the configured (lower) limits apply to API input.
DescriptionText = Annotated[str, Field(max_length=DESCRIPTION_MAX_CHARS_CEILING)]
UrlText = Annotated[str, Field(min_length=1, max_length=URL_MAX_CHARS_CEILING)]
#: Endpoint ids the registry remembers as deleted (for a replay naming one, which then needs no
#: catch-up read); the oldest is forgotten first. Only ids by the id rule (≤ 128 characters) are
#: remembered: a tombstone's key is whatever its writer put there.
GONE_REMEMBERED: Final = 4096
MAX_RATE_LIMIT: Final = 10_000
RateLimit = Annotated[int, Field(ge=1, le=MAX_RATE_LIMIT, strict=True)]
"""Svix's ``rateLimit``: attempts per second at most to the endpoint (per dispatcher process)."""


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_endpoint_id() -> str:
    """``ep_`` + 32 hex characters: matches the account-id rule (``ID_PATTERN``)."""
    return f"ep_{uuid.uuid4().hex}"


class StoredSecret(BaseModel):
    """One signing secret at rest: AES-GCM ciphertext; ``expires_at`` is set on the previous
    secret when a rotation starts its overlap window."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    ciphertext: str
    created_at: str
    expires_at: float | None = None


class EndpointRecord(BaseModel):
    """The value on ``webhook.endpoints`` (key: ``id``). Secrets never leave it in clear."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["webhook_endpoint"] = "webhook_endpoint"
    schema_version: Literal[1] = 1
    id: Identifier
    workspace_id: Identifier
    url: UrlText
    event_types: tuple[EventType, ...] | None = None
    description: DescriptionText | None = None
    rate_limit: RateLimit | None = None
    status: EndpointStatus = "active"
    disabled_reason: str | None = None
    created_at: str
    updated_at: str
    revision: int = Field(ge=1)
    secrets: tuple[StoredSecret, ...] = ()

    def subscribes(self, event_type: str) -> bool:
        return self.event_types is None or event_type in self.event_types

    def live_secrets(self, now: float) -> list[StoredSecret]:
        """The secrets that sign now, newest first: the current one and the previous one while
        inside its overlap window; never more than ``MAX_SIGNING_SECRETS``, whatever an older
        record holds."""
        live = [s for s in self.secrets if s.expires_at is None or s.expires_at > now]
        return live[:MAX_SIGNING_SECRETS]

    def trimmed(self, now: float) -> EndpointRecord:
        """This record holding only its ``live_secrets`` (itself when it already does)."""
        live = tuple(self.live_secrets(now))
        return self if live == self.secrets else self.model_copy(update={"secrets": live})

    def public(self) -> dict[str, Any]:
        """The API's view: every field but the secrets and the bookkeeping."""
        return self.model_dump(
            mode="json", exclude={"type", "schema_version", "secrets", "revision"}
        )

    def changed(self, **fields: Any) -> EndpointRecord:
        """The next revision with ``fields`` changed and ``updated_at`` stamped."""
        return self.model_copy(
            update={**fields, "revision": self.revision + 1, "updated_at": now_rfc3339()}
        )


def is_active(endpoint: EndpointRecord | None) -> TypeGuard[EndpointRecord]:
    """Whether deliveries go out to ``endpoint``: it exists (not deleted) and is active."""
    return endpoint is not None and endpoint.status == "active"


def decode_endpoint(value: bytes) -> EndpointRecord:
    """Raises ``pydantic.ValidationError`` for anything that is not an endpoint record."""
    return EndpointRecord.model_validate_json(value)


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A deleted endpoint, remembered at the revision its deletion superseded."""

    workspace_id: str
    revision: int


class EndpointRegistry:
    """Every endpoint by id and by workspace, at the highest revision seen.

    ``apply`` takes a record from the topic or from the writer that just produced it; ``delete``
    a tombstone. Records older than what is held are ignored, so the order in which the writer
    and the tail deliver the same records does not matter.
    """

    def __init__(self, *, gone_remembered: int = GONE_REMEMBERED) -> None:
        self._by_id: dict[str, EndpointRecord] = {}
        self._by_workspace: dict[str, dict[str, EndpointRecord]] = {}
        self._deleted: dict[str, Tombstone] = {}
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._gone_max = gone_remembered

    def __len__(self) -> int:
        return len(self._by_id)

    def apply(self, record: EndpointRecord) -> bool:
        """Hold ``record`` unless a newer revision (or a later deletion) is held already."""
        held = self._by_id.get(record.id)
        if held is not None and held.revision >= record.revision:
            return False
        gone = self._deleted.get(record.id)
        if gone is not None and gone.revision >= record.revision:
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
            self._deleted[endpoint_id] = Tombstone(held.workspace_id, revision)
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

    def __init__(
        self,
        consumer: Any,
        topic: str,
        *,
        registry: EndpointRegistry | None = None,
        on_change: Callable[[EndpointRecord | None, str], None] | None = None,
        idle_timeout_ms: int = 200,
    ) -> None:
        super().__init__(consumer, topic, name="webhook-endpoints", idle_timeout_ms=idle_timeout_ms)
        self.registry = registry or EndpointRegistry()
        self.undecodable = 0
        self._on_change = on_change
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
                    if self._on_change is not None:
                        self._on_change(None, endpoint_id)
                continue
            try:
                record = decode_endpoint(msg.value)
            except ValidationError:
                self.undecodable += 1
                log.error("endpoint_record_undecodable", partition=msg.partition, offset=msg.offset)
                continue
            self.positions.setdefault(record.id, (msg.partition, msg.offset))
            if self.registry.apply(record) and self._on_change is not None:
                self._on_change(record, record.id)


__all__ = [
    "EVENT_ERROR",
    "EVENT_STATUS_CHANGED",
    "EVENT_TYPES",
    "ID_PATTERN",
    "MAX_SIGNING_SECRETS",
    "EndpointRecord",
    "EndpointRegistry",
    "EndpointStatus",
    "EndpointsTail",
    "EventType",
    "StoredSecret",
    "decode_endpoint",
    "new_endpoint_id",
    "now_rfc3339",
]
