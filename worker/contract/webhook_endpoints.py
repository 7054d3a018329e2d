"""The record on the compacted ``webhook.endpoints`` topic (``EndpointRecord``) and its codec,
the webhook event types an endpoint subscribes to: what the front-end writes and the dispatcher
reads (docs/architecture.md, "Webhook fan-out"); the highest ``revision`` wins."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Final, Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field

from worker.contract.endpoint_ceilings import DESCRIPTION_MAX_CHARS_CEILING, URL_MAX_CHARS_CEILING
from worker.contract.messages import Identifier, TopicRecord, rfc3339

EVENT_STATUS_CHANGED: Final = "account.auth_status_changed"
EVENT_ERROR: Final = "account.auth_error"
#: Operational events (``worker.contract.operational_events``): about the workspace's endpoints.
EVENT_ENDPOINT_DISABLED: Final = "endpoint.disabled"
EVENT_ENDPOINT_ENABLED: Final = "endpoint.enabled"
#: Sent by the dispatcher to a disabled endpoint itself, never fanned out: is it back?
EVENT_ENDPOINT_PROBE: Final = "endpoint.probe"
EVENT_TYPES: Final = (
    EVENT_STATUS_CHANGED,
    EVENT_ERROR,
    EVENT_ENDPOINT_DISABLED,
    EVENT_ENDPOINT_ENABLED,
    EVENT_ENDPOINT_PROBE,
)

EventType = Literal[
    "account.auth_status_changed",
    "account.auth_error",
    "endpoint.disabled",
    "endpoint.enabled",
    "endpoint.probe",
]
EndpointStatus = Literal["active", "inactive", "disabled"]
#: The current secret and the previous one.
MAX_SIGNING_SECRETS: Final = 2
# The record accepts up to the ceilings; the configured (lower) limits apply to API input.
DescriptionText = Annotated[str, Field(max_length=DESCRIPTION_MAX_CHARS_CEILING)]
UrlText = Annotated[str, Field(min_length=1, max_length=URL_MAX_CHARS_CEILING)]
MAX_RATE_LIMIT: Final = 10_000
RateLimit = Annotated[int, Field(ge=1, le=MAX_RATE_LIMIT, strict=True)]
"""Svix's ``rateLimit``: attempts per second at most to the endpoint (per dispatcher process)."""


def now_rfc3339() -> str:
    return rfc3339(time.time())


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


class ProbeAnswer(BaseModel):
    """What the last probe of a disabled endpoint came to."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    at: str = Field(description="When the probe was sent (RFC 3339).")
    status: int | None = Field(default=None, description="The HTTP status it answered.")
    error: str | None = Field(
        default=None, max_length=200, description="Why no 2xx came back (`http_500`, `timeout`)."
    )


class Recovery(BaseModel):
    """The probing of an endpoint the dispatcher disabled (docs/architecture.md, "Endpoints
    that heal"): kept on the record so another dispatcher continues it and the portal shows it;
    kept after a recovery, so one that did not hold probes at a longer interval."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    disabled_at: float = Field(description="When the dispatcher disabled it (Unix seconds).")
    interval_s: float = Field(gt=0, description="The wait before the next probe.")
    next_probe_at: float | None = Field(
        default=None, description="When it is probed next (Unix seconds); null: no more probes."
    )
    probes: int = Field(default=0, ge=0, description="Probes sent since it was disabled.")
    last_probe: ProbeAnswer | None = None
    recovered_at: float | None = Field(
        default=None, description="When a probe last re-enabled it (Unix seconds)."
    )
    replay_id: str | None = Field(
        default=None,
        description="The replay of what it missed since `disabled_at`, started when a probe"
        " re-enabled it: followed at `GET .../replays/{replay_id}`.",
    )
    replaying: bool = Field(
        default=False,
        description="That replay is still being queued (a dispatcher that stopped meanwhile is"
        " followed by the next, under the same `replay_id`).",
    )
    resume: dict[str, int] = Field(
        default_factory=dict,
        description="Where that replay's scan stopped at its time budget (topic:partition to"
        " offset, one per partition of the topic): the next sweep reads on from there.",
    )
    replays_end: dict[int, int] = Field(
        default_factory=dict,
        description="Where each webhook.replays partition ended once that replay was queued"
        " (partition to offset): a live delivery to it of an account on a partition waits"
        " until its dispatcher has taken in that partition's records to there.",
    )


class EndpointRecord(TopicRecord):
    """The value on ``webhook.endpoints`` (key: ``id``). Secrets never leave it in clear."""

    type: Literal["webhook_endpoint"] = "webhook_endpoint"
    id: Identifier
    workspace_id: Identifier
    url: UrlText
    event_types: tuple[EventType, ...] | None = None
    description: DescriptionText | None = None
    rate_limit: RateLimit | None = None
    status: EndpointStatus = "active"
    disabled_reason: str | None = None
    auto_recover: bool = True
    """Probe it and re-enable it when the dispatcher disabled it (``Recovery``)."""
    recovery: Recovery | None = None
    created_at: str
    updated_at: str
    revision: int = Field(ge=1)
    secrets: tuple[StoredSecret, ...] = ()

    def subscribes(self, event_type: str) -> bool:
        return self.event_types is None or event_type in self.event_types

    @property
    def replaying(self) -> bool:
        """Re-enabled by a probe, its replay of what it missed still being queued (and its
        owner has not turned recovery off meanwhile)."""
        held = self.recovery
        return self.status == "active" and self.auto_recover and bool(held and held.replaying)

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


#: ``disabled_reason`` of an endpoint written before its quota check across replicas passed
#: (docs/architecture.md, "Endpoint creates and the quota").
PENDING: Final = "pending_create"


def is_pending(record: EndpointRecord) -> bool:
    """Whether ``record`` is a create whose quota check has not passed: never an endpoint."""
    return record.status == "inactive" and record.disabled_reason == PENDING


def is_active(endpoint: EndpointRecord | None) -> TypeGuard[EndpointRecord]:
    """Whether deliveries go out to ``endpoint``: it exists (not deleted) and is active."""
    return endpoint is not None and endpoint.status == "active"


def decode_endpoint(value: bytes) -> EndpointRecord:
    """Raises ``pydantic.ValidationError`` for anything that is not an endpoint record."""
    return EndpointRecord.model_validate_json(value)


__all__ = [
    "EVENT_ENDPOINT_DISABLED",
    "EVENT_ENDPOINT_ENABLED",
    "EVENT_ENDPOINT_PROBE",
    "EVENT_ERROR",
    "EVENT_STATUS_CHANGED",
    "EVENT_TYPES",
    "MAX_RATE_LIMIT",
    "MAX_SIGNING_SECRETS",
    "PENDING",
    "EndpointRecord",
    "EndpointStatus",
    "EventType",
    "ProbeAnswer",
    "RateLimit",
    "Recovery",
    "StoredSecret",
    "decode_endpoint",
    "is_active",
    "is_pending",
    "new_endpoint_id",
    "now_rfc3339",
]
