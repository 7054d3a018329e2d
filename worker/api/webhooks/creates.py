"""An endpoint create under the workspace's quota: checked on this replica, written pending
(inactive and marked ``PENDING``: no dispatcher delivers to it, the routes answer it as
missing), checked across replicas (``EndpointQuota.kept``), then activated or deleted; so no
endpoint is ever deliverable before its quota check passed. A pending record left behind (a
timed-out write) is deleted by the workspace's next create once ``STALE_S`` old
(docs/architecture.md, "Endpoint creates and the quota")."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from worker.api.webhooks.quotas import EndpointQuota
from worker.contract.catalogue import ServiceError
from worker.contract.webhook_endpoints import (
    PENDING,
    EndpointRecord,
    EventType,
    is_pending,
    now_rfc3339,
)
from worker.runtime.logs import get_logger
from worker.webhooks.endpoint_writes import EndpointStore

log = get_logger("worker.api.webhooks.routes")

#: Age past which a pending endpoint is no create in progress on any replica (a create takes at
#: most three store time-outs and a registry wait; the margin covers replicas' clock skew).
STALE_S: Final = 120.0
FAILURE: Final = "create_webhook_endpoint_failed"
NOT_WRITTEN: Final = (
    "The new endpoint could not be written in time; nothing was created. Retry shortly."
)
NOT_CONFIRMED: Final = (
    "The new endpoint could not be confirmed in time and was deleted; nothing was created."
    " Retry shortly."
)
UNCONFIRMED: Final = (
    "The new endpoint passed its checks but its activation was not confirmed in time; it may"
    " still appear. Read the webhook endpoints before retrying."
)


@dataclass(frozen=True, slots=True)
class NewEndpoint:
    """The fields of a create's body."""

    url: str
    event_types: tuple[EventType, ...] | None
    description: str | None
    rate_limit: int | None
    auto_recover: bool = True


async def create(
    store: EndpointStore,
    quota: EndpointQuota,
    workspace_id: str,
    new: NewEndpoint,
    *,
    wait_s: float,
) -> tuple[EndpointRecord, str]:
    """The active endpoint and its secret, or ``Refused`` (the quota) or the create's 500.
    This replica's check (registry + its creates in flight) comes before any write; the
    pending record's check across replicas before the one write a dispatcher delivers after."""
    await sweep(store, workspace_id)
    endpoint_id = quota.new_id(workspace_id)
    with quota.slot(workspace_id, endpoint_id):
        stamp = now_rfc3339()
        draft = EndpointRecord(
            id=endpoint_id,
            workspace_id=workspace_id,
            url=new.url,
            event_types=new.event_types,
            description=new.description,
            rate_limit=new.rate_limit,
            auto_recover=new.auto_recover,
            status="inactive",
            disabled_reason=PENDING,
            created_at=stamp,
            updated_at=stamp,
            revision=1,
        )
        try:
            pending, secret = await store.write_new(draft)
        except ServiceError:
            # It may still land (the producer keeps it): delete it behind it, same key and
            # partition; else the next create's sweep does.
            await _delete(store, draft, "write_timed_out")
            raise ServiceError.of(FAILURE, NOT_WRITTEN) from None
        kept = await quota.kept(workspace_id, endpoint_id, wait_s)
        if not kept:
            await _delete(store, pending, "over_quota" if kept is False else "unconfirmed")
            if kept is False:
                raise quota.refused()
            raise ServiceError.of(FAILURE, NOT_CONFIRMED)
    try:
        record = await store.set_status(pending, "active")  # clears the PENDING mark
    except ServiceError:
        raise ServiceError.of(FAILURE, UNCONFIRMED) from None
    return record, secret


async def sweep(store: EndpointStore, workspace_id: str) -> None:
    """Delete the workspace's pending endpoints older than ``STALE_S`` (none, usually); stops
    at the first delete that fails (the broker is away: the create will fail too)."""
    now = time.time()
    for record in store.registry.of_workspace(workspace_id):
        stale = is_pending(record) and now - _seconds(record.updated_at) > STALE_S
        if stale and not await _delete(store, record, "stale"):
            return


async def _delete(store: EndpointStore, record: EndpointRecord, why: str) -> bool:
    try:
        await store.delete(record)
    except ServiceError:
        log.warning("webhook_endpoint_pending_left", endpoint_id=record.id, reason=why)
        return False
    log.info(
        "webhook_endpoint_create_rolled_back",
        endpoint_id=record.id,
        workspace_id=record.workspace_id,
        reason=why,
    )
    return True


def _seconds(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0  # unreadable: as old as can be


__all__ = ["PENDING", "STALE_S", "NewEndpoint", "create", "is_pending", "sweep"]
