"""The worker's floor (``python -m bench.proc floor``): the least a service must do for the
worker's result on the worker's libraries and settings, so ``worker ÷ floor`` says how much
of the worker's CPU is its own design (bench/README.md, "Floors").

For every fetched batch of auth.commands, as one task (batches overlap, at most
``WORKER_MAX_IN_FLIGHT`` commands in flight, as the worker):

* decode each command with the worker's own wire types (``decode_command``);
* each account's commands in order, across overlapping batches too: an account an earlier
  batch is still settling waits for that batch (so a repeat confirm is never decided on the
  registered record, and never calls the provider a second time);
* a registration: the account's state record and its status event;
* a first confirm: the provider call the worker makes for it (``POST .../passkey/confirm``
  with the command id as idempotency key) through the worker's own client
  (``build_http_client``: the same HTTP client, pool, time-outs and body cap), the answer
  parsed as JSON; then its state record, its reply (the worker's ``Reply``, so the bench
  matches it as the worker's) and its status event. A repeat confirm: state record and reply;
* the state record is the worker's (``AccountRecord``, ``encode_record``): what a new owner
  restores, with the follow-up timers and the dedup window of the last
  ``WORKER_DEDUP_WINDOW`` outcomes, so it is the worker's size;
* the batch's state records handed to the producer, ONE wait for their acks, then its replies
  and events, ONE more: the contract's order (a reply only once its state record is
  acknowledged, docs/architecture.md "Guarantees"), shared by the batch;
* offsets committed at the worker's cadence (``WORKER_COMMIT_INTERVAL_MS``, ``floor_loop``).

No decision table, no retries, no breaker, no write-ahead intent, no timers or follow-up polls,
no metrics, spans or logs per command: what the worker adds above this is what the ratio counts.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

from bench.floor_loop import Batch, group_clients, serve_batches
from worker.auth.provider import build_http_client
from worker.auth.provider.transport import ProviderHttpClient
from worker.contract.compact_ids import compact_id
from worker.contract.messages import (
    AccountRecord,
    AuthData,
    AuthStatusChanged,
    FollowUp,
    Outcome,
    PasskeyConfirm,
    RegisterAccount,
    Reply,
    ReplyBody,
    decode_command,
    encode_record,
    event_id,
    rfc3339,
)
from worker.settings import Settings

#: One record to produce: (topic, key, value, partition or None for the key's).
Out = tuple[str, bytes, bytes, int | None]


@dataclass(slots=True)
class Lane:
    """One account's commands of one batch, in fetch order, and what they came to."""

    partition: int
    commands: list[RegisterAccount | PasskeyConfirm] = field(default_factory=list)
    states: list[Out] = field(default_factory=list)
    outputs: list[Out] = field(default_factory=list)


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
        self.records: dict[str, AccountRecord] = {}
        # Accounts an unfinished batch is settling, with that batch's end.
        self.busy: dict[str, asyncio.Future[None]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        try:
            await serve_batches(
                self.producer,
                self.consumer,
                self.handle,
                limit=s.worker_max_in_flight,
                max_records=s.kafka_max_poll_records,
                stop=stop,
                commit_interval_s=s.worker_commit_interval_ms / 1000,
            )
        finally:
            await self.http.aclose()

    async def handle(self, batch: Batch) -> None:
        """Settle every account of ``batch`` (provider calls concurrent across accounts), then
        the states with one ack wait, then the replies and events with one more."""
        lanes: dict[str, Lane] = {}
        for tp, msgs in batch.items():
            for msg in msgs:
                command = decode_command(msg.key, msg.value)
                if isinstance(command, RegisterAccount | PasskeyConfirm):
                    lane = lanes.get(command.account_id)
                    if lane is None:
                        lane = lanes[command.account_id] = Lane(tp.partition)
                    lane.commands.append(command)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waits: list[asyncio.Task[None]] = []
        try:
            for account_id, lane in lanes.items():
                earlier = self.busy.get(account_id)
                self.busy[account_id] = done
                start = 0 if earlier is not None else self._settle_until_call(lane)
                if start < len(lane.commands):
                    waits.append(asyncio.create_task(self._lane(earlier, lane, start)))
            await asyncio.gather(*waits)
            await self._send([out for lane in lanes.values() for out in lane.states])
            await self._send([out for lane in lanes.values() for out in lane.outputs])
        finally:
            for account_id in lanes:
                if self.busy.get(account_id) is done:
                    del self.busy[account_id]
            done.set_result(None)

    async def _send(self, records: list[Out]) -> None:
        send = self.producer.send
        futures = [await send(t, v, key=k, partition=p) for t, k, v, p in records]
        await asyncio.gather(*futures)

    def _calls(self, command: RegisterAccount | PasskeyConfirm) -> bool:
        """A first confirm: the account's record awaits its challenge's confirmation."""
        record = self.records.get(command.account_id)
        return isinstance(command, PasskeyConfirm) and record is not None and record.version == 1

    def _settle_until_call(self, lane: Lane) -> int:
        """Settle ``lane``'s commands without awaiting up to the first that calls the
        provider; returns its index (the rest is a task of its own)."""
        for i, command in enumerate(lane.commands):
            if self._calls(command):
                return i
            self._settle(lane, command, None)
        return len(lane.commands)

    async def _lane(self, earlier: asyncio.Future[None] | None, lane: Lane, start: int) -> None:
        if earlier is not None:
            await asyncio.shield(earlier)
        for command in lane.commands[start:]:
            answer = await self._confirm(command) if self._calls(command) else None
            self._settle(lane, command, answer)

    async def _confirm(self, command: RegisterAccount | PasskeyConfirm) -> tuple[int, Any]:
        """The worker's provider call for a first confirm; (status, JSON body or None)."""
        record = self.records[command.account_id]
        headers = {"Idempotency-Key": command.command_id, "Accept": "application/json"}
        ref = quote(record.provider_account_ref or "", safe="")
        url = f"{self.urls[record.provider or '']}/v1/accounts/{ref}/passkey/confirm"
        try:
            answer = await self.http.request("POST", url, headers=headers)
            return answer.status, json.loads(answer.body) if answer.ok else None
        except Exception:  # a minimal service answers a failed call, it does not crash
            return 502, None

    def _settle(
        self, lane: Lane, command: RegisterAccount | PasskeyConfirm, answer: tuple[int, Any] | None
    ) -> None:
        """What ``command`` comes to: the account's new record (seen by its next command at
        once), its state record, reply and event."""
        now = time.time()
        if isinstance(command, RegisterAccount):
            registered = AccountRecord(
                account_id=command.account_id,
                workspace_id=command.workspace_id,
                status=command.status,
                auth_status=command.status,
                version=1,
                updated_at=now,
                provider=command.provider,
                provider_account_ref=command.provider_account_ref,
            )
            outcome = self._outcome(command.command_id, None, registered, None, now)
            lane.outputs.append(self._event(self._keep(lane, registered, outcome), None, command))
            return
        record = self.records.get(command.account_id)
        if record is None:
            return  # the benchmark registers every account first
        if answer is None:  # a repeat: "already sent", remembered in the window
            self._keep(lane, record, self._outcome(command.command_id, command, record, None, now))
            lane.outputs.append(self._reply(command, record, 200))
            return
        status, body = answer
        new = body.get("status") if isinstance(body, dict) else None
        if not (200 <= status < 300 and isinstance(new, str)):
            lane.outputs.append(self._reply(command, record, 502))
            return
        s = self.settings
        changed = replace(
            record,
            status=new,
            auth_status=new,
            version=record.version + 1,
            updated_at=now,
            follow_up=FollowUp(
                deadline_at=now + s.worker_follow_up_deadline_s,
                next_poll_at=now + s.worker_follow_up_poll_s,
            ),
        )
        outcome = self._outcome(command.command_id, command, changed, record.status, now)
        kept = self._keep(lane, changed, outcome)
        lane.outputs.append(self._reply(command, kept, 200))
        lane.outputs.append(self._event(kept, record.status, command))

    @staticmethod
    def _outcome(
        command_id: str,
        confirm: PasskeyConfirm | None,
        record: AccountRecord,
        previous: str | None,
        now: float,
    ) -> Outcome:
        return Outcome(
            cid=compact_id(command_id),
            rid=None if confirm is None else compact_id(confirm.request_id),
            http_status=200,
            status=record.status,
            auth_status=record.auth_status,
            version=record.version,
            at=now,
            previous_status=previous,
            changed=confirm is None or previous is not None,
        )

    def _keep(self, lane: Lane, record: AccountRecord, outcome: Outcome) -> AccountRecord:
        """``record`` with ``outcome`` in its dedup window, kept and written."""
        window = self.settings.worker_dedup_window
        kept = replace(record, recent=(*record.recent, outcome)[-window:])
        self.records[kept.account_id] = kept
        key = kept.account_id.encode()
        lane.states.append((self.topics.state, key, encode_record(kept), lane.partition))
        return kept

    def _reply(self, command: PasskeyConfirm, record: AccountRecord, http_status: int) -> Out:
        data = AuthData(
            account_id=command.account_id, status=record.status, auth_status=record.auth_status
        )
        reply = Reply(
            command_id=command.command_id,
            request_id=command.request_id,
            account_id=command.account_id,
            http_status=http_status,
            body=ReplyBody(request_id=command.request_id, data=data),
            version=record.version,
        )
        value = reply.model_dump_json(exclude_none=True).encode()
        return self.topics.replies, command.account_id.encode(), value, None

    def _event(
        self,
        record: AccountRecord,
        previous: str | None,
        command: RegisterAccount | PasskeyConfirm,
    ) -> Out:
        ev = AuthStatusChanged(
            event_id=event_id("status", record.account_id, record.version),
            account_id=record.account_id,
            workspace_id=record.workspace_id,
            previous_status=previous,
            status=record.status,
            auth_status=record.auth_status,
            version=record.version,
            occurred_at=rfc3339(record.updated_at),
            command_id=command.command_id,
            request_id=command.request_id if isinstance(command, PasskeyConfirm) else None,
        )
        return self.topics.status, record.account_id.encode(), ev.model_dump_json().encode(), None


async def run_floor(settings: Settings, stop: asyncio.Event) -> None:
    await WorkerFloor(settings).run(stop)
