"""Hostile receivers against the dispatcher on a real broker: an endpoint whose answers used to
end the process (a ``Retry-After`` of 400 digits or of 10^12 seconds, an attempt that raises)
is retried on the schedule like any failing endpoint, while a healthy endpoint of the same
workspace gets every event and the dispatcher keeps running."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import SettingsFactory
from tests.harness import RunningWorker, running_loop
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
from worker.dispatcher.app import run_dispatcher
from worker.dispatcher.sender import DeliveryResult, Sender, open_session
from worker.webhooks.secrets_box import generate_key
from worker.webhooks.targets import TargetPolicy

pytestmark = pytest.mark.integration

SCHEDULE = "0.2,0.2,0.2"
ATTEMPTS = 4  # one more than the schedule has waits


@pytest.fixture
def settings_for(make_settings: SettingsFactory) -> SettingsFactory:
    def factory(**overrides: Any) -> Any:
        values: dict[str, Any] = {
            "webhook_secrets_key": generate_key(),
            "webhook_allow_http": True,
            "webhook_allow_private_targets": True,
            "webhook_retry_schedule_s": SCHEDULE,
            "webhook_timeout_s": 2.0,
            # These tests count every retry of the schedule; an endpoint backing off as a
            # whole (tests/dispatcher/test_isolation.py) would space them out past the test.
            "webhook_endpoint_backoff_after": 1000,
        }
        values.update(overrides)
        settings = make_settings(**values)
        return settings.model_copy(
            update={"webhook_consumer_group": f"{settings.kafka_consumer_group}.webhooks"}
        )

    return factory


@contextlib.asynccontextmanager
async def too_many_requests(retry_after: bytes) -> AsyncIterator[tuple[str, Counter[str]]]:
    """A receiver answering every request 429 with ``retry_after``, in raw bytes; yields its
    URL and the attempts it saw per webhook-id."""
    seen: Counter[str] = Counter()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            webhook = re.search(rb"(?im)^webhook-id:\s*(\S+)", head)
            seen[webhook.group(1).decode() if webhook else "?"] += 1
            writer.write(
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: " + retry_after + b"\r\n"
                b"Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/hooks", seen
    finally:
        server.close()
        await server.wait_closed()


def still_running(running: RunningWorker) -> None:
    if running.task.done():
        running.task.result()  # raises what ended it
        raise AssertionError("the dispatcher stopped")


@pytest.mark.parametrize("retry_after", [b"9" * 400, b"1000000000000"], ids=["400-digits", "1e12"])
async def test_a_huge_retry_after_delays_no_one_and_ends_no_process(
    settings_for: SettingsFactory, retry_after: bytes
) -> None:
    settings = settings_for()
    healthy = Receiver()
    accounts = [new_account() for _ in range(3)]
    events = [status_event(a, v) for a in accounts for v in (1, 2)]
    async with (
        too_many_requests(retry_after) as (hostile_url, hostile_seen),
        receiving(healthy),
        endpoint_store(settings) as store,
    ):
        await create_endpoint(store, "ws_a", hostile_url)
        _, secret = await create_endpoint(store, "ws_a", healthy.url)
        healthy.secrets.append(secret)
        async with running_dispatcher(settings) as running:
            await publish_events(settings, events)
            await wait_until(lambda: len(healthy.verified_once()) == len(events), timeout=30)
            # The Retry-After is clamped to the schedule's longest step (0.2 s), so every
            # delivery to the hostile endpoint is retried within the test and then fails for
            # good: version 2 of each account is attempted after version 1 has failed.
            await wait_until(
                lambda: (
                    len(hostile_seen) == len(events)
                    and all(n == ATTEMPTS for n in hostile_seen.values())
                ),
                timeout=30,
            )
            # A failure is counted once its outcome is written, a moment after the last
            # attempt reached the receiver.
            await wait_until(
                lambda: (
                    running.registry.get_sample_value("passkey_webhook_deliveries_failed_total")
                    == len(events)
                ),
                timeout=30,
            )
            still_running(running)
    assert all(d.verified for d in healthy.seen)


class ExplodingFor:
    """The dispatcher's HTTP boundary: the real sender, except that attempts to one URL raise
    (an answer that broke the sender in a way nobody foresaw)."""

    def __init__(self, sender: Sender, url: str) -> None:
        self._sender = sender
        self._url = url
        self.raised = 0

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> DeliveryResult:
        if url == self._url:
            self.raised += 1
            raise RecursionError("maximum recursion depth exceeded")
        return await self._sender.post(url, body, headers)


async def test_an_attempt_that_raises_fails_that_attempt_only(
    settings_for: SettingsFactory,
) -> None:
    settings = settings_for()
    healthy = Receiver()
    doomed = Receiver()
    accounts = [new_account() for _ in range(3)]
    events = [status_event(a, v) for a in accounts for v in (1, 2)]
    async with (
        receiving(healthy),
        receiving(doomed),
        endpoint_store(settings) as store,
        open_session(TargetPolicy.of(settings)) as session,
    ):
        await create_endpoint(store, "ws_a", doomed.url)
        _, secret = await create_endpoint(store, "ws_a", healthy.url)
        healthy.secrets.append(secret)
        sender = ExplodingFor(Sender(session, timeout_s=2.0), doomed.url)
        async with running_loop(run_dispatcher, settings, sender=sender) as running:
            await publish_events(settings, events)
            await wait_until(lambda: len(healthy.verified_once()) == len(events), timeout=30)
            await wait_until(lambda: sender.raised == len(events) * ATTEMPTS, timeout=30)
            still_running(running)
            internal = running.registry.get_sample_value(
                "passkey_webhook_attempt_errors_total", {"kind": "internal"}
            )
            assert internal == len(events) * ATTEMPTS
    assert doomed.seen == []
