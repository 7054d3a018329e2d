"""The upstream-failure table, the retry policy and the circuit breaker, without any I/O."""

from __future__ import annotations

import email.utils
import json
import random
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.auth.provider import (
    BreakerState,
    CircuitBreaker,
    CircuitOpenError,
    ConnectFailed,
    ConnectionLost,
    InvalidTarget,
    ProviderAnswer,
    RetryPolicy,
    TimedOut,
    TransportFailure,
    map_upstream_failure,
)

# (code, numeric_code, http_status) of every error the mapping may produce.
UNAVAILABLE = ("provider_unavailable", 30002, 502)
OPERATION_FAILED = ("provider_unavailable", 30010, 502)
MISMATCH = ("provider_account_mismatch", 20017, 409)
INVALID = ("provider_invalid_request", 30001, 400)
UNSUPPORTED = ("unsupported_by_provider", 30003, 501)


def _err(kind: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": "provider text, never passed on"}}


def answer(
    status: int, body: object = None, headers: dict[str, str] | None = None
) -> ProviderAnswer:
    """An answer as the client hands it over: ``body`` as JSON, or an HTML page when None."""
    raw = b"<html/>" if body is None else json.dumps(body).encode()
    return ProviderAnswer(status, raw, headers or {})


def _triple(failure: Any) -> tuple[str, int, int]:
    e = map_upstream_failure(failure).error
    return (e.code, e.numeric_code, e.http_status)


def state(breaker: CircuitBreaker) -> BreakerState:
    """Read through a function, so mypy does not narrow the property between asserts."""
    return breaker.state


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("status", "body", "expected", "transient"),
    [
        (409, _err("identity_mismatch"), MISMATCH, False),
        (400, _err("invalid_request"), INVALID, False),
        (422, _err("invalid_request"), INVALID, False),
        (501, _err("unsupported_operation"), UNSUPPORTED, False),
        (501, None, UNSUPPORTED, False),
        (400, _err("unsupported_operation"), UNSUPPORTED, False),
        (422, _err("operation_failed"), OPERATION_FAILED, False),
        (500, _err("operation_failed"), UNAVAILABLE, True),
        (502, None, UNAVAILABLE, True),
        (503, _err("unavailable"), UNAVAILABLE, True),
        (504, None, UNAVAILABLE, True),
        (429, None, UNAVAILABLE, True),
        (408, None, UNAVAILABLE, True),
        (409, None, OPERATION_FAILED, False),  # 4xx without a known type: unreadable
        (404, _err("no_such_thing"), OPERATION_FAILED, False),
        (403, {"error": "nope"}, OPERATION_FAILED, False),
        (200, None, OPERATION_FAILED, False),  # a 2xx the adapter could not use
        (302, None, OPERATION_FAILED, False),
    ],
)
def test_response_table(
    status: int, body: dict[str, Any] | None, expected: tuple[str, int, int], transient: bool
) -> None:
    failure = map_upstream_failure(answer(status, body))
    assert (failure.error.code, failure.error.numeric_code, failure.error.http_status) == expected
    assert failure.transient is transient
    assert "provider text" not in failure.error.message


@pytest.mark.parametrize(
    ("exc", "expected", "transient"),
    [
        (ConnectFailed("refused"), UNAVAILABLE, True),
        (TimedOut("slow connect", phase="connect"), UNAVAILABLE, True),
        (TimedOut("slow read", phase="read"), UNAVAILABLE, True),
        (ConnectionLost("server disconnected"), UNAVAILABLE, True),
        (TimeoutError(), UNAVAILABLE, True),
        (CircuitOpenError("simulator"), UNAVAILABLE, True),
        (InvalidTarget("ftp://"), UNAVAILABLE, False),
        (TransportFailure("malformed status line"), UNAVAILABLE, False),
    ],
)
def test_exception_table(
    exc: TransportFailure | TimeoutError | CircuitOpenError,
    expected: tuple[str, int, int],
    transient: bool,
) -> None:
    failure = map_upstream_failure(exc)
    assert _triple(exc) == expected
    assert failure.transient is transient


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("3", 3.0),
        ("0.5", 0.5),
        ("-4", None),  # not delta-seconds: no hint, the backoff decides
        ("soon", None),
        ("", None),
        ("nan", None),
        ("\uff11\uff12", None),  # full-width digits are not delta-seconds either
        ("9" * 400, 86_400.0),  # clamped to RETRY_AFTER_CEILING_S, still past any policy cap
        ("1000000000000", 86_400.0),
        ("Fri, 31 Dec 9999 23:59:59 GMT", 86_400.0),
        ("Fri, 31 Dec 99999 23:59:59 GMT", None),
    ],
)
def test_retry_after_seconds(header: str, expected: float | None) -> None:
    assert (
        map_upstream_failure(answer(503, headers={"Retry-After": header})).retry_after == expected
    )


