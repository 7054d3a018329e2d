"""Every decode path over hostile bytes: arbitrary bytes and arbitrary JSON trees (deep, wide,
huge strings, wrong types) never raise out of a decoder, other than the ``ValueError`` (pydantic's
``ValidationError``) its callers catch; ``decode_command`` never raises at all.

``FUZZ_EXAMPLES`` sets the examples per property (a modest count in CI); the long run is
``FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest -m fuzz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.harness import confirm_cmd, register_cmd
from worker.api.replies import ReplyError, ReplyRouter
from worker.auth.store import StateStore
from worker.contract.delivery_log import DeliveryLogEntry, decode_log, decode_replay
from worker.contract.messages import DecodeFailure, decode_command, decode_record
from worker.contract.webhook_endpoints import decode_endpoint
from worker.contract.webhook_events import from_error, from_status
from worker.dispatcher.delivery_store import DeliveryStore

pytestmark = pytest.mark.fuzz

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)
    | st.floats(allow_nan=False)
    | st.text(max_size=50)
    | st.builds(
        lambda n, c: c * n, st.integers(10_000, 100_000), st.sampled_from("a\u00e9\U0001f600")
    )
)
json_trees = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=20), inner),
    max_leaves=60,
)


def _deep(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


deep_json = st.builds(_deep, st.integers(1, 3_000), st.sampled_from(["array", "object"]))

_VALID: dict[str, bytes] = {
    "command": confirm_cmd("acc_1").model_dump_json().encode(),
    "register": register_cmd("acc_1", "sim-ok").model_dump_json().encode(),
}


@st.composite
def wrong_types(draw: st.DrawFn) -> bytes:
    """A valid record with one field replaced by an arbitrary JSON tree (or a deep one)."""
    obj = json.loads(_VALID[draw(st.sampled_from(sorted(_VALID)))])
    field = draw(st.sampled_from(sorted(obj)))
    if draw(st.booleans()):
        obj[field] = draw(json_trees)
        return json.dumps(obj).encode()
    encoded = json.dumps({**obj, field: None}).encode()
    return encoded.replace(b"null", draw(deep_json), 1)


hostile = (
    st.binary(max_size=2000)
    | json_trees.map(lambda t: json.dumps(t).encode())
    | deep_json
    | wrong_types()
)


def _only_value_errors(decode: Callable[[bytes], Any], value: bytes) -> None:
    # pydantic's ValidationError is a ValueError: what every caller catches.
    with contextlib.suppress(ValueError):
        decode(value)


@FUZZ
@given(key=st.one_of(st.none(), st.binary(max_size=200)), value=st.one_of(st.none(), hostile))
@example(key=b"acc_1", value=_deep(20_000, "array"))
@example(key=b"acc_1", value=b"\xff" * 100)
def test_decode_command_never_raises(key: bytes | None, value: bytes | None) -> None:
    result = decode_command(key, value)
    if isinstance(result, DecodeFailure):
        assert result.reason and len(result.detail) < 2000


DECODERS: dict[str, Callable[[bytes], Any]] = {
    "state record": decode_record,
    "state restore": StateStore.decode,
    "status event": from_status,
    "error event": from_error,
    "endpoint record": decode_endpoint,
    "delivery state": DeliveryStore.decode,
    "replay": decode_replay,
    "delivery log entry": DeliveryLogEntry.model_validate_json,
    "delivery log record": decode_log,
}


@pytest.mark.parametrize("name", sorted(DECODERS))
@FUZZ
@given(value=hostile)
@example(value=_deep(20_000, "array"))
@example(value=_deep(20_000, "object"))
def test_record_decoders_raise_only_what_their_callers_catch(name: str, value: bytes) -> None:
    _only_value_errors(DECODERS[name], value)


@FUZZ
@given(values=st.lists(st.one_of(st.none(), hostile), max_size=5))
def test_the_reply_reader_never_raises_on_hostile_replies(values: list[bytes | None]) -> None:
    asyncio.run(_read_replies(values))


async def _read_replies(values: list[bytes | None]) -> None:
    router = ReplyRouter(None, "auth.replies", partition=0)
    waiter = router.expect("c1", "req-c1")
    # What a writer of auth.replies would try besides noise: values that name the command
    # someone waits for, with a hostile body.
    named = [
        json.dumps({"command_id": "c1", "request_id": "req-c1", "body": body}).encode()
        for body in ("x", 1, None)
    ]
    records = [
        ConsumerRecord("auth.replies", 0, i, 0, 0, b"acc_1", v, None, 5, 0, [])
        for i, v in enumerate([*values, *named])
    ]
    router.handle(records)
    # The invalid reply failed the waiter: its caller is answered, not left hanging.
    with pytest.raises(ReplyError):
        async with asyncio.timeout(1) as limit:
            await waiter.until(limit)
