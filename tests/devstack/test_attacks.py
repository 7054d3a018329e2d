"""Attacks on ``make run``'s processes (issue 31, deliverable 4): one stack, started once for
the module, attacked one way per test. Each test asserts the bound at the stack level: the
attacked process's memory growth (its VmRSS in ``/proc``), another workspace's requests still
answered 200 promptly, no component exited or restarted, nothing lost.

The stack's keys file holds the dev key (workspace ``ws_demo``, with the demo endpoint) and a
second workspace's key (``ws_other``): "another workspace" is that one."""

from __future__ import annotations

import asyncio
import contextlib
import re
import statistics
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from bench.stack import children_of, role_of
from devstack.demo import register_accounts
from devstack.keys import DEV_KEY, DEV_WORKSPACE
from tests.api.test_front_door import closed_by_server, read_response
from tests.api.test_front_door_bounds import raw_connection
from tests.devstack.running_stack import RunningStack, running_stack
from worker.api.keyfile import create_key
from worker.dlq.letter import DeadLetter
from worker.engine.tail import partitions_of
from worker.engine.writes import MAX_RECORD_BYTES, record_size
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OTHER_WORKSPACE = "ws_other"
OTHER_ACCOUNT = "acc_attacks_other"
PROMPT_S = 5.0  # "answered promptly": generous, behaviour not timing
MIB = 1024 * 1024


def rss_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class Attacked:
    stack: RunningStack
    other_key: str
    pids: dict[str, int]
    settings: Settings
    lines: list[str] = field(default_factory=list)

    @property
    def dispatcher_metrics(self) -> str:
        return f"http://127.0.0.1:{self.stack.ports['WEBHOOK_METRICS_PORT']}/metrics"

    def assert_unharmed(self) -> None:
        """Every component still the process it was at start, none exited."""
        assert self.stack.proc.poll() is None, "the stack exited"
        assert roles(self.stack.proc.pid) == self.pids, "a component was restarted"
        for pid in self.pids.values():
            assert Path(f"/proc/{pid}").exists()
        log = self.stack.log()
        assert "component_exited" not in log, log[-3000:]

    async def other_served(self, source: str) -> None:
        """Another workspace's query, from ``source`` (a 127.x address), answered 200 in
        under ``PROMPT_S``."""
        transport = httpx.AsyncHTTPTransport(local_address=source)
        async with httpx.AsyncClient(
            base_url=self.stack.api,
            headers={"X-Api-Key": self.other_key},
            transport=transport,
            timeout=30,
        ) as client:
            started = time.monotonic()
            answer = await client.get(f"/v1/accounts/{OTHER_ACCOUNT}/auth")
            took = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        assert took < PROMPT_S, f"another workspace waited {took:.1f}s"


def roles(stack_pid: int) -> dict[str, int]:
    found = {}
    for pid in children_of(stack_pid):
        with contextlib.suppress(OSError):
            role = role_of(pid)
            if role is not None:
                found[role] = pid
    return found


def _drain(stack: RunningStack, into: list[str]) -> None:
    """The stack's output, read for as long as it runs (the demo receiver prints a line per
    delivery: an unread pipe would stop it)."""
    assert stack.proc.stdout is not None
    with contextlib.suppress(ValueError, OSError):
        for line in stack.proc.stdout:
            into.append(line)


#: The stack's DISPATCHER_FETCH_MAX_WAIT_MS in this module (the dev stack's default is 5 s).
DISPATCHER_WAIT_MS = 250


@pytest.fixture(scope="module")
async def attacked(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Attacked]:
    keys = tmp_path_factory.mktemp("attacks") / "keys.json"
    create_key(keys, DEV_WORKSPACE, raw_key=DEV_KEY, key_id="key_dev_demo")
    _, other_key = create_key(keys, OTHER_WORKSPACE, key_id="key_other")
    # The dispatcher's wait is pinned: what it holds at once is one fetch's worth (test 4).
    async with running_stack(
        "--demo-accounts",
        "1",
        API_KEYS_FILE=str(keys),
        DISPATCHER_FETCH_MAX_WAIT_MS=str(DISPATCHER_WAIT_MS),
    ) as stack:
        lines: list[str] = []
        threading.Thread(target=_drain, args=(stack, lines), daemon=True).start()
        await stack.until_worker_ready()
        settings = Settings(kafka_bootstrap_servers=stack.bootstrap)
        await register_accounts(settings, OTHER_WORKSPACE, [(OTHER_ACCOUNT, "sim-ok-other")])
        pids = roles(stack.proc.pid)
        assert {"worker", "dispatcher", "front-end"} <= pids.keys(), pids
        at = Attacked(stack, other_key, pids, settings, lines)
        deadline = time.monotonic() + 60
        while True:  # the registration is read: the other workspace's query answers 200
            try:
                await at.other_served("127.0.0.1")
                break
            except AssertionError:
                assert time.monotonic() < deadline, "the other workspace's account never showed"
                await asyncio.sleep(0.5)
        yield at


