"""schemas/asyncapi.json: valid for the AsyncAPI project's own parser, and true to the code.

The drift test (tests/documents/test_export.py) keeps the file equal to
``asyncapi_document()``; these check that the document is one AsyncAPI tools accept
(``@asyncapi/parser``, run by Node from tests/asyncapi/) and that what it states outside the
models (topics, compaction, keys, headers) matches what the code reads and writes.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from pydantic import TypeAdapter

from worker.auth.publish import Publisher
from worker.contract.messages import ID_PATTERN
from worker.contract.topics import Topics
from worker.dispatcher.delivery import DeliveryState, Finished, Pending
from worker.dispatcher.publish import DeliveryPublisher
from worker.documents.asyncapi.components import SCHEMA_REF, WIRE_MODELS
from worker.documents.asyncapi.document import asyncapi_document
from worker.engine.faults import Fault

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = REPO / "schemas" / "asyncapi.json"
NODE_PROJECT = REPO / "tests" / "asyncapi"
# Written after a successful `npm ci`: node_modules is reused while the lock is unchanged.
STAMP = NODE_PROJECT / "node_modules" / ".installed-lock-sha256"

needs_node = pytest.mark.skipif(
    shutil.which("node") is None,
    reason="node is not installed: the AsyncAPI parser (tests/asyncapi) runs on Node",
)


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return asyncapi_document()


@pytest.fixture(scope="module")
def validator() -> list[str]:
    """``node validate.mjs``, with the pinned parser installed by ``npm ci`` when missing."""
    lock = hashlib.sha256((NODE_PROJECT / "package-lock.json").read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text() != lock:
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("node is installed but npm is not: install npm to fetch the parser")
        done = subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
            cwd=NODE_PROJECT,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
        STAMP.write_text(lock)
    node = shutil.which("node")
    assert node is not None
    return [node, str(NODE_PROJECT / "validate.mjs")]


def _validate(validator: list[str], path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*validator, str(path)], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@needs_node
def test_the_asyncapi_parser_accepts_the_document(validator: list[str]) -> None:
    done = _validate(validator, DOCUMENT)
    assert done.returncode == 0, f"AsyncAPI parser rejected the document:\n{done.stdout}"
    assert "valid AsyncAPI 3.0.0 (13 channels" in done.stdout, done.stdout


@needs_node
def test_the_parser_rejects_a_channel_with_a_missing_message(
    validator: list[str], tmp_path: Path
) -> None:
    """The validator really fails: a dangling reference is an error with a diagnostic."""
    broken = copy.deepcopy(json.loads(DOCUMENT.read_text()))
    broken["channels"]["commands"]["messages"]["gone"] = {"$ref": "#/components/messages/gone"}
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    done = _validate(validator, path)
    assert done.returncode == 1, done.stdout
    assert "channels.commands.messages.gone.$ref" in done.stdout, done.stdout
    assert "INVALID" in done.stdout


def test_every_topic_is_a_channel_at_its_default_name(
    doc: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOPIC_COMMANDS", "elsewhere.commands")
    assert asyncapi_document() == doc, "the document must not depend on TOPIC_* variables"
    defaults = Topics.model_construct().model_dump()
    addresses = {field: ch["address"] for field, ch in doc["channels"].items()}
    assert addresses == defaults


def test_compacted_topics(doc: dict[str, Any]) -> None:
    policy = {
        ch["address"]: ch["bindings"]["kafka"]["topicConfiguration"]["cleanup.policy"]
        for ch in doc["channels"].values()
    }
    assert {a for a, p in policy.items() if p == ["compact"]} == {
        "auth.state",
        "webhook.endpoints",
        "webhook.delivery-state",
        "api.presence",
        "api.idempotency",
    }


def test_keys_carry_the_id_rule(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    for name in ("AccountId", "EndpointId"):
        assert schemas[name]["pattern"] == ID_PATTERN
    keys = {
        m["name"]: m["bindings"]["kafka"]["key"]["$ref"].rsplit("/", 1)[1]
        for m in doc["components"]["messages"].values()
    }
    assert {m for m, k in keys.items() if k == "EndpointId"} == {
        "webhook_endpoint",
        "webhook_endpoint_deleted",
        "webhook_delivery",
        "webhook_delivery_batch",
    }
    assert keys["dead_lettered_command"] == "DeadLetterKey"


def test_payloads_are_the_models_own_schemas(doc: dict[str, Any]) -> None:
    """No second copy: each model's component is exactly what pydantic generates for it."""
    schemas = doc["components"]["schemas"]
    for model in WIRE_MODELS:
        generated = TypeAdapter(model).json_schema(ref_template=SCHEMA_REF)
        nested = generated.pop("$defs", {})
        assert schemas[model.__name__] == generated, model.__name__
        for name, schema in nested.items():
            assert schemas[name] == schema, name


