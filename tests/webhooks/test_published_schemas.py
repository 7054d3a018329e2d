"""The published event schemas (``schemas/event-types.json``, served by ``GET
/v1/event-types``) against what the dispatcher really sends: both event types delivered through
a running dispatcher to the suite's receiver validate, and the hook that validates every body
the suite receives does catch one that is off its schema."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.conftest import SettingsFactory
from tests.webhooks import published_schemas
from tests.webhooks.support import (
    Receiver,
    create_endpoint,
    endpoint_store,
    new_account,
    publish_events,
    receiving,
    running_dispatcher,
    status_event,
    wait_until,
)
from worker.contract.catalogue import ServiceError
from worker.contract.messages import AuthError, ErrorBody, event_id
from worker.engine.kafka import build_producer
from worker.webhooks.event_types import EVENT_CATALOGUE, catalogue_document
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration


def test_the_committed_file_is_the_catalogue() -> None:
    published = json.loads(published_schemas.PUBLISHED.read_text(encoding="utf-8"))
    assert published == json.loads(json.dumps(catalogue_document()))
    assert set(published_schemas.validators()) == {t.name for t in EVENT_CATALOGUE}


def test_each_example_is_what_the_dispatcher_renders_and_matches_its_schema() -> None:
    for kind in EVENT_CATALOGUE:
        record = kind.example.model_dump_json().encode()
        assert json.loads(kind.render(record).body) == kind.example_body()
        assert published_schemas.errors_of(kind.example_body()) == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.update(type="account.unknown"),
        lambda b: b["data"].update(extra="field"),
        lambda b: b["data"].pop("account_id"),
        lambda b: b.pop("timestamp"),
        lambda b: b["data"].update(version="3"),
    ],
)
def test_a_body_off_its_schema_is_caught(mutate: Callable[[dict[str, object]], None]) -> None:
    body = json.loads(json.dumps(EVENT_CATALOGUE[0].example_body()))
    if "version" not in body["data"]:
        body["data"]["version"] = 1
    mutate(body)
    assert published_schemas.errors_of(body)
    before = len(published_schemas.VIOLATIONS)
    published_schemas.observe(body)
    assert len(published_schemas.VIOLATIONS) == before + 1
    del published_schemas.VIOLATIONS[before:]  # seen caught: not this test's failure


async def test_both_event_types_as_delivered_match_the_published_schemas(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(
        webhook_secrets_key=generate_key(),
        webhook_allow_http=True,
        webhook_allow_private_targets=True,
    )
    settings = settings.model_copy(
        update={"webhook_consumer_group": f"{settings.kafka_consumer_group}.webhooks"}
    )
    account = new_account()
    error = AuthError(
        event_id=event_id("test", account, "error"),
        account_id=account,
        workspace_id="ws_a",
        command_id="cmd_1",
        request_id="req_1",
        http_status=409,
        error=ErrorBody.model_validate(ServiceError.of("provider_not_ready").body()),
        occurred_at="2026-01-01T00:00:00.000Z",
    )
    before = published_schemas.OBSERVED.copy()
    async with receiving(Receiver()) as receiver, endpoint_store(settings) as store:
        _, secret = await create_endpoint(store, "ws_a", receiver.url)
        receiver.secrets.append(secret)
        async with running_dispatcher(settings):
            await publish_events(settings, [status_event(account, 1)])
            producer = build_producer(settings.kafka_config())
            await producer.start()
            try:
                await producer.send_and_wait(
                    settings.topics.errors, error.model_dump_json().encode(), key=account.encode()
                )
            finally:
                await producer.stop()
            await wait_until(lambda: len(receiver.verified_once()) == 2, timeout=30)
    seen = published_schemas.OBSERVED - before
    assert seen["account.auth_status_changed"] >= 1
    assert seen["account.auth_error"] >= 1
    assert {d.body["type"] for d in receiver.verified_once().values()} == {
        "account.auth_status_changed",
        "account.auth_error",
    }


def test_the_demo_receiver_says_whether_a_body_matches_its_published_schema() -> None:
    from devstack.receiver import schema_check

    check = schema_check()
    assert check is not None  # the dev tools have jsonschema
    for kind in EVENT_CATALOGUE:
        assert check(kind.example_body()) == "schema ok"
    off = json.loads(json.dumps(EVENT_CATALOGUE[0].example_body()))
    off["data"]["status"] = 3
    assert check(off).startswith("OFF SCHEMA")
    assert check({"type": "account.unknown"}).startswith("OFF SCHEMA")
