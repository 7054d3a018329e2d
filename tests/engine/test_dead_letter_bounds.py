"""A dead letter always fits (issue 31, "Bounded resources"): a record larger than anything
the system writes (a key of a megabyte, a value or headers over ``MAX_RECORD_BYTES``, which
the broker accepts) is dead-lettered cut to fit, with its coordinates, sizes and digests, and
the process goes on; before, the dead letter kept the key, was refused for its size, and the
lane failed for good (a crash loop, the partition's next owner crashing on it too).
``python -m worker dlq redrive`` refuses a truncated letter: it is not the original."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord

from tests.conftest import SettingsFactory
from tests.harness import bus, confirm_cmd, register_cmd, running_worker
from tests.webhooks.processes import dispatcher_settings
from tests.webhooks.support import (
    Receiver,
    create_endpoint,
    endpoint_store,
    publish_events,
    read_topic,
    receiving,
    running_dispatcher,
    status_event,
    wait_until,
)
from worker.dlq.cli import Redriver, plan
from worker.dlq.letter import DeadLetter, show_json, show_text
from worker.engine.dead_letter import TRUNCATED_KEY_BYTES, dead_letter
from worker.engine.faults import Fault
from worker.engine.kafka import build_producer
from worker.engine.writes import MAX_RECORD_BYTES, record_size
from worker.settings import Settings

HUGE_KEY = b"k" * 1_010_000
HUGE_VALUE = b"v" * 1_010_000
HUGE_HEADERS = [(f"x-big-{i}", bytes([97 + i]) * 101_000) for i in range(10)]


def _sha(raw: bytes) -> bytes:
    return hashlib.sha256(raw).hexdigest().encode()


class _Capturing:
    """A producer that keeps what it is handed (``enqueue`` needs only ``send``)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]] = []

    async def send(self, topic: str, value: bytes | None, **kw: Any) -> Any:
        self.sent.append((topic, kw.get("key"), value, kw.get("headers") or []))
        return None


def _record(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, Any]], *, offset: int = 9
) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        "auth.commands", 2, offset, 0, 0, key, value, None, 0, 0, headers
    )  # fmt: skip


async def _letter_of(msg: ConsumerRecord[bytes, bytes]) -> DeadLetter:
    producer = _Capturing()
    await dead_letter(producer, "auth.dlq", msg, Fault("too_large", "record is big"))
    [(_, key, value, headers)] = producer.sent
    assert record_size(value, key, headers) <= MAX_RECORD_BYTES
    return DeadLetter("auth.dlq", 0, 1, 0, key, value, tuple(headers))


def _assert_describes(
    letter: DeadLetter,
    source: str,
    *,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]],
    cut: tuple[str, ...],
) -> None:
    """``letter`` fits, names its original's coordinates, sizes and digests, and what was
    cut; what it keeps of each part is the original's beginning."""
    size = record_size(letter.value, letter.key, letter.headers)  # type: ignore[arg-type]
    assert size <= MAX_RECORD_BYTES
    named = dict(letter.headers)
    assert named["dlq.source"] == source.encode()
    assert letter.truncated == cut
    assert named["dlq.truncated"] == ",".join(cut).encode()
    if key is not None:
        assert named["dlq.key_bytes"] == str(len(key)).encode()
        assert named["dlq.key_sha256"] == _sha(key)
        assert letter.key is not None and key.startswith(letter.key)
    if value is not None:
        assert named["dlq.value_bytes"] == str(len(value)).encode()
        assert named["dlq.value_sha256"] == _sha(value)
        assert letter.value is not None and value.startswith(letter.value)
    assert named["dlq.headers_count"] == str(len(headers)).encode()
    kept = letter.original_headers()
    assert kept == headers[: len(kept)]
    assert "truncated" in show_text(letter, limit=4096)
    assert show_json(letter, limit=4096)["truncated"] == list(cut)


# --- the builder -----------------------------------------------------------------------------


