"""One workspace, with nothing but its own API key, tries everything that once stopped, slowed
or fooled the shared pools, while another workspace runs its ordinary flows on the same stack
(``make run``'s processes): the other's flows are all answered, its endpoint gets every event
inside the latency bound, nothing of its leaks, and no component exits (docs/operations.md,
"Quotas" and "Front-door limits"; docs/architecture.md, "Webhook fan-out")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from devstack.demo import register_accounts
from devstack.keys import DEV_KEY, DEV_WORKSPACE
from tests.devstack.running_stack import RunningStack, running_stack
from worker.api.keyfile import create_key
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.chaos]

VICTIM_HEADERS = {"X-Api-Key": DEV_KEY}


@dataclass
class Arrival:
    at: float
    body: dict[str, Any]


@dataclass
class Receiver:
    """A healthy endpoint: answers 204 at once, verifies each delivery, notes when it came."""

    secret: str = ""
    arrivals: list[Arrival] = field(default_factory=list)
    unverified: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self._note(headers, body)
                writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        writer.close()

    def _note(self, headers: dict[str, str], body: bytes) -> None:
        try:
            Webhook(self.secret).verify(body, headers)
        except Exception:
            self.unverified += 1
            return
        self.arrivals.append(Arrival(time.time(), json.loads(body)))

    def status_changes(self, accounts: set[str], version: int) -> list[Arrival]:
        return [
            a
            for a in self.arrivals
            if a.body["data"].get("account_id") in accounts
            and a.body["data"].get("version") == version
            and a.body["type"] == "account.auth_status_changed"
        ]


@contextlib.asynccontextmanager
async def listening(handler: Any) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    finally:
        server.close()


async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An endpoint that accepts and never answers."""
    with contextlib.suppress(ConnectionError):
        await reader.read(-1)
    writer.close()


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


async def flows(
    stack: RunningStack, client: httpx.AsyncClient, receiver: Receiver, prefix: str, n: int
) -> list[float]:
    """``n`` fresh accounts of the victim registered and confirmed over HTTP; returns the
    delivery latency of each confirm's status change (event time to arrival, seconds)."""
    accounts = [f"{prefix}_{i}" for i in range(n)]
    settings = Settings(kafka_bootstrap_servers=stack.bootstrap)
    await register_accounts(settings, DEV_WORKSPACE, [(a, f"sim-ok-{a}") for a in accounts])
    answers = await asyncio.gather(
        *(client.post(f"/v1/accounts/{a}/auth/passkey-confirm") for a in accounts)
    )
    assert [r.status_code for r in answers] == [200] * n, [r.text for r in answers][:3]
    deadline = time.monotonic() + 60
    while len(receiver.status_changes(set(accounts), 2)) < n:
        got = len(receiver.status_changes(set(accounts), 2))
        assert time.monotonic() < deadline, (
            f"the victim's endpoint got {got} of {n} status changes\n{stack.log()[-4000:]}"
        )
        await asyncio.sleep(0.1)
    return [
        a.at - datetime.fromisoformat(a.body["timestamp"]).timestamp()
        for a in receiver.status_changes(set(accounts), 2)
    ]


async def dispatcher_knows(
    stack: RunningStack, client: httpx.AsyncClient, receiver: Receiver, endpoint: str
) -> None:
    """Until the dispatcher holds ``endpoint`` active: it fans an event out to the endpoints its
    registry holds active when it reads the event (docs/architecture.md, "Webhook fan-out"),
    and a create is written pending, then activated, so on a loaded machine its registry can
    read the activation after the first flows' events. A test send arrives once it holds the
    endpoint active; one taken in while it still held the pending record fails unattempted
    (``endpoint_inactive``), so another is sent every few seconds until one arrives."""
    test = f"/v1/webhook-endpoints/{endpoint}/test"
    deadline = time.monotonic() + 60
    send_at = time.monotonic()
    while not any(a.body.get("test") for a in receiver.arrivals):
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"no test send came\n{stack.log()[-6000:]}")
        if now >= send_at:
            sent = await client.post(test, json={"event_type": "account.auth_status_changed"})
            assert sent.status_code in (202, 429), sent.text  # 429: the send budget; next round
            send_at = now + 5
        await asyncio.sleep(0.1)


