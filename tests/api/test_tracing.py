"""Tracing end to end on the real broker: one confirm is one trace from the caller's
``traceparent`` through the front-end, the command, the worker, the provider (the simulator
records the ``traceparent`` it received), the outputs and a webhook delivery; and with no
exporter the caller's context still reaches every hop (``worker.runtime.tracing``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.api.conftest import ApiSettings
from tests.api.support import headers, register, running_api, running_worker, wait_until
from tests.harness import bus
from tests.observed import recorded_spans
from tests.webhooks.support import (
    Receiver,
    create_endpoint,
    endpoint_store,
    receiving,
    running_dispatcher,
)
from worker.runtime import tracing
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
CONFIRM = "/v1/accounts/{}/auth/passkey-confirm"
AUTH = "/v1/accounts/{}/auth"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    with recorded_spans() as memory:
        yield memory


def parts(traceparent: str | None) -> tuple[str, str, str]:
    assert traceparent is not None
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id, flags


def header(raw: list[tuple[str, bytes]], name: str) -> str | None:
    return next((v.decode() for k, v in raw if k == name), None)


def one(spans: list[ReadableSpan], name: str, kind: SpanKind) -> ReadableSpan:
    found = [s for s in spans if s.name == name and s.kind == kind]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None, span.name
    return span.parent.span_id


async def confirm_ready(http: httpx.AsyncClient, account: str) -> None:
    async def seen() -> bool:
        return (await http.get(AUTH.format(account), headers=headers())).status_code == 200

    for _ in range(400):
        if await seen():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{account} never appeared in the front-end's view")


async def sim_traceparents(simulator: str) -> dict[str, str]:
    async with httpx.AsyncClient() as http:
        stats: dict[str, Any] = (await http.get(f"{simulator}/_sim/stats")).json()
    return dict(stats["confirm_traceparents"])


async def test_one_trace_from_request_to_provider_reply_and_webhook(
    api_settings: ApiSettings, simulator: str, exporter: InMemorySpanExporter
) -> None:
    settings = api_settings(
        provider_urls={"simulator": simulator},
        webhook_secrets_key=generate_key(),
        webhook_allow_http=True,
        webhook_allow_private_targets=True,
    )
    settings = settings.model_copy(
        update={"webhook_consumer_group": f"{settings.kafka_consumer_group}.webhooks"}
    )
    topics = settings.topics
    account = f"acc_{uuid.uuid4().hex[:10]}"
    receiver = Receiver()
    async with receiving(receiver), endpoint_store(settings) as store:
        _, secret = await create_endpoint(store, "ws_a", receiver.url)
        receiver.secrets.append(secret)
        async with (
            running_worker(settings),
            running_dispatcher(settings),
            running_api(settings) as api,
            bus(settings) as outputs,
            httpx.AsyncClient(base_url=api.url, timeout=15) as http,
        ):
            await register(settings, account, f"ok-{uuid.uuid4().hex[:8]}")
            await confirm_ready(http, account)
            resp = await http.post(
                CONFIRM.format(account), headers=headers(traceparent=CALLER, tracestate="k=v")
            )
            assert resp.status_code == 200, resp.text
            await outputs.wait_for(
                lambda: bool(
                    outputs.status_events(account_id=account, status="passkey_confirmation_sent")
                )
            )
            await wait_until(
                lambda: any(
                    d.body["data"].get("status") == "passkey_confirmation_sent"
                    and d.body["data"]["account_id"] == account
                    for d in receiver.seen
                ),
                what="the webhook of the confirm",
            )
            provider_seen = await sim_traceparents(simulator)

    spans = [
        s for s in exporter.get_finished_spans() if s.context.trace_id == int(CALLER_TRACE, 16)
    ]
    server = one(spans, f"POST {CONFIRM.format('{account_id}')}", SpanKind.SERVER)
    assert parent_of(server) == int(CALLER_SPAN, 16), "the caller's span is the parent"
    assert server.attributes is not None
    assert server.attributes["http.response.status_code"] == 200
    produce = one(spans, f"send {topics.commands}", SpanKind.PRODUCER)
    process = one(spans, f"process {topics.commands}", SpanKind.CONSUMER)
    decide = one(spans, "decide", SpanKind.INTERNAL)
    client = one(spans, "POST /v1/accounts/{ref}/passkey/confirm", SpanKind.CLIENT)
    publish = one(spans, "send", SpanKind.PRODUCER)
    receive = one(spans, f"receive {topics.replies}", SpanKind.CONSUMER)
    take_in = one(spans, f"process {topics.status}", SpanKind.CONSUMER)
    deliver = one(spans, "POST webhook", SpanKind.CLIENT)
    assert parent_of(produce) == server.context.span_id
    assert parent_of(process) == produce.context.span_id, "the command carried the context"
    assert parent_of(decide) == process.context.span_id
    assert parent_of(client) == process.context.span_id
    assert parent_of(publish) == process.context.span_id
    assert parent_of(receive) == server.context.span_id
    assert parent_of(take_in) == publish.context.span_id, "the status event carried it"
    assert parent_of(deliver) == take_in.context.span_id, "the delivery stored it"
    assert process.attributes is not None and process.attributes["passkey.account_id"] == account
    assert process.attributes["passkey.verdict"] == "ok"
    assert receive.attributes is not None and receive.attributes["passkey.reply.received"]
    assert deliver.attributes is not None
    assert deliver.attributes["http.response.status_code"] == 204
    assert process.resource.attributes["service.name"] == "passkey-test"

    command_id = str(process.attributes["passkey.command_id"])
    client_id = f"{client.context.span_id:016x}"
    assert parts(provider_seen.get(command_id)) == (CALLER_TRACE, client_id, "01")

    status = [
        raw
        for _, value, raw in outputs.raw[topics.status]
        if value is not None and b"passkey_confirmation_sent" in value and account.encode() in value
    ]
    assert status, "the status event was read"
    assert parts(header(status[0], "traceparent"))[:2] == (
        CALLER_TRACE,
        f"{publish.context.span_id:016x}",
    )
    assert header(status[0], "tracestate") == "k=v", "the caller's tracestate travels too"
    replies = [
        raw
        for _, value, raw in outputs.raw[topics.replies]
        if value and command_id.encode() in value
    ]
    assert parts(header(replies[0], "traceparent"))[0] == CALLER_TRACE
    delivered = [
        d
        for d in receiver.seen
        if d.body["data"]["account_id"] == account
        and d.body["data"].get("status") == "passkey_confirmation_sent"
    ]
    assert parts(delivered[0].traceparent) == (
        CALLER_TRACE,
        f"{deliver.context.span_id:016x}",
        "01",
    )


async def test_without_an_exporter_the_callers_context_passes_through(
    api_settings: ApiSettings, simulator: str
) -> None:
    assert not tracing.recording()
    settings = api_settings(provider_urls={"simulator": simulator})
    traced, untraced = (f"acc_{uuid.uuid4().hex[:10]}" for _ in range(2))
    async with (
        running_worker(settings),
        running_api(settings) as api,
        bus(settings) as outputs,
        httpx.AsyncClient(base_url=api.url, timeout=15) as http,
    ):
        for account in (traced, untraced):
            await register(settings, account, f"ok-{uuid.uuid4().hex[:8]}")
            await confirm_ready(http, account)
        ok = await http.post(CONFIRM.format(traced), headers=headers(traceparent=CALLER))
        fresh = await http.post(CONFIRM.format(untraced), headers=headers())
        assert (ok.status_code, fresh.status_code) == (200, 200)
        for account in (traced, untraced):
            await outputs.wait_for(
                lambda a=account: bool(  # type: ignore[misc]
                    outputs.status_events(account_id=a, status="passkey_confirmation_sent")
                )
            )
        provider_seen = await sim_traceparents(simulator)

    def status_traceparent(account: str) -> str | None:
        raw = next(
            raw
            for _, value, raw in outputs.raw[settings.topics.status]
            if value and b"passkey_confirmation_sent" in value and account.encode() in value
        )
        return header(raw, "traceparent")

    assert status_traceparent(traced) == CALLER, "unchanged, sampled flag included"
    assert CALLER in provider_seen.values(), "the provider got the caller's traceparent"
    trace_id, _, flags = parts(status_traceparent(untraced))
    assert flags == "00", "a trace started here is not sampled: nothing is recorded"
    assert any(parts(v)[0] == trace_id for v in provider_seen.values()), "one trace id throughout"
