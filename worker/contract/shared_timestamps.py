"""One timestamp object per decoded record: the flow stamps a record and the outcome that changed it
with one ``now``, and plain decoding would give each its own float, so every account in the store
would hold several equal floats where one does; and a timestamp's RFC 3339 text
(``rfc3339``), its whole second's made once for the records of that second."""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, ValidationInfo

_RECORD_AT = "record_timestamp"


def remember_timestamp(value: float, info: ValidationInfo) -> float:
    """Keep the record's own timestamp in the validation context for ``share_timestamp``."""
    if isinstance(info.context, dict):
        info.context[_RECORD_AT] = value
    return value


def share_timestamp(value: float, info: ValidationInfo) -> float:
    """The record's timestamp object when ``value`` equals it, else ``value``. Zero is left
    alone: 0.0 == -0.0, but the two encode differently."""
    context: Any = info.context
    if value and isinstance(context, dict):
        at = context.get(_RECORD_AT)
        if at == value:
            shared: float = at
            return shared
    return value


RecordTimestamp = Annotated[float, AfterValidator(remember_timestamp)]
SharedTimestamp = Annotated[float, AfterValidator(share_timestamp)]
"""The flow stamps a record and the outcome (or intent) that changed it with one ``now``;
decoding would give each its own float. Within one ``validate_json(..., context={})`` call, a
``SharedTimestamp`` equal to the record's ``RecordTimestamp`` is that same object."""


def rfc3339(ts: float) -> str:
    """Epoch seconds → RFC 3339 UTC with millisecond precision and a ``Z`` suffix: what
    ``datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")`` writes (rounded to
    the microsecond half to even, then cut to the millisecond)."""
    frac, whole = math.modf(ts)
    us = round(frac * 1e6)
    if us >= 1_000_000:
        whole, us = whole + 1.0, us - 1_000_000
    elif us < 0:
        whole, us = whole - 1.0, us + 1_000_000
    return f"{_second(whole)}.{us // 1000:03d}Z"


@functools.lru_cache(maxsize=8)
def _second(whole: float) -> str:
    return datetime.fromtimestamp(whole, UTC).isoformat()[:19]