async def test_a_hostile_workspace_stops_slows_and_sees_nothing_of_another(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys.json"
    create_key(keys, DEV_WORKSPACE, raw_key=DEV_KEY, key_id="key_victim")
    _, evil_key = create_key(keys, "ws_evil", key_id="key_evil")
    evil_headers = {"X-Api-Key": evil_key}
    victim = Receiver()
    async with (
        running_stack("--demo-accounts", "1", LOG_FORMAT="json", API_KEYS_FILE=str(keys)) as stack,
        listening(victim.serve) as victim_url,
        listening(hang) as hanging_url,
        httpx.AsyncClient(base_url=stack.api, headers=VICTIM_HEADERS, timeout=30) as client,
        httpx.AsyncClient(base_url=stack.api, headers=evil_headers, timeout=30) as evil,
    ):
        await stack.until_worker_ready()
        created = await client.post("/v1/webhook-endpoints", json={"url": victim_url})
        assert created.status_code == 201, created.text
        victim.secret = created.json()["data"]["secret"]
        await dispatcher_knows(stack, client, victim, created.json()["data"]["id"])
        alone = await flows(stack, client, victim, "acc_alone", 20)

        # The hostile workspace: endpoints in a loop, one of them hanging.
        made = [
            await evil.post("/v1/webhook-endpoints", json={"url": hanging_url}) for _ in range(40)
        ]
        statuses = [r.status_code for r in made]
        assert statuses.count(201) == 16, statuses  # WEBHOOK_ENDPOINTS_PER_WORKSPACE
        assert "quota" in made[-1].json()["error"]["message"]
        evil_endpoint = made[0].json()["data"]["id"]
        # Confirms on the victim's account ids: answered as for ids that do not exist.
        foreign = await evil.post("/v1/accounts/acc_alone_0/auth/passkey-confirm")
        unknown = await evil.post("/v1/accounts/acc_nobody_at_all/auth/passkey-confirm")
        assert foreign.status_code == unknown.status_code == 404
        assert foreign.json()["error"] == unknown.json()["error"]
        assert (await evil.get("/v1/accounts/acc_alone_0/auth")).status_code == 404
        # Replays beyond its quota; the victim's replay still starts.
        since = {"since": "2020-01-01T00:00:00Z"}
        replays = [
            await evil.post(f"/v1/webhook-endpoints/{evil_endpoint}/replay", json=since)
            for _ in range(10)
        ]
        assert {r.status_code for r in replays} <= {202, 429}
        assert 429 in {r.status_code for r in replays}
        victim_endpoint = created.json()["data"]["id"]
        own = await client.post(f"/v1/webhook-endpoints/{victim_endpoint}/replay", json=since)
        assert own.status_code == 202, own.text
        # Another workspace's endpoint is not there for it.
        peek = await evil.get(f"/v1/webhook-endpoints/{victim_endpoint}")
        assert peek.status_code == 404
        # Secrets rotated 40 times: at most the current and the previous one sign.
        for _ in range(40):
            rotated = await evil.post(f"/v1/webhook-endpoints/{evil_endpoint}/rotate-secret")
            assert rotated.status_code == 200
        # The front door: a 64 MiB header, and a head dripped a byte at a time.
        assert await _huge_header(stack) in (b"431", b"400", b"")
        assert await _dripped_head_is_cut(stack)

        # Its confirms on ids it does not own make error events for its own workspace: each
        # is a delivery to every one of its 16 hanging endpoints, beside the victim's flows.
        flood = asyncio.gather(
            *(evil.post(f"/v1/accounts/acc_void_{i}/auth/passkey-confirm") for i in range(40))
        )
        beside = await flows(stack, client, victim, "acc_beside", 20)
        assert {r.status_code for r in await flood} == {404}
        bound = max(2.0, 5 * p99(alone))
        assert p99(beside) <= bound, (p99(alone), p99(beside))
        assert victim.unverified == 0
        log = stack.log()
        assert "component_exited" not in log, log[-3000:]


async def _huge_header(stack: RunningStack) -> bytes:
    """Send a request head with a 64 MiB header; the status code answered (or b"" for a
    connection closed without one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", stack.ports["API_PORT"])
    try:
        writer.write(b"GET /v1/accounts/x/auth HTTP/1.1\r\nHost: x\r\nX-Big: ")
        with contextlib.suppress(ConnectionError):
            chunk = b"a" * (1 << 20)
            for _ in range(64):
                writer.write(chunk)
                await writer.drain()
        answer = await asyncio.wait_for(reader.read(64), 10)
        return answer[9:12]
    except (ConnectionError, TimeoutError):
        return b""
    finally:
        writer.close()


async def _dripped_head_is_cut(stack: RunningStack) -> bool:
    """A head sent one byte a second is cut off by the server (API_HEAD_TIMEOUT_S), not
    held open for as long as the client likes (bounded here at 40 s)."""
    sock = socket.create_connection(("127.0.0.1", stack.ports["API_PORT"]))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        for byte in b"GET /v1/accounts/x/auth HTTP/1.1\r\nHost: x\r\n" * 2:
            try:
                await loop.sock_sendall(sock, bytes([byte]))
            except (ConnectionError, OSError):
                return True
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(loop.sock_recv(sock, 64), 1.0) == b"":
                    return True
                return True  # an answer (408) before the head was complete
        return False
    finally:
        sock.close()
