"""What an operator sees of each way a dispatcher record, attempt or migration ends
(``worker.dispatcher.instrumentation``): the counters, the span's attributes, the log lines, and
the record's or pair's identity in the log context of every write made while it is handled,
never an endpoint's URL. Counts come after the writes they stand for: a write that fails
counts nothing. The dispatcher over an in-memory store, a sender that answers as told (the
HTTP boundary) and a publisher that notes the log context of each call (the Kafka side is
covered by tests/dispatcher/test_dispatcher.py, test_dispatcher_process.py and
tests/api/test_tracing.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, MutableMapping, Sequence
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from tests.observed import one_span, passkey_attributes
from tests.webhooks.support import status_event
from worker.contract.delivery_log import Replay, webhook_id
from worker.contract.webhook_endpoints import EndpointRecord, EndpointStatus
from worker.dispatcher.delivery import DeliveryState, Finished, Pending, QueueLimits
from worker.dispatcher.delivery_store import AccountDeliveries, DeliveryStore
from worker.dispatcher.dispatch_ports import Ports
from worker.dispatcher.dispatcher import DispatchConfig, Dispatcher
from worker.dispatcher.metrics import WebhookMetrics
from worker.dispatcher.sender import DeliveryResult
from worker.engine.faults import Fault
from worker.runtime.logs import log_fields
from worker.webhooks.endpoints import EndpointRegistry

NOW = 1_700_000_000.0
PARTITION = 2
STATUS = "auth.status"
# A token in the query string, as integrators put them: it must show up nowhere.
URL = "https://hooks.example.test:8443/in?token=sekrit-token"


class NotingPublisher:
    """Writes nothing; notes each call with the log context it was made in. ``failing``
    names a call that raises instead, as a write that failed for good does."""

    def __init__(self, failing: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.failing = failing

    def _note(self, what: str) -> None:
        self.calls.append((what, log_fields()))
        if what == self.failing:
            raise RuntimeError(f"{what} failed")

    def what(self) -> list[str]:
        return [what for what, _ in self.calls]

    async def send_states(
        self, partition: int, keys: Sequence[str], *, store: DeliveryStore
    ) -> Awaitable[None]:
        self._note("send_states")
        return asyncio.sleep(0)

    async def tombstone(self, partition: int, key: str) -> None:
        self._note("tombstone")

    async def log_pending(self, taken: Any, *, now: float) -> None:
        self._note("log_pending")

    async def log_retry(
        self, state: DeliveryState, head: Pending, *, now: float, attempt: Any = None
    ) -> None:
        self._note("log_retry")

    async def log_finished(
        self, state: DeliveryState, head: Pending, finished: Finished, *, attempt: Any = None
    ) -> None:
        self._note("log_finished")

    async def log_note(self, **_: Any) -> None:
        self._note("log_note")

    async def dead_letter(self, state: DeliveryState, head: Pending, finished: Finished) -> None:
        self._note("dead_letter")

    async def dead_letter_record(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        self._note("dead_letter_record")


class AnsweringSender:
    """The HTTP boundary: answers each post with ``status`` (``None``: no answer)."""

    def __init__(self, status: int | None = 204) -> None:
        self.status = status
        self.urls: list[str] = []

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult:
        self.urls.append(url)
        return DeliveryResult(self.status, 0.01)


class Writer:
    def signing_secrets(self, record: EndpointRecord) -> list[str]:
        return ["whsec_c2VjcmV0LXNpZ25pbmcta2V5LW9mLWEtdGVzdA=="]

    async def disable(
        self, current: EndpointRecord, reason: str, recovery: object = None
    ) -> EndpointRecord:
        return current.model_copy(update={"status": "disabled", "disabled_reason": reason})

    async def update(self, current: EndpointRecord, **fields: Any) -> EndpointRecord:
        return current.model_copy(update=fields)


class Setup:
    def __init__(
        self,
        *,
        status: EndpointStatus = "active",
        sender: AnsweringSender | None = None,
        publisher: NotingPublisher | None = None,
        schedule: tuple[float, ...] = (60.0,),
        max_pending: int = 1000,
        max_pairs: int = 1000,
    ) -> None:
        self.registry = CollectorRegistry()
        self.publisher = publisher or NotingPublisher()
        self.sender = sender or AnsweringSender()
        self.endpoints = EndpointRegistry()
        self.endpoint = EndpointRecord(
            id="ep_1",
            workspace_id="ws_a",
            url=URL,
            status=status,
            created_at="2026-01-01T00:00:00Z",
            updated_at="2026-01-01T00:00:00Z",
            revision=1,
        )
        self.endpoints.apply(self.endpoint)
        self.store = DeliveryStore()
        self.dispatcher = Dispatcher(
            store=self.store,
            ports=Ports(
                endpoints=self.endpoints,
                writer=Writer(),
                sender=self.sender,
                sign=lambda secrets, wid, ts, body: {"webhook-id": wid},
                publisher=self.publisher,  # type: ignore[arg-type]
            ),
            config=DispatchConfig(
                status_topic=STATUS,
                replay_topic="webhook.replays",
                schedule=schedule,
                disable_after_s=10 * 86400.0,
                limits=QueueLimits(max_pending=max_pending, max_pairs_per_endpoint=max_pairs),
            ),
            metrics=WebhookMetrics(self.registry),
            clock=lambda: NOW,
        )

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def pending(self, account_id: str, *, due_at: float = NOW) -> DeliveryState:
        """A pair of ``account_id`` at the endpoint with one delivery waiting, stored."""
        head = Pending(
            webhook_id="msg_waiting",
            event_type="account.auth_status_changed",
            event_id="evt_waiting",
            body='{"type":"account.auth_status_changed"}',
            occurred_at="2023-11-14T22:13:10Z",
            enqueued_at=NOW - 5,
            next_attempt_at=due_at,
        )
        state = DeliveryState(
            endpoint_id="ep_1", account_id=account_id, workspace_id="ws_a", queue=(head,)
        )
        self.store.put(PARTITION, state)
        return state


def message(value: bytes | None, *, topic: str = STATUS) -> ConsumerRecord[bytes, bytes]:
    size = len(value or b"")
    return ConsumerRecord(topic, PARTITION, 41, 0, 0, b"acc_1", value, None, 5, size, [])


def event_message(account_id: str = "acc_1") -> tuple[ConsumerRecord[bytes, bytes], Any]:
    event = status_event(account_id, 1)
    return message(event.model_dump_json().encode()), event


def no_url_anywhere(*places: Any) -> None:
    text = repr(places)
    assert "sekrit-token" not in text and "/in?" not in text, "an endpoint URL leaked"


def record_context(event: Any) -> dict[str, Any]:
    return {
        "topic": STATUS,
        "partition": PARTITION,
        "offset": 41,
        "account_id": event.account_id,
        "workspace_id": "ws_a",
        "event_id": event.event_id,
        "event_type": "account.auth_status_changed",
    }


def pair_context(wid: str, account_id: str = "acc_1") -> dict[str, Any]:
    return {
        "partition": PARTITION,
        "endpoint_id": "ep_1",
        "account_id": account_id,
        "workspace_id": "ws_a",
        "webhook_id": wid,
        "event_type": "account.auth_status_changed",
    }


# -- taking events in ------------------------------------------------------------------------


async def test_an_event_taken_in_carries_its_identity_everywhere(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    s = Setup()
    msg, event = event_message()
    due = await asyncio.wait_for(s.dispatcher.handle(msg), 5)

    assert due == ["ep_1/acc_1"]
    assert s.publisher.calls == [("send_states", record_context(event))]
    assert passkey_attributes(one_span(spans, f"process {STATUS}")) == {
        "passkey.account_id": event.account_id,
        "passkey.event_id": event.event_id,
        "passkey.webhook.due": 1,
    }
    assert s.value("passkey_webhook_deliveries_taken_in_total") == 1
    assert log_fields() == {}, "the context ends with the record"


async def test_an_event_behind_a_waiting_delivery_is_taken_in_and_not_due(
    spans: InMemorySpanExporter,
) -> None:
    s = Setup()
    s.pending("acc_1", due_at=NOW + 60)
    msg, event = event_message()
    assert await asyncio.wait_for(s.dispatcher.handle(msg), 5) == []

    assert s.publisher.what() == ["send_states", "log_pending"]
    assert all(context == record_context(event) for _, context in s.publisher.calls)
    span = one_span(spans, f"process {STATUS}")
    assert passkey_attributes(span)["passkey.webhook.due"] == 0
    assert s.value("passkey_webhook_deliveries_taken_in_total") == 1


async def test_a_new_pair_of_an_endpoint_at_its_cap_waits_in_line_and_is_not_due() -> None:
    """Its endpoint's attempts at their cap: the event's new pair is put in the endpoint's
    line at take-in (one deferral counted), not handed back due to be refused by a
    follow-up; a slot freed wakes it and it is delivered."""
    s = Setup()
    gate = s.dispatcher.gate
    for i in range(gate.config.max_in_flight):
        one = gate.admit(
            "ep_1",
            revision=1,
            rate_limit=None,
            partition=PARTITION,
            key=f"ep_1/busy{i}",
            now=NOW,
            workspace_id="ws_a",
        )
        assert one.admitted
    msg, _ = event_message()
    assert await asyncio.wait_for(s.dispatcher.handle(msg), 5) == []
    assert gate.waiting("ep_1") == 1
    assert s.value("passkey_webhook_attempts_deferred_total", reason="capacity") == 1
    assert s.sender.urls == []

    gate.release("ep_1", ok=True, now=NOW)
    assert s.store.pop_due(NOW + 1, retry_at=NOW + 2) == ("ep_1/acc_1", PARTITION), "woken"
    await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, "ep_1/acc_1"), 5)
    assert s.sender.urls == [URL]
    assert s.store.pair(PARTITION, "ep_1/acc_1") is None, "delivered"


async def test_an_event_nobody_takes_is_neither_counted_nor_attributed(
    spans: InMemorySpanExporter,
) -> None:
    s = Setup(status="inactive")  # no active subscriber
    msg, _ = event_message()
    assert await asyncio.wait_for(s.dispatcher.handle(msg), 5) == []

    assert s.publisher.calls == []
    span = one_span(spans, f"process {STATUS}")
    assert passkey_attributes(span) == {"passkey.webhook.due": 0}
    assert s.value("passkey_webhook_deliveries_taken_in_total") == 0


@pytest.mark.parametrize("endpoint_id", ["ep_1", "ep_gone"])
async def test_a_replay_request_carries_its_event_and_is_attributed_when_it_has_a_target(
    spans: InMemorySpanExporter, endpoint_id: str
) -> None:
    s = Setup()
    event = status_event("acc_1", 1)
    replay = Replay(
        replay_id="rpl_1",
        endpoint_id=endpoint_id,
        workspace_id="ws_a",
        source="status",
        event=event.model_dump_json(),
    )
    msg = message(replay.model_dump_json().encode(), topic="webhook.replays")
    due = await asyncio.wait_for(s.dispatcher.handle(msg), 5)

    span = one_span(spans, "process webhook.replays")
    if endpoint_id == "ep_gone":
        assert (due, s.publisher.calls) == ([], [])
        assert passkey_attributes(span) == {"passkey.webhook.due": 0}
        return
    assert due == ["ep_1/acc_1"]
    assert s.publisher.calls == [
        ("send_states", record_context(event) | {"topic": "webhook.replays"})
    ]
    assert passkey_attributes(span) == {
        "passkey.account_id": "acc_1",
        "passkey.event_id": event.event_id,
        "passkey.webhook.due": 1,
    }
    assert s.value("passkey_webhook_deliveries_taken_in_total") == 1


async def test_a_delivery_refused_is_counted_and_logged_with_its_event(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    s = Setup(max_pending=1)
    s.pending("acc_1", due_at=NOW + 60)
    msg, event = event_message()
    assert await asyncio.wait_for(s.dispatcher.handle(msg), 5) == []

    assert s.publisher.what() == ["dead_letter", "log_finished", "send_states"]
    assert all(context == record_context(event) for _, context in s.publisher.calls)
    (refused,) = [e for e in logged if e["event"] == "delivery_refused"]
    assert refused == {
        **record_context(event),
        "event": "delivery_refused",
        "log_level": "warning",
        "reason": "queue_full",
        "endpoint_id": "ep_1",
        "webhook_id": webhook_id(event.event_id, "ep_1"),
        "pending": 1,
    }
    assert s.value("passkey_webhook_deliveries_refused_total") == 1
    assert s.value("passkey_webhook_deliveries_failed_total") == 1
    assert s.value("passkey_webhook_deliveries_taken_in_total") == 0
    no_url_anywhere(logged, s.publisher.calls)


async def test_a_delivery_refused_at_its_endpoints_cap_of_pairs_says_so(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    """A delivery that would open one pair more than its endpoint may have pending in the
    partition is logged as ``endpoint_queue_full`` (``pending``: the endpoint's pairs), not
    as a full queue of its own pair."""
    s = Setup(max_pairs=1)
    s.pending("acc_other", due_at=NOW + 60)
    msg, event = event_message()
    assert await asyncio.wait_for(s.dispatcher.handle(msg), 5) == []

    assert s.publisher.what() == ["dead_letter", "log_finished"]
    (refused,) = [e for e in logged if e["event"] == "delivery_refused"]
    assert refused == {
        **record_context(event),
        "event": "delivery_refused",
        "log_level": "warning",
        "reason": "endpoint_queue_full",
        "endpoint_id": "ep_1",
        "webhook_id": webhook_id(event.event_id, "ep_1"),
        "pending": 1,
    }
    assert s.value("passkey_webhook_deliveries_refused_total") == 1
    assert s.value("passkey_webhook_deliveries_failed_total") == 1


async def test_an_undecodable_record_is_counted_once_its_copy_is_in_the_dlq(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    s = Setup()
    assert await asyncio.wait_for(s.dispatcher.handle(message(b'{"type": "auth_st')), 5) == []

    where = {"topic": STATUS, "partition": PARTITION, "offset": 41}
    assert s.publisher.calls == [("dead_letter_record", where)], "nothing of it is context"
    (line,) = [e for e in logged if e["event"] == "event_undecodable"]
    assert line == {**where, "event": "event_undecodable", "log_level": "error"} | {
        "error": "ValidationError"
    }
    assert passkey_attributes(one_span(spans, f"process {STATUS}")) == {"passkey.webhook.due": 0}
    assert s.value("passkey_webhook_undecodable_events_total") == 1
    assert s.value("passkey_webhook_dlq_records_total", reason="undecodable") == 1


async def test_an_undecodable_record_whose_copy_failed_counts_nothing(
    logged: list[MutableMapping[str, Any]],
) -> None:
    s = Setup(publisher=NotingPublisher(failing="dead_letter_record"))
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(s.dispatcher.handle(message(None)), 5)

    assert [e for e in logged if e["event"] == "event_undecodable"] == []
    assert s.value("passkey_webhook_undecodable_events_total") == 0
    assert s.value("passkey_webhook_dlq_records_total", reason="undecodable") == 0
    assert log_fields() == {}


async def test_a_record_let_go_is_counted_by_its_reason() -> None:
    s = Setup()
    msg, _ = event_message()
    await asyncio.wait_for(s.dispatcher.recover(msg, Fault("handler_failed", "boom")), 5)

    where = {"topic": STATUS, "partition": PARTITION, "offset": 41}
    assert s.publisher.calls == [("dead_letter_record", where)]
    assert s.value("passkey_webhook_dlq_records_total", reason="handler_failed") == 1
    assert s.value("passkey_webhook_undecodable_events_total") == 0


# -- attempting deliveries -------------------------------------------------------------------


async def test_a_delivery_carries_its_pair_everywhere_and_its_latency_is_observed(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    s = Setup()
    msg, event = event_message()
    (key,) = await asyncio.wait_for(s.dispatcher.handle(msg), 5)
    s.publisher.calls.clear()
    await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, key), 5)

    wid = webhook_id(event.event_id, "ep_1")
    assert s.sender.urls == [URL]
    assert s.publisher.calls == [
        ("send_states", pair_context(wid)),
        ("log_finished", pair_context(wid)),
    ]
    attempt = one_span(spans, "POST webhook")
    assert attempt.kind == SpanKind.CLIENT
    assert attempt.parent is not None
    assert attempt.parent.span_id == one_span(spans, f"process {STATUS}").context.span_id
    assert dict(attempt.attributes or {}) == {
        "http.request.method": "POST",
        "passkey.endpoint_id": "ep_1",
        "passkey.account_id": "acc_1",
        "passkey.webhook_id": wid,
        "passkey.webhook.event_type": "account.auth_status_changed",
        "passkey.webhook.attempt": 1,
        "passkey.webhook.outcome": "delivered",
        "server.address": "hooks.example.test",
        "server.port": 8443,
        "http.response.status_code": 204,
    }
    assert s.value("passkey_webhook_delivery_latency_seconds_count") == 1
    assert s.value("passkey_webhook_attempts_total", result="delivered", status_class="2xx") == 1
    assert s.value("passkey_webhook_retries_scheduled_total") == 0
    assert s.value("passkey_webhook_deliveries_failed_total") == 0
    assert log_fields() == {}
    no_url_anywhere(logged, s.publisher.calls)


class HeldSender(AnsweringSender):
    """Answers once ``go`` is set; ``fail``: raises instead (an answer that broke the sender)."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.fail = fail

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult:
        await self.go.wait()
        if self.fail:
            raise RuntimeError("broke")
        return await super().post(url, body, headers)


@pytest.mark.parametrize("fail", [False, True], ids=["answered", "raised"])
async def test_the_attempts_under_way_are_read_when_scraped(fail: bool) -> None:
    """``passkey_webhook_inflight_attempts`` is the dispatcher's count, read at the scrape:
    one while an attempt waits for its answer, none once it ended, however it ended."""
    sender = HeldSender(fail=fail)
    s = Setup(sender=sender)
    msg, _ = event_message()
    (key,) = await asyncio.wait_for(s.dispatcher.handle(msg), 5)
    assert s.value("passkey_webhook_inflight_attempts") == 0
    attempt = asyncio.create_task(s.dispatcher.follow_up(PARTITION, key))
    for _ in range(100):
        if s.value("passkey_webhook_inflight_attempts") == 1:
            break
        await asyncio.sleep(0.01)
    assert s.value("passkey_webhook_inflight_attempts") == 1
    sender.go.set()
    await asyncio.wait_for(attempt, 5)
    assert s.value("passkey_webhook_inflight_attempts") == 0


async def test_a_rejected_attempt_is_counted_as_a_retry(
    spans: InMemorySpanExporter,
) -> None:
    s = Setup(sender=AnsweringSender(500))
    state = s.pending("acc_1")
    await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, state.key), 5)

    assert s.publisher.what() == ["send_states", "log_retry"]
    assert all(ctx == pair_context("msg_waiting") for _, ctx in s.publisher.calls)
    attempt = one_span(spans, "POST webhook")
    assert attempt.status.status_code == StatusCode.ERROR
    assert (attempt.attributes or {})["passkey.webhook.outcome"] == "retry"
    assert (attempt.attributes or {})["error.type"] == "500"
    assert s.value("passkey_webhook_retries_scheduled_total") == 1
    assert s.value("passkey_webhook_attempts_total", result="rejected", status_class="5xx") == 1
    assert s.value("passkey_webhook_delivery_latency_seconds_count") == 0


