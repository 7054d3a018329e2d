"""Per-workspace quotas and field limits of the webhook routes; a refusal names the quota. The
endpoint quota holds across replicas: a workspace's creates share one partition of the endpoints
topic, and a create is kept only when fewer than the quota precede it there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Final

from aiokafka.partitioner import murmur2

from worker.contract.catalogue import ServiceError
from worker.contract.webhook_endpoints import new_endpoint_id
from worker.runtime.admission import Admission, NoRoom, Share, TimeCharge
from worker.settings import Settings
from worker.webhooks.endpoints import EndpointRegistry

#: The ``quota`` label values of ``passkey_api_quota_refusals``.
ENDPOINTS: Final = "webhook_endpoints"
REPLAYS: Final = "webhook_replays"
REPLAY_CAPACITY: Final = "webhook_replay_capacity"
DELIVERY_SCANS: Final = "webhook_delivery_scans"
EVENT_SCANS: Final = "account_event_scans"
URL_LENGTH: Final = "webhook_url_length"
DESCRIPTION_LENGTH: Final = "webhook_description_length"
EVENT_TYPES_ITEMS: Final = "webhook_event_types_items"
QUOTAS: Final = (
    ENDPOINTS,
    REPLAYS,
    REPLAY_CAPACITY,
    DELIVERY_SCANS,
    EVENT_SCANS,
    URL_LENGTH,
    DESCRIPTION_LENGTH,
    EVENT_TYPES_ITEMS,
)

#: The catalogue's 429 row (a service extension: the contract shows no rate limits).
TOO_MANY: Final = "rate_limited"
#: The catalogue's 409 row of the endpoint quota (a service extension, like the contract's 409
#: ``workspace_account_quota_exceeded`` of accounts): a limit, not a fault, so never a 500.
ENDPOINT_QUOTA: Final = "webhook_endpoint_quota_exceeded"
#: ``Retry-After`` of a scan or read refused while the pool or the workspace's one slot is busy:
#: a scan ends within its time-out (3 s deliveries, 5 s per topic of an account read), usually
#: far sooner.
SCAN_RETRY_AFTER_S: Final = 1
#: The slot-seconds a workspace's scans and reads may spend: 10 s saved up covers a few
#: full-length reads in a row, so a person paging never meets it; past it a workspace earns a
#: quarter of a slot's time, so four workspaces looping on reads leave three slots to the rest.
SCAN_TIME: Final = TimeCharge(rate=0.25, burst_s=10.0)


def read_slots(name: str, capacity: int) -> Admission:
    """The slots of a scan or read: ``capacity`` in the process, one per workspace at a time,
    the seconds held charged to the workspace (``SCAN_TIME``), refused with
    ``SCAN_RETRY_AFTER_S``."""
    share = Share(capacity=capacity, per_owner=1)
    return Admission(name, share, time=SCAN_TIME, retry_after_s=SCAN_RETRY_AFTER_S)


class Refused(Exception):
    """A request beyond a quota: ``error`` is the answer, ``retry_after_s`` (when waiting
    can help) becomes ``Retry-After``, ``quota`` the metric's label."""

    def __init__(self, quota: str, error: ServiceError, retry_after_s: int | None = None) -> None:
        super().__init__(quota)
        self.quota = quota
        self.error = error
        self.retry_after_s = retry_after_s

    @classmethod
    def too_many(cls, quota: str, message: str, retry_after_s: int) -> Refused:
        """A 429 (``rate_limited``); ``message`` says which limit and when to retry."""
        return cls(quota, ServiceError.of(TOO_MANY, message), retry_after_s)


def busy(quota: str, what: str, exc: NoRoom) -> Refused:
    """The 429 of a scan or read the admission rule refused (``NoRoom``), with its
    ``Retry-After`` (docs/architecture.md, "Admission"); the message says which limit."""
    if exc.reason == "time":
        reason = f"this workspace's {what}s have used their share of read time for now"
    elif exc.reason == "share":
        reason = f"this workspace's last {what} (one at a time) is still being answered"
    else:
        reason = f"every {what} slot of this service is in use"
    message = f"Not now: {reason}; retry after the Retry-After seconds."
    return Refused.too_many(quota, message, exc.retry_after_s)


