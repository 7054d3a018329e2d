"""The write side of webhook endpoints: each change is a new record, acknowledged before it is
applied and answered; a rotation keeps at most two secrets (docs/api.md, "Webhook
endpoints")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError

from worker.contract.catalogue import ServiceError
from worker.contract.webhook_endpoints import (
    EndpointRecord,
    EventType,
    Recovery,
    StoredSecret,
    new_endpoint_id,
    now_rfc3339,
)
from worker.engine.broker_health import BrokerHealth
from worker.engine.writes import send_retrying
from worker.runtime.logs import get_logger
from worker.webhooks.endpoints import EndpointRegistry
from worker.webhooks.secrets_box import SecretsBox
from worker.webhooks.signing import generate_secret

log = get_logger(__name__)

#: Opened (decrypted) secrets kept per process; past this the cache starts over.
OPENED_MAX = 10_000


@dataclass(eq=False, repr=False, kw_only=True)
class EndpointStore:
    """Creates, changes and deletes endpoints; reads go to ``registry`` directly."""

    producer: Any
    topic: str
    registry: EndpointRegistry
    cipher: SecretsBox
    timeout_s: float = 5.0
    overlap_s: float = 86_400.0
    clock: Callable[[], float] = time.time
    health: BrokerHealth = field(default_factory=BrokerHealth)

    def __post_init__(self) -> None:
        self._opened: dict[tuple[str, str], str] = {}

    async def create(
        self,
        workspace_id: str,
        *,
        url: str,
        event_types: tuple[EventType, ...] | None,
        description: str | None,
        endpoint_id: str | None = None,
        rate_limit: int | None = None,
        auto_recover: bool = True,
    ) -> tuple[EndpointRecord, str]:
        """A new active endpoint and its first secret (in clear, for the response only);
        ``endpoint_id`` when the caller chose it (a fresh ``new_endpoint_id()``)."""
        stamp = now_rfc3339()
        draft = EndpointRecord(
            id=endpoint_id or new_endpoint_id(),
            workspace_id=workspace_id,
            url=url,
            event_types=event_types,
            description=description,
            rate_limit=rate_limit,
            auto_recover=auto_recover,
            created_at=stamp,
            updated_at=stamp,
            revision=1,
        )
        return await self.write_new(draft)

    async def write_new(self, draft: EndpointRecord) -> tuple[EndpointRecord, str]:
        """``draft`` (a new endpoint, any status, no secret yet) written as its first
        revision with a first secret sealed onto it; the secret in clear, for the answer."""
        secret = generate_secret()
        sealed = self._seal(draft.id, secret, draft.created_at)
        record = draft.model_copy(update={"secrets": (sealed,)})
        return await self._write(record, "create_webhook_endpoint_failed"), secret

    async def update(self, current: EndpointRecord, **fields: Any) -> EndpointRecord:
        """PATCH: any of url, event_types, description, rate_limit, auto_recover; the
        dispatcher's probing writes (``recovery``, ``status``) too."""
        if not fields:
            return current
        return await self._write(current.changed(**fields), "update_webhook_endpoint_failed")

    async def set_status(self, current: EndpointRecord, status: str) -> EndpointRecord:
        """activate / deactivate; either clears a dispatcher's disable and its probing."""
        code = (
            "deactivate_webhook_endpoint_failed"
            if status == "inactive"
            else "update_webhook_endpoint_failed"
        )
        if current.status == status:
            return current
        record = current.changed(status=status, disabled_reason=None, recovery=None)
        return await self._write(record, code)

    async def disable(
        self, current: EndpointRecord, reason: str, recovery: Recovery | None = None
    ) -> EndpointRecord:
        """Stop deliveries to an endpoint that is gone (410) or has failed continuously,
        with its probing's start; ``activate`` or a probe answered 2xx undoes it."""
        record = current.changed(status="disabled", disabled_reason=reason, recovery=recovery)
        return await self._write(record, "update_webhook_endpoint_failed")

    async def rotate(self, current: EndpointRecord) -> tuple[EndpointRecord, str]:
        """A new secret; the current one keeps signing beside it for ``overlap_s`` more (or
        less, when it was already expiring), and every older one stops signing now."""
        now = self.clock()
        secret = generate_secret()
        stamp = now_rfc3339()
        previous: tuple[StoredSecret, ...] = ()
        live = current.live_secrets(now)
        if live and self.overlap_s > 0:
            until = now + self.overlap_s
            held = live[0].expires_at
            previous = (live[0].model_copy(update={"expires_at": min(until, held or until)}),)
        record = current.changed(secrets=(self._seal(current.id, secret, stamp), *previous))
        return await self._write(record, "update_webhook_endpoint_failed"), secret

    async def expire_previous(self, current: EndpointRecord) -> EndpointRecord:
        """Only the current secret signs from now on; nothing is written when it is the
        only one held already."""
        live = current.live_secrets(self.clock())
        if len(current.secrets) <= 1 or not live:
            return current
        record = current.changed(secrets=(live[0],))
        return await self._write(record, "update_webhook_endpoint_failed")

    async def delete(self, current: EndpointRecord) -> None:
        await self._send(current.id, None, "delete_webhook_endpoint_failed")
        self.registry.delete(current.id, revision=current.revision + 1)

    def signing_secrets(self, record: EndpointRecord) -> list[str]:
        """The secrets in clear that sign a delivery now, newest first. Each ciphertext is
        opened once per process: the dispatcher signs every attempt with them."""
        opened = []
        for sealed in record.live_secrets(self.clock()):
            key = (record.id, sealed.ciphertext)
            secret = self._opened.get(key)
            if secret is None:
                secret = self.cipher.decrypt(sealed.ciphertext, record.id.encode())
                if len(self._opened) >= OPENED_MAX:
                    self._opened.clear()
                self._opened[key] = secret
            opened.append(secret)
        return opened

    def _seal(self, endpoint_id: str, secret: str, stamp: str) -> StoredSecret:
        return StoredSecret(
            ciphertext=self.cipher.encrypt(secret, endpoint_id.encode()), created_at=stamp
        )

    async def _write(self, record: EndpointRecord, failure_code: str) -> EndpointRecord:
        """Produce ``record`` trimmed to its live secrets, apply it here, and return it."""
        record = record.trimmed(self.clock())
        await self._send(record.id, record.model_dump_json().encode(), failure_code)
        self.registry.apply(record)
        return record

    async def _send(self, endpoint_id: str, value: bytes | None, failure_code: str) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await send_retrying(
                    self.producer, self.health, self.topic, value, key=endpoint_id.encode()
                )
        except (KafkaError, TimeoutError) as exc:
            log.error("endpoint_write_failed", endpoint_id=endpoint_id, error=repr(exc))
            raise ServiceError.of(failure_code) from exc
