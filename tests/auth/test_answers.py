"""The one builder of replies and error events: a decided error, a query's 404 and a
dead-lettered record carry the same error object in the same envelope."""

from __future__ import annotations

from worker.auth.flow import dead_lettered, error_body, reply
from worker.contract.catalogue import ServiceError
from worker.contract.messages import AuthData, DecodeFailure


def test_an_error_body_adds_the_detail_after_the_catalogue_message() -> None:
    err = ServiceError.of("invalid_request")
    assert error_body(err).message == err.message
    detailed = error_body(err, "not JSON")
    assert detailed.message == f"{err.message}: not JSON"
    assert (detailed.code, detailed.numeric_code) == (err.code, err.numeric_code)


def test_a_reply_carries_an_error_or_data_never_both() -> None:
    err = ServiceError.of("not_found")
    failed = reply(error_body(err), command_id="c", request_id="r", account_id="a", http_status=404)
    assert failed.body.error == error_body(err) and failed.body.data is None
    assert failed.body.request_id == "r" and failed.version is None
    data = AuthData(account_id="a", status="authorized", auth_status="authorized")
    answered = reply(
        data, command_id="c", request_id="r", account_id="a", http_status=200, version=4
    )
    assert answered.body.data == data and answered.body.error is None
    assert answered.version == 4


def test_an_error_event_carries_the_same_error_object() -> None:
    unreadable = DecodeFailure("invalid", "bad", account_id="a", command_id="c", request_id="r")
    event, answered = dead_lettered(
        unreadable,
        ServiceError.of("invalid_request"),
        "bad",
        event_id="e",
        occurred_at="2027-01-01T00:00:00Z",
    )
    assert event is not None and answered is not None
    assert event.error is answered.body.error and event.http_status == 400
    assert event.error == error_body(ServiceError.of("invalid_request"), "bad")