async def test_a_record_that_fits_is_kept_whole_and_unmarked() -> None:
    headers = [("traceparent", b"tp"), ("dlq.reason", b"forged"), ("x-null", None)]
    letter = await _letter_of(_record(b"acc_1", b"{}", headers))
    assert (letter.key, letter.value) == (b"acc_1", b"{}")
    # a null header value is kept as empty bytes (every writer here can send those)
    assert letter.original_headers() == [("traceparent", b"tp"), ("x-null", b"")]
    assert letter.truncated == ()
    assert not [k for k, _ in letter.headers if k.startswith("dlq.") and "truncated" in k]
    assert dict(letter.headers)["dlq.reason"] == b"too_large"


async def test_a_huge_key_is_cut_and_the_rest_kept_whole() -> None:
    letter = await _letter_of(_record(HUGE_KEY, b"{}", [("traceparent", b"tp")]))
    assert letter.key == HUGE_KEY[:TRUNCATED_KEY_BYTES]
    assert letter.value == b"{}"
    _assert_describes(
        letter,
        "auth.commands:2:9",
        key=HUGE_KEY,
        value=b"{}",
        headers=[("traceparent", b"tp")],
        cut=("key",),
    )


async def test_a_huge_value_huge_headers_or_all_three_are_cut_to_fit() -> None:
    cases: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], tuple[str, ...]]] = [
        (b"acc_1", HUGE_VALUE, [], ("value",)),
        (b"acc_1", b"{}", HUGE_HEADERS, ("headers",)),
        (None, HUGE_VALUE, HUGE_HEADERS, ("value", "headers")),
        (HUGE_KEY, HUGE_VALUE, HUGE_HEADERS, ("key", "value", "headers")),
        (HUGE_KEY, None, [], ("key",)),
    ]
    for key, value, headers, cut in cases:
        letter = await _letter_of(_record(key, value, list(headers)))
        _assert_describes(
            letter, "auth.commands:2:9", key=key, value=value, headers=headers, cut=cut
        )


# --- the DLQ tools -----------------------------------------------------------------------------


async def test_a_truncated_letter_is_never_redriven() -> None:
    letter = await _letter_of(_record(HUGE_KEY, b"{}", []))
    why = plan(letter, {"auth.commands": 3})
    assert why == "truncated (key): not the original record, not redriven"
    out = io.StringIO()
    redriver = Redriver(_Capturing(), {"auth.commands": 3}, out=out)
    await redriver(letter)
    assert redriver.report.skipped == {why: 1}
    assert redriver.producer.sent == []  # type: ignore[union-attr]
    assert "[truncated: key]" in letter.line()
    original = letter.summary()["original"]
    assert original["key_bytes"] == len(HUGE_KEY)
    assert original["key_sha256"] == _sha(HUGE_KEY).decode()
    # the letter of an older worker that left the value out is not the original either
    legacy = DeadLetter(
        "auth.dlq",
        0,
        2,
        0,
        b"acc_1",
        None,
        (
            ("dlq.reason", b"too_large"),
            ("dlq.detail", b"record is 1200000 bytes (value of 1200000 bytes left out)"),
            ("dlq.source", b"auth.commands:0:4"),
        ),
    )
    assert legacy.truncated == ("value",)
    assert isinstance(plan(legacy, {"auth.commands": 3}), str)
    # a forged or garbled dlq.truncated is never read as whole
    garbled = DeadLetter(
        "auth.dlq", 0, 3, 0, b"k", b"{}", (("dlq.truncated", b"\xff"), ("dlq.source", b"t:0:1"))
    )
    assert garbled.truncated == ("unknown",)


# --- the worker over the real broker ----------------------------------------------------------


async def _produce_big(
    settings: Settings, topic: str, records: list[tuple[bytes | None, bytes | None, list[Any]]]
) -> list[int]:
    """``records`` to ``topic`` (partition 0) with a producer that may send them; offsets."""
    producer = build_producer(settings.kafka_config(), max_request_size=4 * 1024 * 1024)
    await producer.start()
    try:
        offsets = []
        for key, value, headers in records:
            sent = await producer.send_and_wait(topic, value, key=key, headers=headers, partition=0)
            offsets.append(sent.offset)
        return offsets
    finally:
        await producer.stop()


