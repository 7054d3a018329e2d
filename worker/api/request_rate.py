"""The request rate per workspace: a token bucket refilled at this process's share (rate and burst
divided by the live replicas, ``worker.api.presence``), so N replicas admit the rate in total, not
N times it (docs/operations.md, "Front-door limits")."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Final

import attrs

from worker.contract.catalogue import ServiceError

MAX_BUCKETS: Final = 10_000
"""Workspaces tracked at once per process."""


@attrs.frozen(auto_exc=False)
class RateLimited(ServiceError):
    """429 ``rate_limited``, with the seconds the caller should wait (``Retry-After``)."""

    retry_after_s: int = 1

    @classmethod
    def after(
        cls, wait_s: float, message: str = "Too many requests for this workspace; retry after {} s."
    ) -> RateLimited:
        """The refusal for a caller who must wait ``wait_s``, rounded up to whole seconds (at
        least 1) as ``Retry-After`` takes them."""
        retry_after_s = max(1, math.ceil(wait_s))
        err = ServiceError.of("rate_limited", message.format(retry_after_s))
        return cls(
            code=err.code,
            numeric_code=err.numeric_code,
            http_status=err.http_status,
            message=err.message,
            retry_after_s=retry_after_s,
        )

    def __reduce__(self) -> tuple[type[RateLimited], tuple[str, int, int, str, int]]:  # type: ignore[override]
        return (
            type(self),
            (self.code, self.numeric_code, self.http_status, self.message, self.retry_after_s),
        )


@dataclass(slots=True, eq=False)
class _Bucket:
    tokens: float
    updated: float


@dataclass(eq=False)
class RateLimiter:
    """Token buckets by key (the workspace id), each refilled at ``rate_per_s`` and holding at
    most ``burst`` (at least one token), both over the live ``replicas``."""

    rate_per_s: float
    burst: float
    _: KW_ONLY
    max_buckets: int = MAX_BUCKETS
    clock: Callable[[], float] = time.monotonic
    replicas: Callable[[], int] | None = None

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.burst < 1 or self.max_buckets < 1:
            raise ValueError("rate_per_s must be > 0, burst and max_buckets >= 1")
        self.burst = float(self.burst)
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def share(self) -> tuple[float, float]:
        """This process's rate and burst now: the configured ones divided by the live
        replicas (the burst never below one token)."""
        n = max(1, self.replicas()) if self.replicas is not None else 1
        return self.rate_per_s / n, max(1.0, self.burst / n)

    def take(self, key: str) -> float:
        """Take a token for ``key``: 0.0 when one was there, else the seconds until one is."""
        now = self.clock()
        rate, burst = self.share()
        self._evict_full(now, burst / rate)  # an untouched bucket is full after that
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(burst, now)
            self._buckets[key] = bucket
            if len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * rate)
            bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / rate

    def _evict_full(self, now: float, refill_s: float) -> None:
        """Drop the least recently used buckets while they have refilled completely."""
        buckets = self._buckets
        while buckets:
            key, oldest = next(iter(buckets.items()))
            if now - oldest.updated < refill_s:
                return
            del buckets[key]
