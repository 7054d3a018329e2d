"""What an operator sees of each way a record ends (``worker.auth.instrumentation``): the
counter and duration, the span's attributes, the ``command_failed`` line, and the command's
identity in the log context of everything logged while its outputs are sent. The executor over
an in-memory store and a publisher that notes the log context of each call (the Kafka side is
covered by tests/auth/test_worker.py, tests/engine/test_forward.py, tests/auth/test_query.py
and tests/api/test_tracing.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any

from aiokafka.structs import ConsumerRecord
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tests.observed import one_span, passkey_attributes
from worker.auth.execute import Executor
from worker.auth.flow import Policy
from worker.auth.machine import SENT
from worker.auth.metrics import WorkerMetrics
from worker.auth.provider import ProviderRegistry
from worker.auth.store import StateStore
from worker.contract.messages import AccountRecord, FollowUp, GetAuthState, PasskeyConfirm
from worker.engine.faults import Fault
from worker.engine.home_partition import Router, home_partition
from worker.runtime.logs import log_fields

PARTITIONS = 3
HOME = home_partition(b"acc_1", PARTITIONS)
TOPIC = "auth.commands"


class NotingPublisher:
    """Publishes nothing; notes each call with the log context it was made in."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _note(self, what: str) -> None:
        self.calls.append((what, log_fields()))

    async def publish(self, partition: int, decision: Any, **_: Any) -> None:
        self._note("publish")

    async def publish_all(self, partition: int, outputs: Any) -> None:
        self._note("publish")

    async def persist(self, partition: int, record: AccountRecord) -> None:
        self._note("persist")

    async def forward(self, msg: ConsumerRecord[bytes, bytes], partition: int) -> None:
        self._note("forward")

    async def dead_letter(self, msg: ConsumerRecord[bytes, bytes], fault: Fault, **_: Any) -> None:
        self._note("dead_letter")


class Setup:
    def __init__(self, store: StateStore) -> None:
        self.registry = CollectorRegistry()
        self.publisher = NotingPublisher()
        self.executor = Executor(
            store=store,
            publisher=self.publisher,  # type: ignore[arg-type]
            providers=ProviderRegistry(),
            policy=Policy(providers=()),
            metrics=WorkerMetrics(self.registry),
            router=Router(TOPIC, partitions_for_topic=lambda _: None, fallback=PARTITIONS),
        )

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


def account(status: str, **changes: Any) -> AccountRecord:
    return AccountRecord(
        account_id="acc_1",
        workspace_id="ws_a",
        status=status,
        auth_status=status,
        version=1,
        updated_at=1.0,
        **changes,
    )


def setup(*records: AccountRecord) -> Setup:
    store = StateStore()
    store.load(HOME, {r.account_id: r for r in records})
    return Setup(store)


def message(
    value: bytes, *, partition: int = HOME, offset: int = 41
) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(TOPIC, partition, offset, 0, 0, b"acc_1", value, None, 5, len(value), [])


def confirm() -> PasskeyConfirm:
    cid = str(uuid.uuid4())
    return PasskeyConfirm(
        command_id=cid,
        request_id=f"req-{cid}",
        workspace_id="ws_a",
        account_id="acc_1",
        issued_at=datetime.now(UTC),
    )


def query() -> GetAuthState:
    cid = str(uuid.uuid4())
    return GetAuthState(
        command_id=cid, request_id=f"req-{cid}", workspace_id="ws_a", account_id="acc_1"
    )


