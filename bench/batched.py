"""The worker's own decisions in the floor's shape (``python -m bench.proc batched``): what the
worker would cost if it took a fetched batch as one unit of work, as the floor does, while
keeping what the contract asks of its result (bench/README.md, "Floors").

Per fetched batch of auth.commands, as one task (batches overlap, at most
``WORKER_MAX_IN_FLIGHT`` commands in flight, as the worker and the floor):

* decode each command with the worker's wire types; decide it with the worker's own pure
  decision (``decide``: the decision table, the dedup window, versions, event ids), each
  account's commands in order, an account still being settled by an earlier batch waited for;
* a first confirm: the worker's provider adapter (``build_registry``: retries, breaker,
  deadline, the connection gate, the same HTTP client), its answer settled by the worker's
  ``settle_confirm``;
* every changed state record of the batch (the worker's full record, ``encode_record``) handed
  to the producer, ONE wait for their acks, then every reply and event, ONE wait: the
  contract's order (a reply only after its state record is acknowledged, docs/architecture.md
  "Guarantees") shared by the batch instead of waited for per command; the store updated
  after the states' acks; the offsets committed in fetch order at the worker's cadence
  (``floor_loop``).

Left out, as from the floor: the engine's lanes, pressure and watermark bookkeeping, the
write-ahead intent, timers and follow-up polls, instrumentation (metrics, spans, per-command
logs) and the outage re-sends. So ``batched ÷ floor`` is what the contract's work costs in the
floor's shape, and ``worker ÷ batched`` what the worker's per-command engine and
instrumentation add on top of it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from bench.floor_loop import Batch, group_clients, serve_batches
from worker.auth.app import policy_from
from worker.auth.flow import Decision, Policy, ProviderOutcome, answer_query, decide, settle_confirm
from worker.auth.machine import CHALLENGE, SENT
from worker.auth.provider import (
    ProviderAuthState,
    ProviderError,
    ProviderRegistry,
    build_http_client,
    build_registry,
)
from worker.contract.catalogue import ServiceError
from worker.contract.messages import (
    AccountRecord,
    Command,
    DecodeFailure,
    GetAuthState,
    decode_command,
    encode_record,
)
from worker.settings import Settings


@dataclass(slots=True)
class Settled:
    """One decided command: where its state goes and what it publishes."""

    partition: int
    before: AccountRecord | None
    decision: Decision

    @property
    def changed(self) -> bool:
        d = self.decision
        return d.record is not None and d.record is not self.before


@dataclass(slots=True)
class Account:
    """The commands of one account in one batch, in fetch order, and their partition."""

    partition: int
    commands: list[Command] = field(default_factory=list)


class BatchedWorker:
    """One consumer, one producer, the worker's adapters; see the module docstring."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.producer, self.consumer = group_clients(
            settings, settings.topics.commands, settings.kafka_consumer_group
        )
        self.http = build_http_client(settings)
        self.providers: ProviderRegistry = build_registry(settings, self.http)
        self.policy: Policy = policy_from(settings, set(self.providers))
        self.store: dict[str, AccountRecord] = {}
        # Accounts an unfinished batch is settling, with that batch's end: a later batch's
        # commands for them wait (per-account order across overlapping batches).
        self.busy: dict[str, asyncio.Future[None]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await serve_batches(
                self.producer,
                self.consumer,
                self.handle,
                limit=self.settings.worker_max_in_flight,
                max_records=self.settings.kafka_max_poll_records,
                stop=stop,
                commit_interval_s=self.settings.worker_commit_interval_ms / 1000,
            )
        finally:
            await self.providers.aclose()
            await self.http.aclose()

    async def handle(self, batch: Batch) -> None:
        """Decide every command of ``batch`` (calls concurrent across accounts), then the
        states with one ack wait, then the replies and events with one more."""
        accounts: dict[str, Account] = {}
        for tp, msgs in batch.items():
            for msg in msgs:
                command = decode_command(msg.key, msg.value)
                if isinstance(command, DecodeFailure):
                    continue  # the benchmark sends none; the worker dead-letters it
                group = accounts.get(command.account_id)
                if group is None:
                    group = accounts[command.account_id] = Account(tp.partition)
                group.commands.append(command)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        settled: list[Settled] = []
        waits: list[asyncio.Task[list[Settled]]] = []
        try:
            for account_id, group in accounts.items():
                earlier = self.busy.get(account_id)
                self.busy[account_id] = done
                if earlier is None:
                    settled.extend(self._settle_now(group, waits))
                else:
                    waits.append(asyncio.create_task(self._settle_after(earlier, group, 0, [])))
            for outcome in await asyncio.gather(*waits):
                settled.extend(outcome)
            await self._publish(settled)
        finally:
            for account_id in accounts:
                if self.busy.get(account_id) is done:
                    del self.busy[account_id]
            done.set_result(None)

    def _settle_now(
        self, group: Account, waits: list[asyncio.Task[list[Settled]]]
    ) -> list[Settled]:
        """Decide ``group``'s commands in order without awaiting; from the first that must
        call the provider on, the rest is a task of its own."""
        out: list[Settled] = []
        for i, command in enumerate(group.commands):
            step = self._decide(group.partition, command)
            if step.decision.call is not None and step.decision.record is not None:
                waits.append(asyncio.create_task(self._settle_after(None, group, i, out, step)))
                return []
            out.append(step)
            self._see(step)
        return out

    async def _settle_after(
        self,
        earlier: asyncio.Future[None] | None,
        group: Account,
        start: int,
        out: list[Settled],
        decided: Settled | None = None,
    ) -> list[Settled]:
        """``group``'s commands from ``start`` on, in order, after ``earlier`` (another batch
        settling the account); ``decided``: the decision of ``start`` when made already."""
        if earlier is not None:
            await asyncio.shield(earlier)
        for command in group.commands[start:]:
            step = decided or self._decide(group.partition, command)
            decided = None
            decision = step.decision
            if decision.call is not None and decision.record is not None:
                intent = decision.record
                result = await self._call(intent, redrive=decision.call == "redrive_confirm")
                decision = settle_confirm(intent, result, now=time.time(), policy=self.policy)
                step = Settled(group.partition, intent, decision)
            out.append(step)
            self._see(step)
        return out

    def _decide(self, partition: int, command: Command) -> Settled:
        record = self.store.get(command.account_id)
        if isinstance(command, GetAuthState):
            return Settled(partition, record, answer_query(record, command))
        return Settled(
            partition, record, decide(record, command, now=time.time(), policy=self.policy)
        )

    def _see(self, step: Settled) -> None:
        """The next command of the account decides on this one's record (sent in order on
        the same partition before any reply of the batch)."""
        if step.changed and step.decision.record is not None:
            self.store[step.decision.record.account_id] = step.decision.record

    async def _call(self, intent: AccountRecord, *, redrive: bool) -> ProviderOutcome:
        """The worker's provider call for the confirm in flight (``Executor._resolve``)."""
        flight = intent.in_flight
        if flight is None:
            raise ValueError("no confirm in flight")
        adapter = self.providers.get(intent.provider or "")
        if adapter is None:
            return ServiceError.of("provider_adapter_not_found")
        deadline = time.monotonic() + (flight.deadline - time.time())
        ref = intent.provider_account_ref or ""
        try:
            if redrive:
                seen = await adapter.get_auth_state(ref, deadline=deadline)
                if seen.status != CHALLENGE:
                    return ProviderAuthState(SENT, SENT)
            return await adapter.confirm_passkey(
                ref, idempotency_key=flight.command_id, deadline=deadline
            )
        except ProviderError as exc:
            return exc.error

    async def _publish(self, settled: list[Settled]) -> None:
        topics = self.topics
        send = self.producer.send
        states = [
            await send(
                topics.state,
                encode_record(s.decision.record),
                key=s.decision.record.account_id.encode(),
                partition=s.partition,
            )
            for s in settled
            if s.changed and s.decision.record is not None
        ]
        await asyncio.gather(*states)
        outputs = []
        for s in settled:
            d = s.decision
            if d.reply is not None:
                body = d.reply.model_dump_json(exclude_none=True).encode()
                outputs.append(await send(topics.replies, body, key=d.reply.account_id.encode()))
            for topic, event in ((topics.status, d.status_event), (topics.errors, d.error_event)):
                if event is not None:
                    value = event.model_dump_json().encode()
                    outputs.append(await send(topic, value, key=event.account_id.encode()))
        await asyncio.gather(*outputs)


async def run_batched(settings: Settings, stop: asyncio.Event) -> None:
    await BatchedWorker(settings).run(stop)
