"""One timestamp object per decoded record: the flow stamps a record and the outcome that changed it
with one ``now``, and plain decoding would give each its own float, so every account in the store
would hold several equal floats where one does."""

from __future__ import annotations

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
