"""The one place where upstream failures become catalogued errors, and which are transient;
mapping a hostile answer cannot fail (docs/architecture.md, "The provider's wire contract")."""

from __future__ import annotations

from typing import Final

from worker.auth.provider.answer import ProviderAnswer, load_json
from worker.auth.provider.base import ProviderError
from worker.auth.provider.breaker import CircuitOpenError
from worker.auth.provider.failures import TransportFailure
from worker.contract.catalogue import ServiceError
from worker.runtime.retry_after import parse_retry_after

__all__ = [
    "OPERATION_FAILED",
    "RETRY_AFTER_CEILING_S",
    "UpstreamFailure",
    "invalid_call",
    "map_answer",
    "map_unexpected",
    "map_upstream_failure",
]

#: Everything an adapter may hand to ``map_upstream_failure``.
UpstreamFailure = ProviderAnswer | TransportFailure | TimeoutError | CircuitOpenError

#: Numeric refinement for a provider-side operation failure (the catalogue's provider-detail
#: codes; docs/api.md, "Errors").
OPERATION_FAILED: Final = 30010

#: The longest ``Retry-After`` read from a provider: longer than any retry policy waits, so a
#: hint clamped to it still ends the retries (``RetryPolicy.delay_s``).
RETRY_AFTER_CEILING_S: Final = 86_400.0

_UNAVAILABLE: Final = ServiceError.of("provider_unavailable")
_MISMATCH: Final = ServiceError.of("provider_account_mismatch")
_INVALID: Final = ServiceError.of("provider_invalid_request")
_UNSUPPORTED: Final = ServiceError.of("unsupported_by_provider")
_FAILED: Final = ServiceError.of(
    "provider_unavailable", "The provider could not complete the operation."
).refine(OPERATION_FAILED)
_UNREADABLE: Final = ServiceError.of(
    "provider_unavailable", "The provider returned an answer that could not be understood."
).refine(OPERATION_FAILED)

# Provider error ``type`` → catalogued error, for 4xx answers.
_BY_TYPE: Final[dict[str, ServiceError]] = {
    "identity_mismatch": _MISMATCH,
    "invalid_request": _INVALID,
    "unsupported_operation": _UNSUPPORTED,
    "operation_failed": _FAILED,
}


def map_upstream_failure(failure: UpstreamFailure) -> ProviderError:
    """One upstream failure (a non-2xx answer, or a 2xx whose body does not parse: 30010) as a
    ``ProviderError`` carrying a catalogued error."""
    if isinstance(failure, ProviderAnswer):
        return map_answer(failure.status, failure.body, failure.headers.get("Retry-After"))
    if isinstance(failure, CircuitOpenError | TimeoutError):
        # Nothing said about the request itself: the provider is slow, or we hold back.
        return ProviderError(_UNAVAILABLE, transient=True)
    # A transport failure says itself whether the same request may get through later; one
    # that is not transient means our side cannot form the call: retrying cannot help.
    return ProviderError(_UNAVAILABLE, transient=failure.transient)


def map_answer(status: int, body: bytes, retry_after: str | None) -> ProviderError:
    """``map_upstream_failure`` of an answer given by its parts: the status, the decoded
    (bounded) body and the ``Retry-After`` header."""
    if status == 501:
        return ProviderError(_UNSUPPORTED, transient=False)
    if status in (408, 429) or status >= 500:
        hint = parse_retry_after(retry_after, max_s=RETRY_AFTER_CEILING_S)
        return ProviderError(_UNAVAILABLE, transient=True, retry_after=hint)
    if 400 <= status < 500:
        known = _BY_TYPE.get(_error_type(body) or "")
        if known is not None:
            return ProviderError(known, transient=False)
    return ProviderError(_UNREADABLE, transient=False)


def map_unexpected(exc: Exception) -> ProviderError:
    """Any exception one attempt raised: a ``ProviderError`` as it is, a transport failure or
    a timeout through the table, anything else (a fault while reading or parsing an answer) as
    an unreadable answer, not retried: the same answer would fail again."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, TransportFailure | TimeoutError | CircuitOpenError):
        return map_upstream_failure(exc)
    return ProviderError(_UNREADABLE, transient=False)


def invalid_call(message: str) -> ProviderError:
    """The adapter itself rejects the call's data (e.g. an empty account ref) before sending:
    400 provider_invalid_request, which is what the contract (docs/api.md) says an adapter
    rejection is."""
    return ProviderError(ServiceError.of("provider_invalid_request", message), transient=False)


def _error_type(body: bytes) -> str | None:
    """``error.type`` of a provider error body, or None when the body is not that shape."""
    parsed = load_json(body)
    error = parsed.get("error") if isinstance(parsed, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None
