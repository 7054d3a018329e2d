"""The hard ceilings of a webhook endpoint's fields.

The configured limits (``WEBHOOK_URL_MAX_CHARS`` ...) may be lowered or raised up to these;
the endpoint record accepts values up to the ceilings, so a record written under a larger
limit stays readable after the limit is lowered (the limit applies to new input only).
"""

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
