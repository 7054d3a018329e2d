"""Hostile input against the whole stack (``make run``'s processes): poison records on
auth.commands, then ordinary flows on the same partitions. Every flow is answered, the poison
is in auth.dlq with its reason, and no component exits (docs/architecture.md, "Failure
handling"). The stack runs with ``LOG_FORMAT=json``: its components' log lines, the
libraries' included, are all JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from confluent_kafka import Producer

from devstack.demo import register_accounts
from devstack.keys import DEV_WORKSPACE
from tests.devstack.running_stack import RunningStack, running_stack
from tests.unparsable import produce_unparsable
from worker.engine.tail import partitions_of
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.chaos]

ACCOUNTS = [f"acc_hostile_{i}" for i in range(12)]


def _poison() -> list[tuple[bytes, bytes | None]]:
    """What a writer of auth.commands with bad intent sends, keyed onto the accounts' own
    partitions."""
    deep_array = b"[" * 20_000 + b"]" * 20_000  # 40 KB: under the size limit
    deep_object = b'{"a":' * 9_000 + b"1" + b"}" * 9_000
    nested_field = (
        b'{"type":"passkey_confirm","account_id":"acc_hostile_2","workspace_id":'
        + b"[" * 10_000
        + b"]" * 10_000
        + b"}"
    )
    huge_number = b'{"type":"passkey_confirm","account_id":"acc_hostile_3","command_id":1' + (
        b"0" * 4_000 + b"}"
    )
    return [
        (b"acc_hostile_0", deep_array),
        (b"acc_hostile_1", deep_object),
        (b"acc_hostile_2", nested_field),
        (b"acc_hostile_3", huge_number),
        (b"acc_hostile_4", b"\xff\xfe\x00 not json at all"),
        (b"acc_hostile_5", None),
    ]


#: What hostile receivers answer a delivery with (each on its own loopback listener).
HOSTILE_ANSWERS: dict[str, bytes] = {
    "retry-after-400-digits": b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: "
    + b"9" * 400
    + b"\r\nContent-Length: 0\r\n\r\n",
    "retry-after-1e12": b"HTTP/1.1 503 Busy\r\nRetry-After: 1000000000000\r\n"
    b"Content-Length: 0\r\n\r\n",
    "malformed-status-line": b"HTTP/1.1 2OO OK\r\n\r\n",
    "garbage-headers": b"HTTP/1.1 200 OK\r\n\xff\xfe: \x00\r\nContent-Length: x\r\n\r\n",
    "drip": b"",  # sends its answer one byte a second
}


@contextlib.asynccontextmanager
async def hostile_receivers() -> AsyncIterator[dict[str, str]]:
    """One listener per ``HOSTILE_ANSWERS`` entry; yields their URLs by name."""
    servers: list[asyncio.Server] = []

    def answering(answer: bytes) -> Callable[..., Awaitable[None]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.readuntil(b"\r\n\r\n")
                if answer:
                    writer.write(answer)
                    await writer.drain()
                else:
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello":
                        writer.write(bytes([byte]))
                        await writer.drain()
                        await asyncio.sleep(1)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        return serve

    urls = {}
    for name, answer in HOSTILE_ANSWERS.items():
        server = await asyncio.start_server(answering(answer), "127.0.0.1", 0)
        servers.append(server)
        urls[name] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    try:
        yield urls
    finally:
        for server in servers:
            server.close()


async def test_poison_records_stop_nothing_and_the_next_flows_are_answered() -> None:
    async with (
        running_stack("--demo-accounts", "1", LOG_FORMAT="json") as stack,
        hostile_receivers() as receivers,
    ):
        await stack.until_worker_ready()
        headers = {"X-Api-Key": "dev-key-ws-demo"}
        async with httpx.AsyncClient(base_url=stack.api, headers=headers, timeout=30) as client:
            for url in receivers.values():
                created = await client.post("/v1/webhook-endpoints", json={"url": url})
                assert created.status_code == 201, created.text
        settings = Settings(kafka_bootstrap_servers=stack.bootstrap)
        await register_accounts(settings, DEV_WORKSPACE, [(a, f"sim-ok-{a}") for a in ACCOUNTS])
        producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap)
        await producer.start()
        try:
            for key, value in _poison():
                await producer.send_and_wait(settings.topics.commands, value, key=key)
        finally:
            await producer.stop()
        # A record the Kafka client cannot parse (a header key that is not UTF-8), and one
        # with neither key nor value (aiokafka will not write one; librdkafka will).
        await produce_unparsable(stack.bootstrap, settings.topics.commands, 0, "acc_hostile_6")
        rd = Producer({"bootstrap.servers": stack.bootstrap})
        rd.produce(settings.topics.commands, value=None, key=None, partition=1)
        assert await asyncio.to_thread(rd.flush, 10) == 0
        async with httpx.AsyncClient(base_url=stack.api, headers=headers, timeout=30) as client:
            answers = await asyncio.gather(
                *(client.post(f"/v1/accounts/{a}/auth/passkey-confirm") for a in ACCOUNTS)
            )
        assert [r.status_code for r in answers] == [200] * len(ACCOUNTS), stack.log()[-6000:]
        reasons = await _dead_letter_reasons(
            stack.bootstrap, settings.topics.dlq, len(_poison()) + 2
        )
        assert sorted(reasons) == ["invalid", *["not_json"] * 6, "unreadable"], reasons
        # Beside the hostile receivers, the demo receiver (verifying signatures) got the
        # status change of every account.
        printed = await asyncio.wait_for(_until_printed(stack, {f"{a} v2 " for a in ACCOUNTS}), 60)
        assert all("[signature ok]" in line for line in printed), printed
        log = stack.log()
        assert "component_exited" not in log, log[-3000:]
        assert "lane_failed" not in log
        # One log stream: every line of every component (the libraries' included) is JSON
        # that names its service.
        for line in filter(str.strip, log.splitlines()):
            assert "service" in json.loads(line), line


async def _dead_letter_reasons(bootstrap: str, topic: str, expected: int) -> list[str]:
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        parts = await partitions_of(reader, topic, deadline=time.monotonic() + 30)
        tps = [TopicPartition(topic, p) for p in parts]
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        reasons: list[str] = []
        deadline = asyncio.get_running_loop().time() + 30
        while len(reasons) < expected and asyncio.get_running_loop().time() < deadline:
            batch = await reader.getmany(timeout_ms=500)
            for records in batch.values():
                reasons += [dict(r.headers)["dlq.reason"].decode() for r in records]
        return reasons
    finally:
        await reader.stop()


async def _until_printed(stack: RunningStack, wanted: set[str]) -> list[str]:
    """The demo receiver's lines (on the stack's output) until each of ``wanted`` was in one."""
    lines: list[str] = []
    missing = set(wanted)
    while missing:
        line = await stack.read_until("webhook ")
        lines.append(line.splitlines()[-1])
        missing = {w for w in missing if w not in lines[-1]}
    return lines
