"""A reply's body reaches the response as the worker wrote it (issue 48 item 4): cut out of the
record when it is laid out as the worker writes it, re-encoded otherwise, equal either way."""

from __future__ import annotations

import json

import pytest

from worker.api.replies import body_json
from worker.contract.messages import AuthData, ErrorBody, Reply, ReplyBody

TRICKY = 'a,"body":{"x":1}},"version":9} \\ \u2028 é "'


def worker_record(account_id: str, *, version: int | None, error: bool = False) -> bytes:
    request_id = f"req-{TRICKY}"
    body = (
        ReplyBody(
            request_id=request_id,
            error=ErrorBody(code="invalid_state", numeric_code=4090, message=TRICKY),
        )
        if error
        else ReplyBody(
            request_id=request_id,
            data=AuthData(account_id=account_id, status=TRICKY, auth_status="authorized"),
        )
    )
    made = Reply(
        command_id="cmd-1",
        request_id=request_id,
        account_id=account_id,
        http_status=409 if error else 200,
        body=body,
        version=version,
    )
    return made.model_dump_json(exclude_none=True).encode()  # as worker/auth/publish.py does


@pytest.mark.parametrize("version", [None, 0, 12])
@pytest.mark.parametrize("error", [False, True])
def test_the_workers_body_is_passed_through(version: int | None, error: bool) -> None:
    value = worker_record(f"acc-{TRICKY}", version=version, error=error)
    obj = json.loads(value)
    body = body_json(value, obj)
    assert body in value  # the record's own bytes, not a re-encoding
    assert json.loads(body) == obj["body"]


def test_the_records_own_escapes_are_kept() -> None:
    value = (
        b'{"type":"reply","command_id":"c","http_status":200,"body":{"data":"\\u00e9"},"version":1}'
    )
    assert body_json(value, json.loads(value)) == b'{"data":"\\u00e9"}'


@pytest.mark.parametrize(
    "value",
    [
        b'{"type": "reply", "body": {"a": [1, 2]}, "version": 3}',  # not compact
        b'{"body":{"a":{"body":{"b":1}}},"type":"reply","version":3}',  # body not after scalars
        b'{"body":{"a":{"x":1,"body":{"b":1}}},"version":3}',  # body first
        b'{"type":"reply","extra":{"body":{"b":1}},"body":{"a":1}}',  # an object before body
        b'{"type":"reply","body":{"a":1},"version":3,"more":1}',  # two fields after body
        b'{"type":"reply","body":{"a":1},"version":3.50}',  # a number written otherwise
        b'{"type":"reply","body":{"a":"\\u00e9"}}\n',  # trailing whitespace
        b'{"type":"reply","body":{"x":1},"body":{"y":2}}',  # a repeated key: the last counts
    ],
)
def test_another_layout_is_re_encoded_to_the_same_body(value: bytes) -> None:
    obj = json.loads(value)
    assert json.loads(body_json(value, obj)) == obj["body"]
