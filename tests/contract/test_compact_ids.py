"""``worker.contract.compact_ids`` against the plain strings as the oracle: every id comes back
exactly, and only the front-end's two forms become ints."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import ids
from worker.contract.compact_ids import compact_id, expand_id


def _canonical_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _request_id(value: str) -> bool:
    """``req_`` + a UUID's 32 lowercase hex digits: what the front-end makes."""
    hex_part = value.removeprefix("req_")
    return (
        value.startswith("req_")
        and len(hex_part) == 32
        and all(c in "0123456789abcdef" for c in hex_part)
    )


@given(ids)
def test_compact_id_is_exactly_reversible(value: str) -> None:
    compacted = compact_id(value)
    assert expand_id(compacted) == value
    assert isinstance(compacted, int) == (_canonical_uuid(value) or _request_id(value))


@given(st.uuids())
def test_compacted_ids_are_the_uuid_modules_numbers(value: uuid.UUID) -> None:
    assert compact_id(str(value)) == value.int
    assert expand_id(value.int) == str(uuid.UUID(int=value.int))
    request_id = compact_id("req_" + value.hex)
    assert isinstance(request_id, int) and request_id != value.int
    assert expand_id(request_id) == "req_" + value.hex


def test_the_two_compacted_forms_never_meet() -> None:
    hex_id = "0123456789abcdef0123456789abcdef"
    as_uuid = str(uuid.UUID(hex_id))
    assert compact_id(as_uuid) != compact_id("req_" + hex_id)
    assert expand_id(compact_id("req_" + "0" * 32)) == "req_" + "0" * 32