# -- 1. pipelining flood without an API key ---------------------------------------------------

FLOOD = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 14_000  # 378 kB in one write
FLOODERS = 8


async def test_a_pipelined_flood_never_read_holds_the_front_end_bounded(
    attacked: Attacked,
) -> None:
    pid = attacked.pids["front-end"]
    baseline = peak = rss_of(pid)
    async with contextlib.AsyncExitStack() as held:
        for _ in range(FLOODERS):
            _, writer = await held.enter_async_context(
                raw_connection(attacked.stack.api, rcvbuf=4096)
            )
            writer.write(FLOOD)
        other = asyncio.create_task(attacked.other_served("127.0.0.2"))
        until = time.monotonic() + 5
        while time.monotonic() < until:
            peak = max(peak, rss_of(pid))
            await asyncio.sleep(0.05)
        await asyncio.wait_for(other, 30)
        peak = max(peak, rss_of(pid))
    grown = peak - baseline
    assert grown < 40 * MIB, f"the front-end grew {grown / MIB:.1f} MiB under {FLOODERS} floods"
    await attacked.other_served("127.0.0.2")
    attacked.assert_unharmed()


# -- 2. connection slots of one address -------------------------------------------------------

PER_CLIENT = 100  # API_MAX_CONNECTIONS_PER_CLIENT: the stack keeps the default
TRIED = PER_CLIENT + 10


async def _try_slot(
    held: contextlib.AsyncExitStack, url: str, source: str
) -> tuple[int, asyncio.StreamReader | None]:
    """A connection from ``source`` asking /healthz, kept open; its status (0: closed
    without one)."""
    try:
        reader, writer = await held.enter_async_context(raw_connection(url, source=source))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return (await read_response(reader)).status, reader
    except (ConnectionError, asyncio.IncompleteReadError, OSError):
        return 0, None


async def test_one_address_holds_at_most_its_connection_slots(attacked: Attacked) -> None:
    url = attacked.stack.api
    source = "127.0.0.4"  # an address no other test uses: its slots are all free
    async with contextlib.AsyncExitStack() as held:
        tried = [await _try_slot(held, url, source) for _ in range(TRIED)]
        statuses = [status for status, _ in tried]
        assert statuses[:PER_CLIENT] == [200] * PER_CLIENT, statuses
        assert set(statuses[PER_CLIENT:]) <= {503, 0}, statuses
        for status, reader in tried[PER_CLIENT:]:
            if reader is not None:
                assert status == 503
                assert await closed_by_server(reader)
        await attacked.other_served("127.0.0.3")
    attacked.assert_unharmed()


# -- 3. a key of a megabyte on auth.commands --------------------------------------------------

HUGE_KEY = b"k" * 1_010_000


async def test_a_megabyte_key_is_dead_lettered_to_fit_and_the_worker_goes_on(
    attacked: Attacked,
) -> None:
    settings = attacked.settings
    account = "acc_attacks_after_huge_key"
    await register_accounts(settings, DEV_WORKSPACE, [(account, f"sim-ok-{account}")])
    commands = settings.topics.commands
    producer = AIOKafkaProducer(
        bootstrap_servers=attacked.stack.bootstrap, max_request_size=4 * MIB
    )
    await producer.start()
    try:
        parts = sorted(await producer.partitions_for(commands))
        # the account's own partition: its confirm comes after the poison there
        partition = DefaultPartitioner()(account.encode(), parts, parts)
        sent = await producer.send_and_wait(
            commands,
            b'{"type":"passkey_confirm","account_id":"acc_x"}',
            key=HUGE_KEY,
            partition=partition,
        )
    finally:
        await producer.stop()
    async with httpx.AsyncClient(
        base_url=attacked.stack.api, headers={"X-Api-Key": DEV_KEY}, timeout=30
    ) as client:
        answer = await client.post(f"/v1/accounts/{account}/auth/passkey-confirm")
    assert answer.status_code == 200, answer.text
    letter = await _dead_letter_of(settings, f"{commands}:{partition}:{sent.offset}")
    assert letter.truncated == ("key",)
    size = record_size(letter.value, letter.key, [(k, v or b"") for k, v in letter.headers])
    assert size <= MAX_RECORD_BYTES, size
    await attacked.other_served("127.0.0.1")
    attacked.assert_unharmed()


