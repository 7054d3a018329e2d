"""A webhook body rendered at take-in: byte for byte what ``json.dumps`` makes of the event
record's dump (compact, not ASCII-escaped), whatever its strings hold."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.contract.messages import AuthError, AuthStatusChanged, ErrorBody
from worker.contract.webhook_endpoints import EVENT_ERROR, EVENT_STATUS_CHANGED
from worker.contract.webhook_events import WIRE_ONLY, from_error, from_status

_TEXT = st.text(
    st.characters(exclude_categories=["Cs"]) | st.sampled_from('"\\/\x00\x1f\x7f\u2028é😀'),
    max_size=40,
)
_MAYBE = st.none() | _TEXT
_STATUS = st.builds(
    AuthStatusChanged,
    event_id=_TEXT,
    account_id=_TEXT,
    workspace_id=_TEXT,
    previous_status=_MAYBE,
    status=_TEXT,
    auth_status=_TEXT,
    version=st.integers(min_value=-(2**70), max_value=2**70),
    command_id=_MAYBE,
    request_id=_MAYBE,
    occurred_at=_TEXT,
)
_ERROR = st.builds(
    AuthError,
    event_id=_TEXT,
    account_id=_TEXT,
    workspace_id=_MAYBE,
    command_id=_MAYBE,
    request_id=_MAYBE,
    http_status=st.integers(min_value=-(2**70), max_value=2**70),
    error=st.builds(ErrorBody, code=_TEXT, numeric_code=st.integers(), message=_TEXT),
    occurred_at=_TEXT,
)


def _dumped(event_type: str, event: AuthStatusChanged | AuthError) -> str:
    data = event.model_dump(mode="json", exclude=set(WIRE_ONLY))
    body = {"type": event_type, "timestamp": event.occurred_at, "data": data}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


@settings(max_examples=300)
@given(event=_STATUS | _ERROR)
def test_a_body_is_the_event_s_dump_as_json_dumps_writes_it(
    event: AuthStatusChanged | AuthError,
) -> None:
    if isinstance(event, AuthStatusChanged):
        rendered = from_status(event.model_dump_json().encode())
        assert rendered.body == _dumped(EVENT_STATUS_CHANGED, event)
    else:
        rendered = from_error(event.model_dump_json().encode())
        assert rendered.body == _dumped(EVENT_ERROR, event)