async def test_a_retry_whose_write_failed_counts_no_retry() -> None:
    s = Setup(sender=AnsweringSender(500), publisher=NotingPublisher(failing="log_retry"))
    state = s.pending("acc_1")
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, state.key), 5)

    assert s.value("passkey_webhook_retries_scheduled_total") == 0
    assert s.value("passkey_webhook_attempts_total", result="rejected", status_class="5xx") == 1, (
        "the request was sent: the attempt itself is counted"
    )


async def test_a_failure_is_counted_after_its_dlq_copy_and_log_entry(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    s = Setup(sender=AnsweringSender(None), schedule=())  # no retry left
    state = s.pending("acc_1")
    await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, state.key), 5)

    assert s.publisher.what() == ["dead_letter", "log_finished", "send_states"]
    assert all(ctx == pair_context("msg_waiting") for _, ctx in s.publisher.calls)
    attempt = one_span(spans, "POST webhook")
    assert (attempt.attributes or {})["passkey.webhook.outcome"] == "failed"
    assert (attempt.attributes or {})["error.type"] == "not_attempted", "no answer, no error kind"
    assert s.value("passkey_webhook_deliveries_failed_total") == 1
    assert s.value("passkey_webhook_attempts_total", result="error", status_class="none") == 1
    no_url_anywhere(logged, s.publisher.calls)


