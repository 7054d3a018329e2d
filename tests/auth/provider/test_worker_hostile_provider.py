"""The worker on a real broker against a hostile provider: the confirm succeeds, then every
follow-up poll gets an answer built to break a parser (nested JSON 100k levels deep, a gzip
bomb, invalid UTF-8, a 50 MB body). Each poll fails as a catalogued provider error and is
rescheduled; the worker keeps answering commands."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.auth.provider.hostile import (
    DEEP,
    STATE,
    HostileProvider,
    http,
    written,
    zeros_gzipped,
)
from tests.harness import bus, confirm_cmd, register_cmd, running_worker
from worker.auth.provider.answer import DEFAULT_BODY_CAP

pytestmark = pytest.mark.integration

POLLS = 3


POISONED: dict[str, Callable[[], bytes]] = {
    "nested-100k": lambda: http(b"200 OK", DEEP),
    "gzip-bomb": lambda: http(b"200 OK", zeros_gzipped(16), b"Content-Encoding: gzip"),
    "invalid-utf8": lambda: http(b"200 OK", b'{"status":"\xff","auth_status":"\xc3\x28"}'),
    "past-the-cap": lambda: http(b"200 OK", STATE + b" " * DEFAULT_BODY_CAP),
}


@pytest.mark.parametrize(
    ("name", "cap"),
    [
        ("nested-100k", 1024 * 1024),  # a cap large enough to let it reach the JSON parser
        ("nested-100k", DEFAULT_BODY_CAP),
        ("gzip-bomb", DEFAULT_BODY_CAP),
        ("invalid-utf8", DEFAULT_BODY_CAP),
        ("past-the-cap", DEFAULT_BODY_CAP),
    ],
)
async def test_a_poisoned_follow_up_poll_does_not_stop_the_worker(
    make_settings: Any, name: str, cap: int
) -> None:
    async with HostileProvider() as provider:
        provider.by_method["POST"] = written(http(b"200 OK", STATE))
        provider.by_method["GET"] = written(POISONED[name]())
        settings = make_settings(
            provider_urls={"simulator": provider.url},
            provider_body_cap_bytes=cap,
            provider_max_attempts=1,
            worker_follow_up_poll_s=0.1,
            worker_follow_up_poll_max_s=0.2,
        )
        async with bus(settings) as b, running_worker(settings) as running:
            first, second = (f"acc-{uuid.uuid4().hex[:10]}" for _ in range(2))
            for account in (first, second):
                cmd = register_cmd(account, f"ref-{account}")
                await b.send(cmd)
            confirm = confirm_cmd(first)
            await b.send(confirm)
            assert (await b.reply_to(confirm.command_id))["http_status"] == 200
            await b.wait_for(lambda: provider.requests.count("GET") >= POLLS)
            assert not running.task.done(), "the worker is still running"
            again = confirm_cmd(second)
            await b.send(again)
            reply = await b.reply_to(again.command_id)
            assert reply["http_status"] == 200
            assert not running.task.done()
        # Still at "sent": no poll was taken for an answer.
        statuses = [e["status"] for e in b.status_events(account_id=first)]
        assert statuses == ["passkey_confirmation", "passkey_confirmation_sent"]
