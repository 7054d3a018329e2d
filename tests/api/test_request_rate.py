"""The per-workspace token bucket (``worker.api.request_rate``) on an injected clock."""

from __future__ import annotations

import copy
import pickle

import pytest

from worker.api.request_rate import MAX_BUCKETS, RateLimited, RateLimiter
from worker.contract.catalogue import ServiceError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(
    rate: float = 2.0, burst: int = 4, max_buckets: int = MAX_BUCKETS
) -> tuple[RateLimiter, Clock]:
    clock = Clock()
    return RateLimiter(rate, burst, clock=clock, max_buckets=max_buckets), clock


def test_the_burst_passes_then_the_next_request_waits_for_a_token() -> None:
    bucket, _ = limiter(rate=2.0, burst=4)
    assert [bucket.take("ws_a") for _ in range(4)] == [0.0] * 4
    assert bucket.take("ws_a") == pytest.approx(0.5)  # one token at 2/s
    assert bucket.take("ws_a") == pytest.approx(0.5)  # a refusal takes nothing


def test_tokens_come_back_at_the_rate_and_never_beyond_the_burst() -> None:
    bucket, clock = limiter(rate=2.0, burst=4)
    for _ in range(4):
        bucket.take("ws_a")
    clock.now += 0.25
    assert bucket.take("ws_a") == pytest.approx(0.25)  # half a token so far
    clock.now += 0.25
    assert bucket.take("ws_a") == 0.0
    assert bucket.take("ws_a") > 0
    clock.now += 3600  # an hour idle refills to the burst, not to 7200
    assert [bucket.take("ws_a") for _ in range(4)] == [0.0] * 4
    assert bucket.take("ws_a") > 0


def test_workspaces_do_not_share_a_bucket() -> None:
    bucket, _ = limiter(rate=1.0, burst=2)
    bucket.take("ws_a")
    bucket.take("ws_a")
    assert bucket.take("ws_a") > 0
    assert bucket.take("ws_b") == 0.0
    assert bucket.take("ws_b") == 0.0
    assert bucket.take("ws_b") > 0


def test_idle_buckets_are_dropped_once_full_again() -> None:
    """A bucket untouched for burst/rate seconds is full: dropping it changes nothing."""
    bucket, clock = limiter(rate=2.0, burst=4)  # full again after 2 s
    for n in range(100):
        bucket.take(f"ws_{n}")
    assert len(bucket) == 100
    clock.now += 1.9
    bucket.take("ws_new")
    assert len(bucket) == 101
    clock.now += 0.2
    bucket.take("ws_new")
    assert len(bucket) == 1


def test_recently_used_buckets_survive_eviction_by_age() -> None:
    bucket, clock = limiter(rate=2.0, burst=4)
    bucket.take("ws_old")
    clock.now += 1.5
    for _ in range(4):
        bucket.take("ws_kept")
    clock.now += 1.0  # ws_old idle 2.5 s (full), ws_kept 1.0 s (2 tokens back, not full)
    bucket.take("ws_other")
    assert len(bucket) == 2
    assert [bucket.take("ws_kept") for _ in range(2)] == [0.0, 0.0]
    assert bucket.take("ws_kept") > 0  # its state was kept: a fresh bucket would have 4


def test_at_most_max_buckets_the_least_recently_used_goes() -> None:
    bucket, _ = limiter(rate=1.0, burst=1, max_buckets=3)
    for ws in ("ws_1", "ws_2", "ws_3"):
        assert bucket.take(ws) == 0.0
    assert bucket.take("ws_1") > 0  # touched: now the most recently used
    bucket.take("ws_4")  # ws_2 goes
    assert len(bucket) == 3
    assert bucket.take("ws_1") > 0
    assert bucket.take("ws_3") > 0
    assert bucket.take("ws_2") == 0.0  # forgotten, so a fresh bucket


@pytest.mark.parametrize(("rate", "burst", "buckets"), [(0.0, 1, 1), (1.0, 0, 1), (1.0, 1, 0)])
def test_nonsense_limits_are_refused(rate: float, burst: int, buckets: int) -> None:
    with pytest.raises(ValueError, match="rate_per_s must be > 0"):
        RateLimiter(rate, burst, max_buckets=buckets)


@pytest.mark.parametrize(("wait_s", "header"), [(0.001, 1), (1.0, 1), (1.01, 2), (9.5, 10)])
def test_rate_limited_is_the_catalogued_429_with_whole_seconds(wait_s: float, header: int) -> None:
    err = RateLimited.after(wait_s)
    assert isinstance(err, ServiceError)
    assert (err.code, err.numeric_code, err.http_status) == ("rate_limited", 90002, 429)
    assert err.retry_after_s == header
    assert f"{header} s" in err.message
    assert pickle.loads(pickle.dumps(err)) == err
    assert copy.copy(err) == err


def test_each_replica_takes_its_share_of_the_rate_and_the_burst() -> None:
    """With three live replicas, each refills at a third of the rate and holds a third of the
    burst (never less than one token): three of them admit the workspace's rate, not 3x."""
    clock = Clock()
    live = [3]
    bucket = RateLimiter(6.0, 6, clock=clock, replicas=lambda: live[0])
    assert bucket.share() == (2.0, 2.0)
    assert [bucket.take("ws_a") for _ in range(2)] == [0.0, 0.0]
    assert bucket.take("ws_a") == pytest.approx(0.5)  # one token at 2/s
    clock.now += 10.0
    assert [bucket.take("ws_a") for _ in range(3)][2] > 0  # refilled to 2, not 6
    live[0] = 1  # the others stopped: the whole rate again
    clock.now += 10.0
    assert [bucket.take("ws_a") for _ in range(6)] == [0.0] * 6
    live[0] = 12
    assert bucket.share() == (0.5, 1.0)  # the burst never below one token