def test_trace_context_is_optional_on_every_message(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    for message in doc["components"]["messages"].values():
        headers = schemas[message["headers"]["$ref"].rsplit("/", 1)[1]]
        assert {"traceparent", "tracestate"} <= set(headers["properties"]), message["name"]
        assert not {"traceparent", "tracestate"} & set(headers.get("required", []))


class _CapturingProducer:
    """Stands in for AIOKafkaProducer: records what a publisher sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[tuple[str, bytes]]]] = []

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[None]:
        self.sent.append((topic, headers or []))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def _assert_headers_match(written: list[tuple[str, bytes]], schema: dict[str, Any]) -> None:
    """The publisher writes exactly the required headers, each value valid for its schema."""
    assert [name for name, _ in written] == schema["required"]
    for name, raw in written:
        prop = schema["properties"][name]
        value = raw.decode()
        if "pattern" in prop:
            assert re.search(prop["pattern"], value), (name, value)
        if "enum" in prop:
            assert value in prop["enum"], (name, value)


async def test_auth_dlq_headers_are_what_the_worker_writes(doc: dict[str, Any]) -> None:
    producer = _CapturingProducer()
    record = ConsumerRecord("auth.commands", 3, 17, 0, 0, b"acc_1", b"not json", None, 5, 8, [])
    await Publisher(producer, Topics.model_construct()).dead_letter(
        record, Fault("not_json", "value is not UTF-8 JSON"), error_event=None
    )
    [(topic, headers)] = producer.sent
    assert topic == doc["channels"]["dlq"]["address"]
    _assert_headers_match(headers, doc["components"]["schemas"]["AuthDeadLetterHeaders"])


async def test_a_failed_command_keeps_its_headers_and_adds_the_faults(
    doc: dict[str, Any],
) -> None:
    """A command whose handling failed: its own headers first, then the required ``dlq.*``
    ones and the optional exception and fingerprint, each valid for its schema."""
    producer = _CapturingProducer()
    original = [("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]
    record = ConsumerRecord("auth.commands", 0, 4, 0, 0, b"acc_1", b"{}", None, 5, 2, original)
    try:
        raise KeyError("boom")
    except KeyError as exc:
        fault = Fault.of(exc, attempts=3)
    await Publisher(producer, Topics.model_construct()).dead_letter(record, fault, error_event=None)
    [(_, headers)] = producer.sent
    assert headers[0] == original[0]
    schema = doc["components"]["schemas"]["AuthDeadLetterHeaders"]
    written = dict(headers[1:])
    assert set(schema["required"]) <= set(written)
    assert set(written) <= set(schema["properties"])
    for name, raw in written.items():
        prop = schema["properties"][name]
        if "pattern" in prop:
            assert re.search(prop["pattern"], raw.decode()), (name, raw)
        if "enum" in prop:
            assert raw.decode() in prop["enum"], (name, raw)
    assert written["dlq.reason"] == b"handler_failed"
    assert written["dlq.exception"] == b"KeyError"
    assert written["dlq.attempts"] == b"3"


async def test_webhook_dlq_headers_are_what_the_dispatcher_writes(doc: dict[str, Any]) -> None:
    producer = _CapturingProducer()
    head = Pending(
        webhook_id="msg_1",
        event_type="account.auth_error",
        event_id="ev_1",
        body="{}",
        occurred_at="2026-01-01T00:00:00.000Z",
        enqueued_at=0.0,
        next_attempt_at=0.0,
    )
    finished = Finished(
        webhook_id="msg_1",
        event_type="account.auth_error",
        attempts=8,
        state="failed",
        last_status=None,
        last_error="timeout",
        finished_at=1.0,
    )
    publisher = DeliveryPublisher(producer, state_topic="s", log_topic="l", dlq_topic="webhook.dlq")
    state = DeliveryState(endpoint_id="ep_1", account_id="acc_1", workspace_id="ws_1")
    await publisher.dead_letter(state, head, finished)
    await publisher.dead_letter(state, head, finished.model_copy(update={"last_status": 500}))
    schema = doc["components"]["schemas"]["WebhookDeadLetterHeaders"]
    for topic, headers in producer.sent:
        assert topic == doc["channels"]["webhook_dlq"]["address"]
        _assert_headers_match(headers, schema)