@dataclass(frozen=True, slots=True)
class EndpointLimits:
    """The configured limits of an endpoint create/update body."""

    url_max_chars: int
    description_max_chars: int
    event_types_max_items: int

    @classmethod
    def of(cls, settings: Settings) -> EndpointLimits:
        """From the ``WEBHOOK_``-prefixed settings of the same names."""
        return cls(**{f.name: getattr(settings, f"webhook_{f.name}") for f in fields(cls)})

    @classmethod
    def defaults(cls) -> EndpointLimits:
        """The settings' defaults, whatever the environment says (the published document)."""
        defaults = Settings.model_fields
        return cls(**{f.name: defaults[f"webhook_{f.name}"].default for f in fields(cls)})

    def check(
        self,
        *,
        url: str | None = None,
        description: str | None = None,
        event_types: Sequence[str] | None = None,
    ) -> None:
        """Raise ``Refused`` (400 ``invalid_request``) for the first field over its limit;
        ``None`` means "not sent". The message names the field and the limit, never the
        value (a URL may carry a token)."""
        if url is not None and len(url) > self.url_max_chars:
            raise _too_long(URL_LENGTH, f"url is longer than {self.url_max_chars} characters")
        if description is not None and len(description) > self.description_max_chars:
            raise _too_long(
                DESCRIPTION_LENGTH,
                f"description is longer than {self.description_max_chars} characters",
            )
        if event_types is not None and len(event_types) > self.event_types_max_items:
            raise _too_long(
                EVENT_TYPES_ITEMS,
                f"event_types has more than {self.event_types_max_items} entries",
            )


def _too_long(quota: str, what: str) -> Refused:
    return Refused(quota, ServiceError.of("invalid_request", f"Invalid request body: {what}."))


def partition_of(key: str, partitions: int) -> int:
    """The partition the producer's default partitioner picks for ``key`` (Kafka's murmur2)."""
    hashed: int = murmur2(key.encode())
    return (hashed & 0x7FFFFFFF) % partitions


#: Ids drawn at most for one create (about ``partitions`` are needed on average).
_MAX_DRAWS: Final = 100_000


def endpoint_id_on(partition: int, partitions: int) -> str:
    """A new endpoint id whose records land on ``partition`` (keyed by the id, as they are)."""
    for _ in range(_MAX_DRAWS):
        endpoint_id = new_endpoint_id()
        if partition_of(endpoint_id, partitions) == partition:
            return endpoint_id
    raise RuntimeError(f"no endpoint id for partition {partition} of {partitions}")


@dataclass
class EndpointQuota:
    """Endpoints per workspace: the registry's plus this replica's creates in flight (each
    counted once, by id), checked before a create; across replicas, ``kept`` after it. A new
    endpoint's id lands its records on the workspace's partition, so that partition's offsets
    are the one order of the workspace's creates, whichever replica wrote them."""

    registry: EndpointRegistry
    limit: int = 16
    positions: Mapping[str, tuple[int, int]] | None = None
    partitions: Callable[[], int] = lambda: 0
    _creating: dict[str, set[str]] = field(default_factory=dict)

    def new_id(self, workspace_id: str) -> str:
        """An id for the workspace's next endpoint, on the workspace's partition when known."""
        partitions = self.partitions()
        if self.positions is None or partitions < 1:
            return new_endpoint_id()
        return endpoint_id_on(partition_of(workspace_id, partitions), partitions)

    async def kept(self, workspace_id: str, endpoint_id: str, timeout_s: float) -> bool | None:
        """Whether fewer than ``limit`` of the workspace's live endpoints precede the written
        ``endpoint_id``; ``None`` when it was not read back within ``timeout_s``. Holds across
        replicas: once the tail has read this create it has read every earlier one of the
        workspace, so of any ``limit + 1`` kept, the last would have seen ``limit`` before it."""
        positions = self.positions
        if positions is None:
            return True
        deadline = time.monotonic() + timeout_s
        while (mine := positions.get(endpoint_id)) is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.005)
        before = 0
        for record in self.registry.of_workspace(workspace_id):
            at = positions.get(record.id)
            if record.id == endpoint_id or at is None:
                continue  # unread: written after this one (the tail has read past it)
            if at[0] != mine[0] or at[1] < mine[1]:
                before += 1
        return before < self.limit

    def refused(self) -> Refused:
        """The refusal of a create over the quota."""
        return Refused(
            ENDPOINTS,
            ServiceError.of(
                ENDPOINT_QUOTA,
                f"The workspace has reached its quota of {self.limit} webhook endpoints;"
                " delete one before creating another. Nothing was created.",
            ),
        )

    def held(self, workspace_id: str) -> int:
        creating = self._creating.get(workspace_id, set())
        unseen = sum(1 for i in creating if self.registry.get(workspace_id, i) is None)
        return self.registry.count(workspace_id) + unseen

    @contextlib.contextmanager
    def slot(self, workspace_id: str, endpoint_id: str) -> Iterator[None]:
        """Hold a place for ``endpoint_id`` while it is written, or raise ``Refused``."""
        if self.held(workspace_id) >= self.limit:
            raise self.refused()
        creating = self._creating.setdefault(workspace_id, set())
        creating.add(endpoint_id)
        try:
            yield
        finally:
            creating.discard(endpoint_id)
            if not creating:
                self._creating.pop(workspace_id, None)


__all__ = [
    "DELIVERY_SCANS",
    "ENDPOINTS",
    "ENDPOINT_QUOTA",
    "EVENT_SCANS",
    "QUOTAS",
    "REPLAYS",
    "REPLAY_CAPACITY",
    "SCAN_TIME",
    "TOO_MANY",
    "EndpointLimits",
    "EndpointQuota",
    "Refused",
    "busy",
]