@pytest.mark.integration
async def test_the_worker_dead_letters_huge_records_that_fit_and_goes_on(
    make_settings: SettingsFactory, simulator: str
) -> None:
    settings = make_settings(provider_urls={"simulator": simulator}, partitions=1)
    poison: list[tuple[bytes | None, bytes | None, list[Any]]] = [
        (HUGE_KEY, b'{"type":"passkey_confirm","account_id":"acc_next"}', []),
        (b"acc_next", HUGE_VALUE, []),
        (b"acc_next", b"{}", HUGE_HEADERS),
        (b"k" * 400_000, b"v" * 400_000, [("x-big", b"h" * 220_000)]),
    ]
    async with bus(settings) as b, running_worker(settings) as running:
        await b.send(register_cmd("acc_next", "sim-ok-acc_next"))
        offsets = await _produce_big(settings, settings.topics.commands, poison)
        # a null header value (the record format allows one): the old builder raised on it
        [null_at] = await _produce_big(
            settings, settings.topics.commands, [(b"acc_null", b"{}", [("traceparent", None)])]
        )
        good = confirm_cmd("acc_next")
        await b.send(good)
        assert (await b.reply_to(good.command_id, timeout=60))["http_status"] == 200
        await b.wait_for(lambda: len(b.raw.get(settings.topics.dlq, [])) > len(poison), 30)
        assert not running.task.done()
        letters = {}
        for key, value, headers in b.raw[settings.topics.dlq]:
            letter = DeadLetter("dlq", 0, 0, 0, key, value, tuple(headers))
            letters[str(letter.source)] = letter
    null = letters.pop(f"{settings.topics.commands}:0:{null_at}")
    assert null.truncated == ()
    assert null.original_headers() == [("traceparent", b"")]
    # the last: a key of 400 KB is cut, which leaves room for the value and headers whole
    cuts = [("key",), ("value",), ("headers",), ("key",)]
    for (key, value, headers), offset, cut in zip(poison, offsets, cuts, strict=True):
        source = f"{settings.topics.commands}:0:{offset}"
        _assert_describes(letters[source], source, key=key, value=value, headers=headers, cut=cut)


# --- the dispatcher over the real broker ------------------------------------------------------


@pytest.mark.integration
async def test_the_dispatcher_dead_letters_huge_records_that_fit_and_goes_on(
    make_settings: SettingsFactory,
) -> None:
    settings = dispatcher_settings(make_settings, partitions=1)
    hook = Receiver()
    account = "acc_after_poison"
    poison: list[tuple[bytes | None, bytes | None, list[Any]]] = [
        (HUGE_KEY, b"not an event", []),
        (b"acc_x", HUGE_VALUE, []),
        (b"acc_x", b"not an event", HUGE_HEADERS),
    ]
    async with receiving(hook), endpoint_store(settings) as store:
        endpoint, secret = await create_endpoint(store, "ws_a", hook.url)
        hook.secrets.append(secret)
        async with running_dispatcher(settings) as running:
            t = settings.topics
            status_offsets = await _produce_big(settings, t.status, poison)
            error_offsets = await _produce_big(settings, t.errors, poison[:1])
            await publish_events(settings, [status_event(account, 1)])
            await wait_until(lambda: len(hook.verified_once()) == 1, 60)
            assert not running.task.done()
            dlq = await read_topic(settings, t.webhook_dlq)
    letters = {}
    for r in dlq:
        letter = DeadLetter.of(r)
        letters[str(letter.source)] = letter
    cuts = ["key", "value", "headers"]
    expected = [
        *[(t.status, o, p, c) for o, p, c in zip(status_offsets, poison, cuts, strict=True)],
        (t.errors, error_offsets[0], poison[0], "key"),
    ]
    for topic, offset, (key, value, headers), cut in expected:
        source = f"{topic}:0:{offset}"
        _assert_describes(
            letters[source], source, key=key, value=value, headers=headers, cut=(cut,)
        )
    assert [d.body["data"]["account_id"] for d in hook.seen] == [account]
    assert endpoint.id
