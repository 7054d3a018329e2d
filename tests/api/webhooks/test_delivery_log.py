"""The delivery log's read model without a broker: deliveries grouped from a slice, attempts
(from entries of either form), filters, pages and the cursor, and the hostile cursors and
bodies an attacker would send."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from worker.api.webhooks.delivery_log import (
    CURSOR_MAX_CHARS,
    Cursor,
    Filters,
    decode_cursor,
    deliveries,
    find,
    page,
    status_of,
)
from worker.api.webhooks.delivery_log_scan import LogSlice
from worker.contract.catalogue import ServiceError
from worker.contract.delivery_log import (
    EXCERPT_BYTES,
    EXCERPT_CHARS,
    DeliveryLogEntry,
    decode_log,
    excerpt,
)
from worker.dispatcher.sender import DeliveryResult, ErrorKind, attempt_record

EP = "ep_1"


def entry(
    webhook_id: str,
    state: str = "delivered",
    attempts: int = 1,
    *,
    at: str = "2026-01-01T00:00:00.000Z",
    event_type: str = "account.auth_status_changed",
    account: str = "acc_1",
    replay: str | None = None,
) -> DeliveryLogEntry:
    return DeliveryLogEntry.model_validate(
        {
            "webhook_id": webhook_id,
            "endpoint_id": EP,
            "workspace_id": "ws_a",
            "account_id": account,
            "event_type": event_type,
            "event_id": f"ev-{webhook_id}",
            "attempts": attempts,
            "state": state,
            "updated_at": at,
            "replay": replay,
        }
    )


def sliced(*entries: DeliveryLogEntry, lo: int = 0) -> LogSlice:
    return LogSlice(0, lo, lo + len(entries), [((lo + i, 0), e) for i, e in enumerate(entries)])


def test_a_delivery_keeps_the_position_of_its_first_entry_and_shows_its_latest() -> None:
    found = sliced(
        entry("msg_a", "pending", 1),
        entry("msg_b", "delivered", 1),
        entry("msg_a", "delivered", 2),
        entry("msg_a", "pending", 0, replay="rs_1"),
    )
    listed = deliveries(found)
    assert [d.delivery_id for d in listed] == ["msg_a.rs_1", "msg_b", "msg_a"]
    assert [status_of(d.latest) for d in listed] == ["pending", "succeeded", "succeeded"]
    assert find(found, "msg_a") == listed[2] and find(found, "msg_zz") is None


def test_status_names() -> None:
    assert status_of(entry("m", "pending", 0)) == "pending"
    assert status_of(entry("m", "pending", 2)) == "failing"
    assert status_of(entry("m", "failed", 8)) == "failed"
    assert status_of(entry("m", "delivered", 1)) == "succeeded"


def test_an_old_entry_without_attempt_or_body_reads_and_gives_what_it_has() -> None:
    """Backward compatible: entries written before attempts and bodies were logged."""
    old = json.dumps(
        {
            "type": "webhook_delivery",
            "schema_version": 1,
            "webhook_id": "msg_old",
            "endpoint_id": EP,
            "workspace_id": "ws_a",
            "account_id": "acc_1",
            "event_type": "account.auth_error",
            "event_id": "e1",
            "attempts": 2,
            "state": "pending",
            "last_status": 503,
            "last_error": None,
            "updated_at": "2026-01-01T00:00:00.000Z",
        }
    ).encode()
    (read,) = decode_log(old)
    assert read.attempt is None and read.body is None
    (one,) = deliveries(sliced(read))
    assert one.body is None
    (attempt,) = one.attempts()
    assert attempt.status == 503 and attempt.latency_ms is None


def test_attempts_come_from_the_entries_that_carry_them_in_order() -> None:
    first = attempt_record(0.0, DeliveryResult(status=500, elapsed_s=0.0123, body=b"no"))
    second = attempt_record(5.0, DeliveryResult(status=None, elapsed_s=1, error=ErrorKind.TLS))
    entries = [
        entry("m", "pending", 1).model_copy(update={"attempt": first}),
        entry("m", "delivered", 2).model_copy(update={"attempt": second}),
    ]
    (one,) = deliveries(sliced(*entries))
    got = one.attempts()
    assert [(a.status, a.latency_ms, a.error_kind) for a in got] == [
        (500, 12, None),
        (None, 1000, "tls"),
    ]
    assert got[0].response_excerpt == "no"


def test_a_hostile_answer_is_kept_as_capped_text() -> None:
    """``<script>`` stays text; bytes that are not UTF-8 are escaped; the cap is in bytes."""
    body = b"<script>alert(1)</script>\xff\xfe\x00" + b"A" * 1000
    text, cut = excerpt(body)
    assert text.startswith("<script>alert(1)</script>\\xff\\xfe\x00")
    assert cut and len(text.encode("utf-8", "backslashreplace")) <= EXCERPT_CHARS
    all_binary, _ = excerpt(b"\xff" * 10_000)
    assert all_binary == "\\xff" * EXCERPT_BYTES and len(all_binary) == EXCERPT_CHARS
    # cut in the middle of a multi-byte character: escaped, not an error
    split, _ = excerpt("é".encode() * EXCERPT_BYTES)
    assert split.endswith("é") or split.endswith("\\xc3")


def test_filters_by_status_type_account_and_time() -> None:
    found = sliced(
        entry("a", "delivered", at="2026-01-01T00:00:00Z"),
        entry("b", "failed", 8, at="2026-01-02T00:00:00Z", event_type="account.auth_error"),
        entry("c", "pending", 2, at="2026-01-03T00:00:00Z", account="acc_2"),
        entry("d", "pending", 0, at="2026-01-04T00:00:00Z"),
    )

    def ids(filters: Filters) -> list[str]:
        return [d.delivery_id for d in page(found, filters, before=None, limit=100)[0]]

    assert ids(Filters()) == ["d", "c", "b", "a"]
    assert ids(Filters(status="failing")) == ["c"]
    assert ids(Filters(status="pending")) == ["d"]
    assert ids(Filters(status="failed")) == ["b"]
    assert ids(Filters(status="succeeded")) == ["a"]
    assert ids(Filters(event_type="account.auth_error")) == ["b"]
    assert ids(Filters(account_id="acc_2")) == ["c"]
    since = datetime(2026, 1, 2, tzinfo=UTC)
    until = datetime(2026, 1, 4, tzinfo=UTC)
    assert ids(Filters(since=since, until=until)) == ["c", "b"]


def test_pages_of_one_cursor_neither_repeat_nor_skip() -> None:
    found = sliced(*(entry(f"m{i}") for i in range(25)))
    seen: list[str] = []
    before = None
    while True:
        shown, following = page(found, Filters(), before=before, limit=7)
        seen += [d.delivery_id for d in shown]
        if following is None:
            break
        again = decode_cursor(following.encode(), window=100)
        assert again == following
        before = again.before
    assert seen == [f"m{i}" for i in range(24, -1, -1)]


def test_a_forged_cursor_cannot_buy_a_wider_scan() -> None:
    """Any value of the cursor's form is read, its slice clamped to the window (so it costs
    what a page costs); anything else is a 400."""
    good = Cursor(0, 100, 200, (150, 0)).encode()
    assert decode_cursor(good, window=100) == Cursor(0, 100, 200, (150, 0))
    wide = decode_cursor("c1.0.0.1000000000.5.0", window=100)
    assert (wide.lo, wide.hi) == (1000000000 - 100, 1000000000)
    backwards = decode_cursor("c1.0.200.100.150.0", window=100)
    assert backwards.lo == backwards.hi == 100  # an empty slice
    for bad in (
        "c1.0.0.10.5",  # a part missing
        "c2.0.0.10.5.0",
        "c1.0.-1.10.5.0",
        "c1.0.1.5.10.5.0",
        "c1.0.0.1" + "0" * 18 + ".5.0",  # a part too long
        "c1.0.0.10.5.0\n",
        "c1.0.0.\u0661\u0660.5.0",  # non-ASCII digits
        "WzEsMCwwLDEwLDUsMF0",
        "",
        "c1." + "1." * 200 + "1",
    ):
        with pytest.raises(ServiceError) as caught:
            decode_cursor(bad, window=100)
        assert caught.value.code == "invalid_request"
    assert len("c1" + ".999999999999999999" * 5) <= CURSOR_MAX_CHARS