async def test_a_failure_whose_dlq_copy_failed_is_not_counted() -> None:
    s = Setup(sender=AnsweringSender(None), schedule=(), publisher=NotingPublisher("dead_letter"))
    state = s.pending("acc_1")
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, state.key), 5)

    assert s.value("passkey_webhook_deliveries_failed_total") == 0
    assert s.store.pair(PARTITION, state.key) == state, "the delivery stays, to be tried again"


async def test_a_head_of_an_inactive_endpoint_fails_without_an_attempt(
    spans: InMemorySpanExporter,
) -> None:
    s = Setup(status="inactive")
    state = s.pending("acc_1")
    await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, state.key), 5)

    assert s.sender.urls == []
    assert s.publisher.what() == ["dead_letter", "log_finished", "send_states"]
    attempt = one_span(spans, "POST webhook")
    assert attempt.status.status_code == StatusCode.ERROR
    assert (attempt.attributes or {})["error.type"] == "not_attempted"
    assert (attempt.attributes or {})["passkey.webhook.outcome"] == "failed"
    assert s.value("passkey_webhook_deliveries_failed_total") == 1
    assert s.value("passkey_webhook_attempts_total", result="error", status_class="none") == 0


async def test_a_pair_given_up_fails_its_head_in_its_context_without_a_span(
    spans: InMemorySpanExporter,
) -> None:
    s = Setup()
    state = s.pending("acc_1")
    await asyncio.wait_for(
        s.dispatcher.give_up(PARTITION, state.key, Fault("handler_failed", "boom")), 5
    )

    assert s.sender.urls == []
    assert s.publisher.calls == [
        ("dead_letter", pair_context("msg_waiting")),
        ("log_finished", pair_context("msg_waiting")),
        ("send_states", pair_context("msg_waiting")),
    ]
    assert [sp.name for sp in spans.get_finished_spans()] == []
    assert s.value("passkey_webhook_deliveries_failed_total") == 1


