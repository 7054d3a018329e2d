"""Bounded retries of provider calls: backoff with full jitter (a fleet that failed together does
not retry together), ``Retry-After`` honoured up to a bound, nothing past the caller's deadline."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from worker.auth.provider.base import CallObserver, CallOutcome, ProviderError, RetryObserver
from worker.auth.provider.breaker import CircuitBreaker, CircuitOpenError
from worker.auth.provider.errors import map_upstream_failure

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["RetryPolicy", "call_with_retries"]

T = TypeVar("T")

_RNG = random.Random()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many attempts, and how long between them; a ``Retry-After`` over
    ``retry_after_max_s`` (default: the backoff ceiling) ends the retries instead."""

    max_attempts: int = 4
    backoff_base_s: float = 0.05
    backoff_max_s: float = 2.0
    retry_after_max_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.backoff_base_s < 0 or self.backoff_max_s < 0:
            raise ValueError("max_attempts must be >= 1 and backoff times >= 0")

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        """The policy of ``PROVIDER_MAX_ATTEMPTS`` / ``PROVIDER_BACKOFF_*``: the one place the
        settings become a policy (``HttpProviderAdapter.from_settings`` uses it)."""
        return cls(
            max_attempts=settings.provider_max_attempts,
            backoff_base_s=settings.provider_backoff_base_s,
            backoff_max_s=settings.provider_backoff_max_s,
        )

    def delay_s(self, retry: int, *, retry_after: float | None, rng: random.Random) -> float | None:
        """Seconds to sleep before retry number ``retry`` (1-based); None: do not retry."""
        if retry_after is not None:
            cap = self.backoff_max_s if self.retry_after_max_s is None else self.retry_after_max_s
            return retry_after if retry_after <= cap else None
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2 ** min(retry - 1, 62))
        return rng.uniform(0.0, ceiling)


async def call_with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    provider: str,
    operation: str,
    policy: RetryPolicy,
    deadline: float | None,
    breaker: CircuitBreaker | None = None,
    rng: random.Random | None = None,
    on_call: CallObserver | None = None,
    on_retry: RetryObserver | None = None,
) -> T:
    """Run ``attempt`` until it succeeds, fails for good, or the attempts or deadline run out,
    re-raising the last ``ProviderError``; ``on_call`` sees one outcome per call (none when
    cancelled)."""
    rng = rng or _RNG
    started = time.perf_counter()
    outcome: CallOutcome | None = None
    try:
        retry = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                outcome = "unavailable"
                raise map_upstream_failure(TimeoutError())
            if breaker is not None and not breaker.allow():
                outcome = "circuit_open"
                raise map_upstream_failure(CircuitOpenError(provider))
            try:
                async with asyncio.timeout(remaining):
                    result = await attempt()
            except (ProviderError, TimeoutError) as exc:
                failure = exc if isinstance(exc, ProviderError) else map_upstream_failure(exc)
            except BaseException:
                if breaker is not None:
                    breaker.release()
                raise
            else:
                if breaker is not None:
                    breaker.record_success()
                outcome = "ok"
                return result

            if breaker is not None:
                # Only transient failures say the provider is unhealthy.
                (breaker.record_failure if failure.transient else breaker.record_success)()
            retry += 1
            delay = None
            if failure.transient and retry < policy.max_attempts:
                delay = policy.delay_s(retry, retry_after=failure.retry_after, rng=rng)
            if delay is None or (deadline is not None and time.monotonic() + delay >= deadline):
                outcome = "unavailable" if failure.transient else "error"
                raise failure
            if on_retry is not None:
                on_retry(provider, operation)
            await asyncio.sleep(delay)
    except Exception:
        if outcome is None:
            outcome = "error"
        raise
    finally:
        if on_call is not None and outcome is not None:
            on_call(provider, operation, outcome, time.perf_counter() - started)
