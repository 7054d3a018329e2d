"""The seams of one unit of work for one account: consume, decide (``worker.auth.flow``), call the
provider, publish. No locks: the loop runs one unit per account at a time, and a query runs beside
its account's lane, which the publication window makes safe (docs/architecture.md).

Over 500 lines: a record's path and a fetched batch's share their steps (decide, call, publish)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import InitVar, dataclass, field
from functools import partial
from typing import Final

from aiokafka.structs import ConsumerRecord
from opentelemetry.trace import SpanKind

from worker.auth.flow import (
    Decision,
    Headcount,
    Policy,
    ProviderOutcome,
    answer_query,
    dead_lettered,
    decide,
    expire,
    joins,
    observe,
    redriven,
    reschedule,
    settle_confirm,
    unsettled_intent,
)
from worker.auth.instrumentation import (
    DeadLettered,
    Decided,
    Expired,
    Forwarded,
    Handled,
    Instrumentation,
)
from worker.auth.metrics import WorkerMetrics
from worker.auth.provider import ProviderError, ProviderRegistry
from worker.auth.publish import Output, Publisher
from worker.auth.store import StateStore
from worker.auth.waits import ParkedWaits, WaitLimits
from worker.contract.catalogue import ServiceError
from worker.contract.messages import (
    AccountRecord,
    Command,
    DecodeFailure,
    GetAuthState,
    RegisterAccount,
    decode_command,
    event_id,
    rfc3339,
    workspace_id_of,
)
from worker.engine.faults import Fault, RecordRejected, is_process_fault
from worker.engine.home_partition import Router, forwarded_from, reply_partition
from worker.runtime import tracing
from worker.runtime.logs import get_logger

log = get_logger(__name__)

#: Records decoded before their ``handle`` (queries run aside, records a batch leaves), kept
#: for it; past this many (records let go before they ran) the kept ones are dropped, and
#: decoded again if they do run.
DECODED_KEPT: Final = 1024


@dataclass(frozen=True, slots=True)
class Clock:
    """Wall clock for records and events; monotonic for provider deadlines."""

    def now(self) -> float:
        return time.time()

    def to_monotonic(self, epoch_deadline: float) -> float:
        return time.monotonic() + (epoch_deadline - time.time())


def _bare(*_: object) -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()


@dataclass(eq=False, slots=True)
class _Step:
    """One command decided: its account's record before (the intent while a confirm is
    settled), its decision (its provider call's once ``call`` is awaited), and the trace
    headers of its outputs (``None``: the current context's)."""

    msg: ConsumerRecord[bytes, bytes]
    command: Command
    before: AccountRecord | None
    decision: Decision
    call: Awaitable[Decision] | None = None
    headers: list[tuple[str, bytes]] | None = None

    def output(self) -> Output:
        record = self.decision.record
        changed = record is not None and record is not self.before
        reply_to = reply_partition(self.msg.headers)
        return Output(self.decision, changed, reply_to, self.headers)


@dataclass(eq=False, kw_only=True)
class Executor:
    """The seams in one place: decide (pure), call the provider, publish."""

    store: StateStore
    publisher: Publisher
    providers: ProviderRegistry
    policy: Policy
    metrics: WorkerMetrics
    router: Router
    clock: Clock = field(default_factory=Clock)
    write_ahead: bool = False
    wait_limits: InitVar[WaitLimits | None] = None

    def __post_init__(self, wait_limits: WaitLimits | None) -> None:
        self._instrument = Instrumentation(self.metrics)
        self._windows: dict[tuple[int, str], asyncio.Future[None]] = {}
        self._decoded: dict[int, tuple[ConsumerRecord[bytes, bytes], Command | DecodeFailure]] = {}
        #: Parked long-polls (``worker.auth.waits``), answered from ``_publish``'s next version.
        self.waits = ParkedWaits(
            self.store, self.publisher, self.metrics, self._windows.get, wait_limits or WaitLimits()
        )

    def unordered(self, msg: ConsumerRecord[bytes, bytes]) -> bool:
        """Whether ``msg`` is a query for an account of its own partition, which the consume
        loop runs beside the account's lane (one off its home partition is forwarded)."""
        value = msg.value
        if value is None or msg.key is None or b'"get_auth_state"' not in value:
            return False
        query = decode_command(msg.key, value)
        if not isinstance(query, GetAuthState) or self.router.home(msg.key) != msg.partition:
            return False
        self._keep(msg, query)
        return True

    def _keep(self, msg: ConsumerRecord[bytes, bytes], command: Command | DecodeFailure) -> None:
        """``msg`` decoded already, for its ``handle`` (a query run aside, a record a batch
        leaves): at most ``DECODED_KEPT``; one dropped is decoded again."""
        if len(self._decoded) >= DECODED_KEPT:
            self._decoded.clear()
        self._decoded[id(msg)] = (msg, command)  # the record kept: its id is not reused meanwhile

    # -- commands ------------------------------------------------------------------------------

    async def handle(self, msg: ConsumerRecord[bytes, bytes]) -> None:
        """Apply one record of auth.commands; returns once every output is acknowledged."""
        with tracing.consume_span(msg):
            started = time.perf_counter()
            kept = self._decoded.pop(id(msg), None)
            command = kept[1] if kept is not None else decode_command(msg.key, msg.value)
            with self._instrument.scope(msg, command):
                self._instrument.record(msg, await self._handle(msg, command), started)

    def _handle(
        self, msg: ConsumerRecord[bytes, bytes], command: Command | DecodeFailure
    ) -> Awaitable[Handled]:
        """The coroutine of what ``msg`` comes to (not one around it: a frame fewer)."""
        if isinstance(command, DecodeFailure):
            return self._invalid(msg, command)
        home = msg.partition if msg.key is None else self.router.home(msg.key)
        if home != msg.partition:
            return self._route_home(msg, command, home)
        if isinstance(command, GetAuthState):
            return self._answer(msg, command)
        return self._apply(msg, command)

    async def _invalid(self, msg: ConsumerRecord[bytes, bytes], failed: DecodeFailure) -> Handled:
        fault = Fault(reason=failed.reason, detail=failed.detail)
        await self._dead_letter(msg, fault, failed, ServiceError.of("invalid_request"))
        return DeadLettered("unknown", "invalid")

    async def _apply(self, msg: ConsumerRecord[bytes, bytes], command: Command) -> Decided:
        partition = msg.partition
        record = self.store.get(partition, command.account_id)
        if record is not None and unsettled_intent(record, command):
            settled = await self._resolve(record, redrive=True)
            await self._publish(partition, record, settled)
        headcount = None
        if isinstance(command, RegisterAccount):
            live = self.store.workspace_accounts(partition, command.workspace_id)
            headcount = Headcount(live=live, partitions=self.router.partitions())
        step = self._decide(msg, command, headcount)
        if step.call is not None:
            if self.write_ahead and step.decision.call == "confirm_passkey" and step.before:
                try:
                    await self.publisher.persist(partition, step.before)
                except BaseException:
                    if isinstance(step.call, Coroutine):
                        step.call.close()  # never started: a retry re-drives the intent
                    raise
            step.decision = await step.call
        # A new account is counted from its decision on (``StateStore.joining``).
        new = isinstance(command, RegisterAccount) and joins(step.before, step.decision)
        workspace = workspace_id_of(command) or ""
        with self.store.joining(partition, workspace) if new else contextlib.nullcontext():
            await self._publish_all(partition, [step.output()])
        return Decided(command, step.decision.verdict, step.decision.error)

    def _decide(
        self, msg: ConsumerRecord[bytes, bytes], command: Command, headcount: Headcount | None
    ) -> _Step:
        """Decide ``command`` on its account's stored record; a confirm to settle with the
        provider has its intent stored and its call (``_resolve``) made, not awaited."""
        partition = msg.partition
        record = self.store.get(partition, command.account_id)
        with tracing.span("decide") as deciding:
            decision = decide(
                record, command, now=self.clock.now(), policy=self.policy, headcount=headcount
            )
            if deciding.is_recording():
                deciding.set_attribute("passkey.verdict", decision.verdict)
                if decision.call is not None:
                    deciding.set_attribute("passkey.provider_call", decision.call)
        step = _Step(msg, command, record, decision)
        if decision.call is not None and decision.record is not None:
            # A confirm a previous owner may have sent already (below the partition's end at
            # assignment) is re-driven: the provider is asked first (docs/architecture.md,
            # "Write-ahead intent"). The intent is kept in memory: a retry of this record
            # re-drives it, and ``recover`` writes it if the record is let go unsettled.
            # Written before the call only while older versions share the group (``_apply``).
            step.before = intent = decision.record
            redrive = decision.call == "redrive_confirm" or self.store.inherited(
                msg.topic, partition, msg.offset
            )
            self.store.put(partition, intent)
            step.call = self._resolve(intent, redrive=redrive)
        return step

    async def handle_batch(
        self,
        msgs: Sequence[ConsumerRecord[bytes, bytes]],
        release: Callable[[list[ConsumerRecord[bytes, bytes]], bool], None],
    ) -> None:
        """Records of one partition whose accounts have nothing else in flight, as one unit
        of work (docs/architecture.md, "Per-account lanes"): each command decided as
        ``_apply`` does, the provider calls concurrent, and what is decided published in
        rounds, a round's states acknowledged under one wait, then its replies and events
        under one more, its records then released as finished. Released at once to
        ``handle`` instead: all but plain commands on their home partition with no intent to
        re-drive (all, under the write-ahead intent, and while spans are recorded: each command
        then keeps its one span tree), a command whose handling raised (its intent stored as a
        retry of it finds it), a round whose publication failed."""
        if self.write_ahead or tracing.recording():
            release(list(msgs), False)
            return
        started = time.perf_counter()
        ready: list[_Step] = []
        left: list[ConsumerRecord[bytes, bytes]] = []
        calls: list[asyncio.Future[Decision]] = []
        arrived = asyncio.Event()

        def arrive(step: _Step, _: object) -> None:
            ready.append(step)
            arrived.set()

        for msg in msgs:
            command = decode_command(msg.key, msg.value)
            if (
                isinstance(command, DecodeFailure | GetAuthState | RegisterAccount)
                or msg.key is None
                or self.router.home(msg.key) != msg.partition
                or (
                    (r := self.store.get(msg.partition, command.account_id)) is not None
                    and unsettled_intent(r, command)
                )
            ):
                left.append(msg)
                self._keep(msg, command)
                continue
            try:
                # The command's trace and log context, on its outputs and its call's task.
                with tracing.consume_span(msg), self._instrument.scope(msg, command):
                    step = self._decide(msg, command, None)
                    step.headers = tracing.kafka_headers()
                    if step.call is not None:
                        call = step.call = asyncio.ensure_future(step.call)
                        call.add_done_callback(partial(arrive, step))
                        calls.append(call)
                        continue
            except Exception as exc:
                if is_process_fault(exc):
                    raise
                left.append(msg)
                self._keep(msg, command)
                continue
            ready.append(step)
        release(left, False)
        waiting = len(calls)
        try:
            while ready or waiting:
                if not ready:
                    arrived.clear()
                    await arrived.wait()
                    continue
                steps, ready[:] = ready[:], []
                waiting -= sum(1 for step in steps if step.call is not None)
                await self._publish_round(msgs[0].partition, steps, release, started)
        finally:
            for pending in calls:
                pending.cancel()

    async def _publish_round(
        self,
        partition: int,
        steps: list[_Step],
        release: Callable[[list[ConsumerRecord[bytes, bytes]], bool], None],
        started: float,
    ) -> None:
        """One round of ``handle_batch``: a step whose call raised is released to ``handle``."""
        settled: list[_Step] = []
        for step in steps:
            if isinstance(step.call, asyncio.Future):
                if (failed := step.call.exception()) is not None:
                    if is_process_fault(failed):
                        raise failed
                    release([step.msg], False)
                    continue
                step.decision = step.call.result()
            settled.append(step)
        try:
            await self._publish_all(partition, [step.output() for step in settled])
        except Exception as exc:
            if is_process_fault(exc):
                raise
            log.warning("batch_publish_failed", records=len(settled), error=repr(exc)[:300])
            release([step.msg for step in settled], False)
            return
        release([step.msg for step in settled], True)
        for step in settled:  # a command's log context only for a failure's log line
            handled = Decided(step.command, step.decision.verdict, step.decision.error)
            scope = self._instrument.scope if handled.error else _bare
            with scope(step.msg, step.command):
                self._instrument.record(step.msg, handled, started)

    async def _answer(self, msg: ConsumerRecord[bytes, bytes], query: GetAuthState) -> Decided:
        """Answer a query from the store, after the account's open publication window; park a
        long-poll with something to wait for and return (nothing awaits between read and park)."""
        window = self._windows.get((msg.partition, query.account_id))
        if window is not None:
            await asyncio.shield(window)
        record = self.store.get(msg.partition, query.account_id)
        if self.waits.park(msg.partition, query, record, reply_partition(msg.headers)):
            return Decided(query, "ok")
        decision = answer_query(record, query)
        await self.publisher.publish(
            msg.partition, decision, state_changed=False, reply_to=reply_partition(msg.headers)
        )
        return Decided(query, decision.verdict, decision.error)

    async def _route_home(
        self, msg: ConsumerRecord[bytes, bytes], command: Command, home: int
    ) -> Forwarded | DeadLettered:
        """A command off its key's home partition is forwarded home once (the home dedup
        window absorbs a copy a crash re-forwards); one forwarded already and still not home
        (the partition count changed between the hops) is dead-lettered, not sent round again."""
        origin = forwarded_from(msg.headers)
        if origin is not None:
            fault = Fault(
                reason="misrouted",
                detail=f"forwarded from {origin} to partition {msg.partition}, but the key's "
                f"home partition is {home} of {self.router.partitions()}",
            )
            await self._dead_letter(msg, fault, command, ServiceError.of("invalid_request"))
            return DeadLettered(command.type, "invalid")
        await self.publisher.forward(msg, home)
        return Forwarded(command, home)

    async def _resolve(self, record: AccountRecord, *, redrive: bool) -> Decision:
        """Finish the confirm in ``record.in_flight`` with the provider's answer, asked always
        with its command_id as the idempotency key (a re-drive asks the state first:
        ``redriven``); a failed call is an answer, never raised."""
        intent = record.in_flight
        if intent is None:
            raise ValueError("no confirm in flight")
        adapter = self.providers.get(record.provider or "")
        result: ProviderOutcome | None = None
        try:
            if adapter is None:
                result = ServiceError.of("provider_adapter_not_found")
            else:
                deadline = self.clock.to_monotonic(intent.deadline)
                ref = record.provider_account_ref or ""
                if redrive:
                    seen = await adapter.get_auth_state(ref, deadline=deadline)
                    log.info("confirm_redriven", provider_status=seen.status)
                    result = redriven(seen)
                if result is None:
                    result = await adapter.confirm_passkey(
                        ref, idempotency_key=intent.command_id, deadline=deadline
                    )
        except ProviderError as exc:
            result = exc.error
        except Exception:
            # An unexpected fault is answered (500), not lost and not retried forever.
            log.exception("provider_call_crashed")
            result = ServiceError.of("run_auth_action_failed")
        return settle_confirm(record, result, now=self.clock.now(), policy=self.policy)

    # -- follow-up -----------------------------------------------------------------------------

    async def follow_up(self, partition: int, account_id: str) -> None:
        """One follow-up step: expire a flow past its deadline, or poll the provider once."""
        record = self.store.get(partition, account_id)
        if record is None or record.follow_up is None or record.deregistered:
            return
        await self._instrument.run_follow_up(
            partition, account_id, lambda: self._follow_up(partition, record)
        )

    async def _follow_up(self, partition: int, record: AccountRecord) -> Expired | None:
        now = self.clock.now()
        if record.follow_up is not None and now >= record.follow_up.deadline_at:
            decision = expire(record, now=now, policy=self.policy)
            if decision.record is None:
                return None
            await self._publish(partition, record, decision)
            return Expired(record.account_id)
        decision = Decision(verdict="ignored")
        adapter = self.providers.get(record.provider or "")
        try:
            if adapter is not None:
                state = await adapter.get_auth_state(
                    record.provider_account_ref or "",
                    # A poll gets the same budget as a command: a deadline tighter than the
                    # provider's latency under load would fail polls that were fine, and
                    # those failures would open the circuit for the confirms as well.
                    deadline=time.monotonic() + self.policy.command_deadline_s,
                )
                decision = observe(
                    record,
                    state.status,
                    state.auth_status,
                    command_id=None,
                    now=self.clock.now(),
                    policy=self.policy,
                )
        except ProviderError as exc:
            log.info("follow_up_poll_failed", code=exc.error.code)
        if decision.record is not None:
            await self._publish(partition, record, decision)
        else:
            # Poll times live in memory only: a new owner polls at once, and the deadline,
            # which does live in the record, bounds the flow either way.
            self.store.put(partition, reschedule(record, now=now, policy=self.policy))
        return None

    # -- outputs -------------------------------------------------------------------------------

    def _publish(
        self,
        partition: int,
        before: AccountRecord | None,
        decision: Decision,
        *,
        reply_to: int | None = None,
    ) -> Coroutine[None, None, None]:
        """One decision's outputs (``_publish_all``)."""
        changed = decision.record is not None and decision.record is not before
        return self._publish_all(partition, [Output(decision, changed, reply_to)])

    async def _publish_all(self, partition: int, outputs: Sequence[Output]) -> None:
        """Send ``outputs`` (``Publisher.publish_all``), then store their records and answer
        the long-polls waiting for them. Each account's publication window is open while its
        new version is sent and stored (one at a time: its lane's); a query of the account
        waits for it to close."""
        with tracing.span("send", kind=SpanKind.PRODUCER) as sending:
            if sending.is_recording():
                names = [
                    name
                    for out in outputs
                    for name, present in (
                        ("state", out.state_changed),
                        ("reply", out.decision.reply is not None),
                        ("status", out.decision.status_event is not None),
                        ("error", out.decision.error_event is not None),
                    )
                    if present
                ]
                sending.set_attributes(
                    tracing.messaging("send")
                    | {"messaging.batch.message_count": len(names), "passkey.outputs": names}
                )
            records = [r for o in outputs if o.state_changed and (r := o.decision.record)]
            loop = asyncio.get_running_loop()
            windows: dict[tuple[int, str], asyncio.Future[None]] = {}
            for record in records:
                key = (partition, record.account_id)
                windows[key] = self._windows[key] = loop.create_future()
            try:
                await self.publisher.publish_all(partition, outputs)
                for record in records:
                    self.store.put(partition, record)
                    self.waits.changed(partition, record)  # they wait for this version
            finally:
                for key, window in windows.items():
                    if self._windows.get(key) is window:
                        del self._windows[key]
                    window.set_result(None)
        for out in outputs:
            decision = out.decision
            if decision.verdict == "duplicate":
                continue
            if decision.status_event is not None:
                self.metrics.child(self.metrics.status_changes, decision.status_event.status).inc()
            if (e := decision.error_event) is not None:
                error = e.error
                labels = (error.code, str(error.numeric_code), str(e.http_status))
                self.metrics.child(self.metrics.errors, *labels).inc()

    # -- faults ---------------------------------------------------------------------------------

    async def recover(self, msg: ConsumerRecord[bytes, bytes], fault: Fault) -> None:
        """A command whose handling failed for good (the consume loop retried it): to the DLQ,
        with a catalogued 500 to its caller and in auth.errors, so nobody waits it out."""
        command = decode_command(msg.key, msg.value)
        started = time.perf_counter()
        with self._instrument.scope(msg, command):
            self._instrument.record(msg, await self._let_go(msg, command, fault), started)

    async def _let_go(
        self, msg: ConsumerRecord[bytes, bytes], command: Command | DecodeFailure, fault: Fault
    ) -> DeadLettered:
        kind = "unknown"
        if not isinstance(command, DecodeFailure):
            kind = command.type
            await self._keep_intent(msg.partition, command)
        await self._dead_letter(msg, fault, command, ServiceError.of("run_auth_action_failed"))
        return DeadLettered(kind, "failed")

    async def _keep_intent(self, partition: int, command: Command) -> None:
        """Write the record with this command's confirm in flight before the command is let go:
        once its offset is committed, the intent alone tells a later owner the provider may have
        heard of it, so a copy is re-driven, never confirmed blind."""
        record = self.store.get(partition, command.account_id)
        if record is None or record.in_flight is None:
            return
        if record.in_flight.command_id != command.command_id:
            return
        try:
            await self.publisher.persist(partition, record)
        except RecordRejected as exc:
            # The record cannot be written at all: the idempotency key still bounds the
            # provider to one effect for this command.
            log.error("intent_not_written", reason=exc.reason, detail=exc.detail)

    async def give_up(self, partition: int, account_id: str, fault: Fault) -> None:
        """A follow-up that keeps failing waits for the next poll of the policy's back-off;
        the flow's deadline still ends it."""
        record = self.store.get(partition, account_id)
        if record is not None and record.follow_up is not None:
            self.store.put(partition, reschedule(record, now=self.clock.now(), policy=self.policy))

    async def _dead_letter(
        self,
        msg: ConsumerRecord[bytes, bytes],
        fault: Fault,
        command: Command | DecodeFailure,
        err: ServiceError,
    ) -> None:
        event, answered = dead_lettered(
            command,
            err,
            fault.detail,
            event_id=event_id("dlq", msg.topic, msg.partition, msg.offset),
            occurred_at=rfc3339(msg.timestamp / 1000 if msg.timestamp else self.clock.now()),
        )
        await self.publisher.dead_letter(
            msg, fault, error_event=event, reply=answered, reply_to=reply_partition(msg.headers)
        )
        self.metrics.dlq.labels(fault.reason).inc()
        self.metrics.errors.labels(err.code, str(err.numeric_code), str(err.http_status)).inc()
        log.warning(
            "record_dead_lettered",
            reason=fault.reason,
            detail=fault.detail,
            partition=msg.partition,
            offset=msg.offset,
        )