async def _dead_letter_of(settings: Settings, source: str) -> DeadLetter:
    """The dead letter on auth.dlq whose source is ``source`` (waited for up to 30 s)."""
    topic = settings.topics.dlq
    reader = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        enable_auto_commit=False,
        fetch_max_bytes=8 * MIB,
        max_partition_fetch_bytes=4 * MIB,
    )
    await reader.start()
    try:
        parts = await partitions_of(reader, topic, deadline=time.monotonic() + 30)
        tps = [TopicPartition(topic, p) for p in parts]
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = await reader.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    letter = DeadLetter.of(r)
                    if str(letter.source) == source:
                        return letter
        raise AssertionError(f"no dead letter of {source} on {topic}")
    finally:
        await reader.stop()


# -- 4. confirms on made-up account ids ------------------------------------------------------

MADE_UP = 2_000
#: The demo receiver's line for one verified error event of a made-up account.
DELIVERED = re.compile(r" (acc_madeup_\d+) error .*\[signature ok\]")


async def _metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(url)).text
    values = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line and line.split()[0].split("{")[0] == name
    ]
    assert values, f"{name} not exported"
    return sum(values)


async def test_confirms_on_made_up_accounts_leave_the_dispatcher_small(
    attacked: Attacked,
) -> None:
    pid = attacked.pids["dispatcher"]
    state = "passkey_webhook_state_store_accounts"
    baseline = peak_rss = rss_of(pid)
    peak_state = 0.0
    gate = asyncio.Semaphore(40)
    ids = [f"acc_madeup_{i}" for i in range(MADE_UP)]

    async def confirm(client: httpx.AsyncClient, account: str) -> int:
        async with gate:
            return (await client.post(f"/v1/accounts/{account}/auth/passkey-confirm")).status_code

    async with (
        httpx.AsyncClient(
            base_url=attacked.stack.api, headers={"X-Api-Key": DEV_KEY}, timeout=60
        ) as client,
        httpx.AsyncClient(timeout=10) as scraper,
    ):
        flood = asyncio.gather(*(confirm(client, a) for a in ids))
        while not flood.done():
            peak_rss = max(peak_rss, rss_of(pid))
            peak_state = max(peak_state, await _metric(scraper, attacked.dispatcher_metrics, state))
            await asyncio.sleep(0.2)
        statuses = await flood
        assert set(statuses) == {404}, {s: statuses.count(s) for s in set(statuses)}
        # Nothing lost: the demo receiver gets every error event (it prints one line each).
        wanted = {f"{a} error" for a in ids}
        deadline = time.monotonic() + 120
        while True:
            printed = {
                f"{m[1]} error" for line in list(attacked.lines) if (m := DELIVERED.search(line))
            }
            peak_rss = max(peak_rss, rss_of(pid))
            peak_state = max(peak_state, await _metric(scraper, attacked.dispatcher_metrics, state))
            if wanted <= printed:
                break
            missing = len(wanted - printed)
            assert time.monotonic() < deadline, f"{missing} error events never delivered"
            await asyncio.sleep(0.5)
    grown = peak_rss - baseline
    # What it holds at once is what is pending: about one fetch's worth of events (the flood's
    # rate times the dispatcher's fetch wait, DISPATCHER_WAIT_MS here), never the accounts seen.
    assert peak_state <= MADE_UP // 10, peak_state
    assert grown < 30 * MIB, f"the dispatcher grew {grown / MIB:.1f} MiB"
    await attacked.other_served("127.0.0.1")
    attacked.assert_unharmed()


# -- 5. webhook URLs built to be slow to check ------------------------------------------------

SLOW_URL = "https://a.example/" + "?" * 2_030 + " "


async def test_adversarial_webhook_urls_are_refused_at_once(attacked: Attacked) -> None:
    took: list[float] = []
    async with httpx.AsyncClient(
        base_url=attacked.stack.api, headers={"X-Api-Key": DEV_KEY}, timeout=30
    ) as client:
        for _ in range(20):
            started = time.monotonic()
            answer = await client.post("/v1/webhook-endpoints", json={"url": SLOW_URL})
            took.append(time.monotonic() - started)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "invalid_request", answer.text
            assert "longer than 2048" in answer.json()["error"]["message"], answer.text
    assert statistics.median(took) < 1.0, took
    await attacked.other_served("127.0.0.1")
    attacked.assert_unharmed()