async def test_a_failed_command_carries_its_identity_everywhere(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    s = setup(account("passkey_pending"))
    command = confirm()
    await asyncio.wait_for(s.executor.handle(message(command.model_dump_json().encode())), 5)

    identity = {
        "account_id": "acc_1",
        "command_id": command.command_id,
        "request_id": command.request_id,
        "partition": HOME,
        "offset": 41,
    }
    assert s.publisher.calls == [("publish", identity)], "the outputs are sent in its context"
    (failed,) = [e for e in logged if e["event"] == "command_failed"]
    assert failed == {
        **identity,
        "event": "command_failed",
        "code": "provider_not_ready",
        "log_level": "info",
    }
    assert passkey_attributes(one_span(spans, f"process {TOPIC}")) == {
        "passkey.command.type": "passkey_confirm",
        "passkey.account_id": "acc_1",
        "passkey.command_id": command.command_id,
        "passkey.verdict": "error",
        "passkey.error.code": "provider_not_ready",
    }
    assert s.value("passkey_auth_commands_total", type="passkey_confirm", outcome="error") == 1
    assert s.value("passkey_auth_command_duration_seconds_count", type="passkey_confirm") == 1
    assert log_fields() == {}, "the context ends with the record"


async def test_a_query_is_counted_and_timed_and_nothing_more(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    s = setup()  # no account: the query's answer is a 404
    await asyncio.wait_for(s.executor.handle(message(query().model_dump_json().encode())), 5)

    assert s.publisher.calls == [("publish", {})]
    assert [e for e in logged if e["event"] == "command_failed"] == [], "a 404 is an answer"
    assert passkey_attributes(one_span(spans, f"process {TOPIC}")) == {}
    assert s.value("passkey_auth_commands_total", type="get_auth_state", outcome="error") == 1
    assert s.value("passkey_auth_command_duration_seconds_count", type="get_auth_state") == 1


async def test_a_record_that_is_no_command_is_counted_as_invalid(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    s = setup()
    await asyncio.wait_for(s.executor.handle(message(b'{"type": "passkey_confirm"')), 5)

    assert s.publisher.calls == [("dead_letter", {})], "nothing of it can be trusted as context"
    assert [e["event"] for e in logged] == ["record_dead_lettered"]
    assert passkey_attributes(one_span(spans, f"process {TOPIC}")) == {}
    assert s.value("passkey_auth_commands_total", type="unknown", outcome="invalid") == 1
    assert s.value("passkey_auth_command_duration_seconds_count", type="unknown") is None


async def test_a_command_off_its_home_is_counted_as_forwarded(
    logged: list[MutableMapping[str, Any]],
) -> None:
    s = setup(account("passkey_confirmation"))
    command = confirm()
    elsewhere = (HOME + 1) % PARTITIONS
    msg = message(command.model_dump_json().encode(), partition=elsewhere)
    await asyncio.wait_for(s.executor.handle(msg), 5)

    [(what, context)] = s.publisher.calls
    assert what == "forward" and context["command_id"] == command.command_id
    (forwarded,) = [e for e in logged if e["event"] == "command_forwarded"]
    assert forwarded["home"] == HOME and forwarded["partition"] == elsewhere
    assert forwarded["account_id"] == "acc_1" and forwarded["offset"] == 41
    assert s.value("passkey_auth_commands_forwarded_total", type="passkey_confirm") == 1
    assert s.value("passkey_auth_commands_total", type="passkey_confirm", outcome="ok") is None


async def test_a_query_off_its_home_is_forwarded_with_its_ids_on_the_line(
    logged: list[MutableMapping[str, Any]],
) -> None:
    s = setup()
    q = query()
    elsewhere = (HOME + 1) % PARTITIONS
    await asyncio.wait_for(
        s.executor.handle(message(q.model_dump_json().encode(), partition=elsewhere)), 5
    )

    assert s.publisher.calls == [("forward", {})]
    (forwarded,) = [e for e in logged if e["event"] == "command_forwarded"]
    assert forwarded["command_id"] == q.command_id and forwarded["home"] == HOME
    assert s.value("passkey_auth_commands_forwarded_total", type="get_auth_state") == 1


async def test_a_command_let_go_is_counted_as_failed(
    logged: list[MutableMapping[str, Any]],
) -> None:
    s = setup(account("passkey_confirmation"))
    command = confirm()
    msg = message(command.model_dump_json().encode())
    await asyncio.wait_for(s.executor.recover(msg, Fault("handler_failed", "boom")), 5)

    [(what, context)] = s.publisher.calls
    assert what == "dead_letter" and context["command_id"] == command.command_id
    assert s.value("passkey_auth_commands_total", type="passkey_confirm", outcome="failed") == 1
    await asyncio.wait_for(s.executor.recover(message(b"\xff"), Fault("handler_failed", "boom")), 5)
    assert s.value("passkey_auth_commands_total", type="unknown", outcome="failed") == 1


async def test_an_expired_flow_is_counted_in_a_trace_of_its_own(
    spans: InMemorySpanExporter, logged: list[MutableMapping[str, Any]]
) -> None:
    s = setup(account(SENT, follow_up=FollowUp(deadline_at=1.0, next_poll_at=1.0)))
    await asyncio.wait_for(s.executor.follow_up(HOME, "acc_1"), 5)

    assert s.publisher.calls == [("publish", {"account_id": "acc_1", "partition": HOME})]
    (expired,) = [e for e in logged if e["event"] == "follow_up_expired"]
    assert expired["account_id"] == "acc_1" and expired["partition"] == HOME
    step = one_span(spans, "follow_up")
    assert step.parent is None
    assert passkey_attributes(step) == {"passkey.account_id": "acc_1"}
    assert s.value("passkey_auth_follow_up_expired_total") == 1
    await asyncio.wait_for(s.executor.follow_up(HOME, "acc_1"), 5)
    assert s.value("passkey_auth_follow_up_expired_total") == 1, "a failed flow is not followed"


def test_a_series_is_looked_up_once_per_label_set() -> None:
    """``WorkerMetrics.child``: the series ``labels`` gives, kept once per (family, labels), so
    its cache holds no more than the series the family itself exports."""
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    for _ in range(3):
        metrics.child(metrics.status_changes, "sent").inc()
        metrics.child(metrics.errors, "provider_timeout", "1003", "504").inc()
    metrics.status_changes.labels("sent").inc()
    assert metrics.child(metrics.status_changes, "sent") is metrics.status_changes.labels("sent")
    assert len(metrics._children) == 2
    assert registry.get_sample_value("passkey_auth_status_changes_total", {"status": "sent"}) == 4
    labels = {"code": "provider_timeout", "numeric_code": "1003", "http_status": "504"}
    assert registry.get_sample_value("passkey_auth_errors_total", labels) == 3
