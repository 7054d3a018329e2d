"""What the dispatcher takes from the process that builds it: the HTTP sender, the signer and
the one endpoint write it makes (disabling), as protocols, so the dispatcher's tests and
benchmarks can hand it their own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from worker.contract.webhook_endpoints import EndpointRecord
from worker.dispatcher.delivery import DeliveryResult
from worker.dispatcher.disabling import Disabler


class Sender(Protocol):
    """What the dispatcher needs of ``worker.dispatcher.sender.Sender``."""

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult: ...


class Signer(Protocol):
    def __call__(
        self, secrets: Sequence[str], webhook_id: str, timestamp: int, body: bytes
    ) -> dict[str, str]: ...


class EndpointWriter(Disabler, Protocol):
    """Disables endpoints and reads their secrets (``EndpointStore``)."""

    def signing_secrets(self, record: EndpointRecord) -> list[str]: ...