def test_retry_after_is_read_whatever_the_case_of_its_name() -> None:
    assert map_upstream_failure(answer(429, headers={"retry-after": "7"})).retry_after == 7.0
    assert map_upstream_failure(answer(503, headers={"RETRY-AFTER": "8"})).retry_after == 8.0


def test_retry_after_http_date() -> None:
    when = email.utils.formatdate(time.time() + 120, usegmt=True)
    hint = map_upstream_failure(answer(429, headers={"Retry-After": when})).retry_after
    assert hint is not None
    assert 100 < hint <= 121


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@given(
    status=st.integers(min_value=100, max_value=599),
    body=st.one_of(
        st.binary(max_size=64),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.sampled_from(
            ["identity_mismatch", "invalid_request", "unsupported_operation", "operation_failed"]
        ).map(lambda kind: json.dumps(_err(kind)).encode()),
    ),
)
def test_any_answer_maps_to_a_catalogued_provider_error(status: int, body: bytes) -> None:
    """Whatever the provider sends, the worker gets one of the five provider errors, and only
    retryable statuses are called transient."""
    failure = map_upstream_failure(ProviderAnswer(status, body))
    triple = (failure.error.code, failure.error.numeric_code, failure.error.http_status)
    assert triple in {UNAVAILABLE, OPERATION_FAILED, MISMATCH, INVALID, UNSUPPORTED}
    assert failure.transient is (status in (408, 429) or (status >= 500 and status != 501))


# -- retry policy --------------------------------------------------------------------------------


def test_full_jitter_stays_under_the_exponential_ceiling() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base_s=0.1, backoff_max_s=1.0)
    rng = random.Random(1)
    for retry, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (500, 1.0)]:
        delays = [policy.delay_s(retry, retry_after=None, rng=rng) for _ in range(200)]
        assert all(d is not None and 0.0 <= d <= ceiling for d in delays)
        assert max(d for d in delays if d is not None) > ceiling / 2  # jitter spreads


def test_retry_after_replaces_backoff_up_to_its_bound() -> None:
    policy = RetryPolicy(backoff_base_s=0.1, backoff_max_s=2.0)
    rng = random.Random(1)
    assert policy.delay_s(1, retry_after=1.5, rng=rng) == 1.5
    assert policy.delay_s(1, retry_after=2.5, rng=rng) is None  # longer than we may wait
    longer = RetryPolicy(backoff_max_s=2.0, retry_after_max_s=10.0)
    assert longer.delay_s(1, retry_after=2.5, rng=rng) == 2.5


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


# -- circuit breaker ------------------------------------------------------------------------------


def test_breaker_opens_after_threshold_consecutive_failures() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(threshold=3, reset_s=10, clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.record_failure()
    breaker.record_success()  # not consecutive any more
    for _ in range(2):
        breaker.record_failure()
    assert state(breaker) == "closed"
    breaker.record_failure()
    assert state(breaker) == "open"
    assert not breaker.allow()


def test_breaker_half_opens_for_one_probe_at_a_time() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(threshold=1, reset_s=10, clock=clock)
    breaker.record_failure()
    clock.now += 9.9
    assert not breaker.allow()
    clock.now += 0.1
    assert state(breaker) == "half_open"
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # everyone else waits for its verdict
    breaker.record_failure()  # probe failed: open again, timer restarted
    assert state(breaker) == "open"
    clock.now += 10
    assert breaker.allow()
    breaker.release()  # probe cancelled: the slot is free again
    assert breaker.allow()
    breaker.record_success()
    assert state(breaker) == "closed"
    assert breaker.allow()
    assert breaker.allow()


def test_breaker_ignores_stale_success_while_open() -> None:
    breaker = CircuitBreaker(threshold=1, reset_s=10, clock=FakeClock())
    breaker.record_failure()
    breaker.record_success()  # a call that started before the breaker opened
    assert state(breaker) == "open"


def test_breaker_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="threshold"):
        CircuitBreaker(threshold=0, reset_s=1)
