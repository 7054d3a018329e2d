"""The worker's floor (``python -m bench.proc floor``): the least a service must do for the
worker's result on the worker's libraries and settings, so ``worker ÷ floor`` says how much
of the worker's CPU is its own design (bench/README.md, "Floors").

For every fetched batch of auth.commands, as one task (batches overlap, at most
``WORKER_MAX_IN_FLIGHT`` commands in flight, as the worker):

* decode each command with the worker's own wire types (``decode_command``);
* a registration: remember the account's provider and reference (a plain dict: no store,
  no dedup window, no timers), write its state record and its status event;
* a first confirm: the provider call the worker makes for it (``POST .../passkey/confirm``
  with the command id as idempotency key) through the worker's own client
  (``build_http_client``: the same HTTP client, pool, time-outs and body cap), the answer
  parsed as JSON; then its state record, its reply (the worker's ``Reply``, so the bench
  matches it as the worker's) and its status event. A repeat confirm: state record and reply;
* every record of the batch handed to the producer at once, ONE wait for all their acks, then
  the batch's offsets committed (in fetch order, only once every earlier batch is done).

No decision, no retries, no breaker, no write-ahead, no state-before-reply ordering, no
metrics, spans or logs per command: what the worker adds above this is what the ratio counts.
The state record is a small JSON object (account, provider, reference, status, version,
command), not the worker's full record with its dedup window.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from bench.floor_loop import Batch, group_clients, serve_batches
from worker.auth.provider import build_http_client
from worker.auth.provider.transport import ProviderHttpClient
from worker.contract.messages import (
    AuthData,
    AuthStatusChanged,
    PasskeyConfirm,
    RegisterAccount,
    Reply,
    ReplyBody,
    decode_command,
    event_id,
    rfc3339,
)
from worker.settings import Settings


@dataclass(slots=True)
class Account:
    """What the floor keeps per account: enough to call the provider and number versions."""

    workspace_id: str
    provider: str
    ref: str
    status: str
    version: int
    confirmed: bool = False


class WorkerFloor:
    """One consumer, one producer, one provider client; see the module docstring."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.producer, self.consumer = group_clients(
            settings, settings.topics.commands, settings.kafka_consumer_group
        )
        self.http: ProviderHttpClient = build_http_client(settings)
        self.urls = {name: url.rstrip("/") for name, url in settings.provider_urls.items()}
        self.accounts: dict[str, Account] = {}

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await serve_batches(
                self.producer,
                self.consumer,
                self.handle,
                limit=self.settings.worker_max_in_flight,
                max_records=self.settings.kafka_max_poll_records,
                stop=stop,
            )
        finally:
            await self.http.aclose()

    async def handle(self, batch: Batch) -> None:
        """Every command of ``batch``: calls concurrently, then all records, one ack wait."""
        records: list[tuple[str, bytes, bytes, int | None]] = []
        calls: list[asyncio.Task[tuple[int, dict[str, Any]]]] = []
        confirms: list[tuple[PasskeyConfirm, Account, int]] = []
        for tp, msgs in batch.items():
            for msg in msgs:
                command = decode_command(msg.key, msg.value)
                if isinstance(command, RegisterAccount):
                    records.extend(self.register(command, tp.partition))
                elif isinstance(command, PasskeyConfirm):
                    account = self.accounts.get(command.account_id)
                    if account is None:
                        continue  # the benchmark registers every account first
                    if account.confirmed:
                        records.extend(self.repeat(command, account, tp.partition))
                        continue
                    account.confirmed = True
                    confirms.append((command, account, tp.partition))
                    calls.append(asyncio.create_task(self.confirm(command, account)))
        if calls:
            answers = await asyncio.gather(*calls)
            for (command, account, partition), (status, body) in zip(
                confirms, answers, strict=True
            ):
                records.extend(self.confirmed(command, account, partition, status, body))
        futures = [
            await self.producer.send(topic, value, key=key, partition=partition)
            for topic, key, value, partition in records
        ]
        await asyncio.gather(*futures)

    async def confirm(
        self, command: PasskeyConfirm, account: Account
    ) -> tuple[int, dict[str, Any]]:
        """The worker's provider call for a first confirm; (status, JSON body or {})."""
        headers = {"Idempotency-Key": command.command_id, "Accept": "application/json"}
        try:
            url = f"{self.urls[account.provider]}/v1/accounts/{quote(account.ref, safe='')}"
            answer = await self.http.request("POST", url + "/passkey/confirm", headers=headers)
            body = json.loads(answer.body) if answer.ok else {}
        except Exception:  # a minimal service answers a failed call, it does not crash
            return 502, {}
        return answer.status, body if isinstance(body, dict) else {}

    def register(
        self, command: RegisterAccount, partition: int
    ) -> list[tuple[str, bytes, bytes, int | None]]:
        account = Account(
            command.workspace_id,
            command.provider or "",
            command.provider_account_ref or "",
            command.status,
            1,
        )
        self.accounts[command.account_id] = account
        return [
            self.state(command.account_id, account, command.command_id, partition),
            self.event(command.account_id, account, None, command.command_id),
        ]

    def repeat(
        self, command: PasskeyConfirm, account: Account, partition: int
    ) -> list[tuple[str, bytes, bytes, int | None]]:
        return [
            self.state(command.account_id, account, command.command_id, partition),
            self.reply(command, account, 200),
        ]

    def confirmed(
        self,
        command: PasskeyConfirm,
        account: Account,
        partition: int,
        status: int,
        body: dict[str, Any],
    ) -> list[tuple[str, bytes, bytes, int | None]]:
        new = body.get("status")
        if not (200 <= status < 300 and isinstance(new, str)):
            return [self.reply(command, account, 502)]
        previous = account.status
        account.status, account.version = new, account.version + 1
        return [
            self.state(command.account_id, account, command.command_id, partition),
            self.reply(command, account, 200),
            self.event(command.account_id, account, previous, command.command_id),
        ]

    def state(
        self, account_id: str, account: Account, command_id: str, partition: int
    ) -> tuple[str, bytes, bytes, int | None]:
        value = json.dumps(
            {
                "account_id": account_id,
                "workspace_id": account.workspace_id,
                "provider": account.provider,
                "provider_account_ref": account.ref,
                "status": account.status,
                "version": account.version,
                "command_id": command_id,
                "updated_at": time.time(),
            },
            separators=(",", ":"),
        ).encode()
        return self.topics.state, account_id.encode(), value, partition

    def reply(
        self, command: PasskeyConfirm, account: Account, http_status: int
    ) -> tuple[str, bytes, bytes, int | None]:
        data = AuthData(
            account_id=command.account_id, status=account.status, auth_status=account.status
        )
        reply = Reply(
            command_id=command.command_id,
            request_id=command.request_id,
            account_id=command.account_id,
            http_status=http_status,
            body=ReplyBody(request_id=command.request_id, data=data),
            version=account.version,
        )
        value = reply.model_dump_json(exclude_none=True).encode()
        return self.topics.replies, command.account_id.encode(), value, None

    def event(
        self, account_id: str, account: Account, previous: str | None, command_id: str
    ) -> tuple[str, bytes, bytes, int | None]:
        ev = AuthStatusChanged(
            event_id=event_id("status", account_id, account.version),
            account_id=account_id,
            workspace_id=account.workspace_id,
            previous_status=previous,
            status=account.status,
            auth_status=account.status,
            version=account.version,
            occurred_at=rfc3339(time.time()),
            command_id=command_id,
        )
        return self.topics.status, account_id.encode(), ev.model_dump_json().encode(), None


async def run_floor(settings: Settings, stop: asyncio.Event) -> None:
    await WorkerFloor(settings).run(stop)
