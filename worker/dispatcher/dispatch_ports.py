"""What the dispatcher and its prober take from the process that builds them: the endpoints
registry, the endpoint writes they make (disabling, probing), the HTTP sender, the signer, the
publisher and the announcer, held once (``Ports``) so tests and benchmarks can hand their own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from worker.contract.webhook_endpoints import EndpointRecord, Recovery
from worker.dispatcher.delivery import DeliveryResult
from worker.dispatcher.publish import DeliveryPublisher
from worker.webhooks.announcer import Announcer
from worker.webhooks.endpoints import EndpointRegistry


class Sender(Protocol):
    """What the dispatcher needs of ``worker.dispatcher.sender.Sender``."""

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult: ...


Signer = Callable[[Sequence[str], str, int, bytes], dict[str, str]]
"""(secrets, webhook-id, timestamp, body) → the signed delivery's headers (``signing.headers``)."""


class EndpointWriter(Protocol):
    """Disables endpoints, writes their probing and reads their secrets (``EndpointStore``)."""

    async def disable(
        self, current: EndpointRecord, reason: str, recovery: Recovery | None = None
    ) -> EndpointRecord: ...

    async def update(self, current: EndpointRecord, **fields: Any) -> EndpointRecord: ...

    def signing_secrets(self, record: EndpointRecord) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class Ports:
    """The collaborators ``Dispatcher`` and ``Prober`` share, built once by the process."""

    endpoints: EndpointRegistry
    writer: EndpointWriter
    sender: Sender
    sign: Signer
    publisher: DeliveryPublisher
    announcer: Announcer | None = None
