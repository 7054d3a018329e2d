"""The front-end's ids as ints in memory (a canonical UUID as its 128-bit int, a ``req_<hex>`` with
bit 128 set): the dedup window keeps recent ids, and an int is about half a string's memory."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import GetPydanticSchema
from pydantic_core import core_schema

_is_uuid = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").fullmatch
_is_request_id = re.compile(r"req_[0-9a-f]{32}").fullmatch
_REQUEST_ID_FLAG = 1 << 128
"""Set on a compacted ``req_<hex>`` id: a UUID's int is below it, so the two never meet."""


def compact_id(value: str) -> int | str:
    """The front-end's ids as ints, anything else as it is: a canonical UUID (lowercase,
    hyphenated: its command ids) as its 128-bit int, a ``req_`` + 32 lowercase hex digits (its
    request ids) as that number with bit 128 set. ``expand_id`` inverts it exactly."""
    if len(value) == 36:
        if _is_uuid(value):
            return int(value.replace("-", ""), 16)
        if _is_request_id(value):
            return int(value[4:], 16) | _REQUEST_ID_FLAG
    return value


def expand_id(value: int | str) -> str:
    """The id ``compact_id`` was given."""
    if isinstance(value, str):
        return value
    if value >= _REQUEST_ID_FLAG:
        return f"req_{value ^ _REQUEST_ID_FLAG:032x}"
    x = f"{value:032x}"
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


_COMPACT_ID_SCHEMA = core_schema.no_info_after_validator_function(
    compact_id,
    core_schema.str_schema(),
    serialization=core_schema.plain_serializer_function_ser_schema(
        expand_id, return_schema=core_schema.str_schema()
    ),
)
CompactId = Annotated[int | str, GetPydanticSchema(lambda _t, _h: _COMPACT_ID_SCHEMA)]
"""An id that is a string on the wire (and in the JSON Schema), ``compact_id``'s form in
memory."""
