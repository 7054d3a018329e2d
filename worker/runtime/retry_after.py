"""``Retry-After`` (RFC 9110 §10.2.3) as a hostile peer may send it: never raises, always in
``[0, max_s]`` or None (docs/architecture.md, "Bounded remote answers")."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Final

__all__ = ["parse_retry_after"]

# delta-seconds is 1*DIGIT; a decimal fraction is tolerated. ASCII digits only: ``\d`` would
# accept full-width and Arabic-Indic digits, which float() happily converts.
_DELTA: Final = re.compile(r"([0-9]+)(?:\.[0-9]+)?")
_LONGEST_DATE: Final = 64  # every HTTP-date form is under 40 characters
_EXACT_DIGITS: Final = 15  # a whole part longer than this exceeds any ceiling a caller has
_HUGE: Final = 1e15


def parse_retry_after(
    value: str | None, *, max_s: float, now: datetime | None = None
) -> float | None:
    """Seconds from ``now`` to wait, clamped to ``[0, max_s]``: delta-seconds of any length or an
    HTTP-date; None for anything else (negative numbers, non-ASCII digits)."""
    if value is None:
        return None
    ceiling = max_s if math.isfinite(max_s) and max_s > 0 else 0.0
    try:
        seconds = _seconds(value.strip(" \t"), now)
    except Exception:  # whatever the header holds, it is only a hint
        return None
    if seconds is None or not math.isfinite(seconds):
        return None
    return float(min(max(seconds, 0.0), ceiling))


def _seconds(text: str, now: datetime | None) -> float | None:
    delta = _DELTA.fullmatch(text)
    if delta is not None:
        if len(delta.group(1).lstrip("0")) > _EXACT_DIGITS:
            return _HUGE  # beyond every ceiling: clamped to it
        return float(text)
    if not text or len(text) > _LONGEST_DATE or not text.isascii():
        return None
    when = parsedate_to_datetime(text)
    if when.tzinfo is None:  # "-0000" in the date: RFC 9110 dates are always GMT
        when = when.replace(tzinfo=UTC)
    return (when - (now or datetime.now(UTC))).total_seconds()
