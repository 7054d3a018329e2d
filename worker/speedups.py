"""The optimisations the benchmark keeps (the dedup window's ids as ints, one timestamp object
per record, the key-hash cache), each with the plain equivalent ``tests/test_speedups.py`` uses
as its oracle; anything here must earn its place that way, the rest is written plainly."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Annotated, Any

from aiokafka.partitioner import murmur2
from pydantic import AfterValidator, GetPydanticSchema, ValidationInfo
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


_HASHES: dict[bytes, int] = {}
_HASHES_MAX = 8192


def key_hash(key: bytes) -> int:
    """``murmur2(key)``, remembered for the last few thousand keys."""
    digest = _HASHES.get(key)
    if digest is None:
        if len(_HASHES) >= _HASHES_MAX:
            _HASHES.clear()
        digest = _HASHES[key] = murmur2(key)
    return digest


class KeyPartitioner:
    """aiokafka's ``DefaultPartitioner`` on ``key_hash``: the worker producer's
    ``partitioner``."""

    def __call__(
        self, key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
    ) -> int:
        if key is None:
            return random.choice(available or all_partitions)
        return all_partitions[(key_hash(key) & 0x7FFFFFFF) % len(all_partitions)]
