"""The provider seam: the two calls the worker needs and one exception, ``ProviderError``, already a
catalogued error, so the decision never sees HTTP."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from worker.contract.catalogue import ServiceError

__all__ = [
    "CallObserver",
    "CallOutcome",
    "ProviderAdapter",
    "ProviderAuthState",
    "ProviderError",
    "RetryObserver",
]

#: Outcome label of one logical provider call (retries included), for metrics:
#: ``ok``; ``error`` (the provider answered with a non-transient failure); ``unavailable``
#: (transient failures until attempts or the deadline ran out); ``circuit_open`` (not sent).
CallOutcome = Literal["ok", "error", "unavailable", "circuit_open"]

#: ``on_call(provider, operation, outcome, seconds)``: once per logical call, retries included.
CallObserver = Callable[[str, str, str, float], None]
#: ``on_retry(provider, operation)``: once per retry after a transient failure.
RetryObserver = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class ProviderAuthState:
    """The provider's view of the account's flow (``status`` and normalised ``auth_status``)."""

    status: str
    auth_status: str


class ProviderError(Exception):
    """A provider call failed, after the adapter's own retries; ``error`` is the catalogued error
    to answer with, ``transient`` whether trying again later may succeed."""

    def __init__(
        self, error: ServiceError, *, transient: bool, retry_after: float | None = None
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.transient = transient
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"ProviderError({self.error!r}, transient={self.transient})"


class ProviderAdapter(Protocol):
    """One provider, safe for concurrent use; no attempt or retry runs past ``deadline`` (a
    ``time.monotonic()`` value)."""

    name: str

    async def confirm_passkey(
        self, account_ref: str, *, idempotency_key: str, deadline: float | None = None
    ) -> ProviderAuthState:
        """Confirm the pending passkey challenge. The same ``idempotency_key`` (the command id)
        makes a re-sent confirm have at most one effect at the provider."""
        ...

    async def get_auth_state(
        self, account_ref: str, *, deadline: float | None = None
    ) -> ProviderAuthState:
        """Read the account's current flow state (polling fallback and crash re-drive)."""
        ...

    async def aclose(self) -> None:
        """Release what the adapter owns (never a shared HTTP client passed in)."""
        ...
