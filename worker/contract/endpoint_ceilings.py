"""The hard ceilings of a webhook endpoint record's fields: the configured limits may not exceed
them and apply to new input only, so a record written under a larger limit stays readable."""

from __future__ import annotations

from typing import Final

URL_MAX_CHARS_CEILING: Final = 8192
DESCRIPTION_MAX_CHARS_CEILING: Final = 4096
EVENT_TYPES_MAX_ITEMS_CEILING: Final = 256

__all__ = [
    "DESCRIPTION_MAX_CHARS_CEILING",
    "EVENT_TYPES_MAX_ITEMS_CEILING",
    "URL_MAX_CHARS_CEILING",
]
