"""What the dispatcher takes from the process that builds it: the HTTP sender, the signer and
the one endpoint write it makes (disabling), as protocols, so the dispatcher's tests and
benchmarks can hand it their own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from worker.contract.webhook_endpoints import EndpointRecord, Recovery
from worker.dispatcher.delivery import DeliveryResult


class Sender(Protocol):
    """What the dispatcher needs of ``worker.dispatcher.sender.Sender``."""

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult: ...


Signer = Callable[[Sequence[str], str, int, bytes], dict[str, str]]
"""(secrets, webhook-id, timestamp, body) → the signed delivery's headers (``signing.headers``)."""


class EndpointWriter(Protocol):
    """Disables endpoints and reads their secrets (``EndpointStore``)."""

    async def disable(
        self, current: EndpointRecord, reason: str, recovery: Recovery | None = None
    ) -> EndpointRecord: ...

    def signing_secrets(self, record: EndpointRecord) -> list[str]: ...