async def test_an_old_form_record_migrated_is_counted_and_logged(
    logged: list[MutableMapping[str, Any]],
) -> None:
    s = Setup()
    pair = DeliveryState(endpoint_id="ep_1", account_id="acc_9", workspace_id="ws_a")
    s.store.load(
        PARTITION,
        {
            "acc_9": AccountDeliveries(
                account_id="acc_9", workspace_id="ws_a", endpoints={"ep_1": pair}
            )
        },
    )
    await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, "acc_9"), 5)

    context = {"account_id": "acc_9", "partition": PARTITION}
    assert s.publisher.calls == [("send_states", context), ("tombstone", context)]
    (line,) = [e for e in logged if e["event"] == "delivery_state_migrated"]
    assert line == {**context, "event": "delivery_state_migrated", "log_level": "info", "pairs": 0}
    assert s.value("passkey_webhook_state_migrated_total") == 1
    await asyncio.wait_for(s.dispatcher.follow_up(PARTITION, "acc_9"), 5)
    assert s.value("passkey_webhook_state_migrated_total") == 1, "migrated once"


def test_an_attempt_counts_into_a_series_looked_up_once() -> None:
    """``WebhookMetrics.attempt`` counts through the consume loop's ``LoopSeries.child``: one
    series kept per label set, and the count is the same as through ``labels``."""
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    for _ in range(3):
        metrics.attempt(DeliveryResult(204), 0.01)
        metrics.attempt(DeliveryResult(None, error="timeout"), 0.01)
    assert metrics.child(metrics.attempts, "delivered", "2xx") is metrics.attempts.labels(
        "delivered", "2xx"
    )
    assert len(metrics._children) == 3
    sample, attempts = registry.get_sample_value, "passkey_webhook_attempts_total"
    assert sample(attempts, {"result": "delivered", "status_class": "2xx"}) == 3
    assert sample(attempts, {"result": "error", "status_class": "none"}) == 3
    assert sample("passkey_webhook_attempt_errors_total", {"kind": "timeout"}) == 3
