"""The dispatcher's floor (``python -m bench.webhook_floor``, started by ``bench.webhooks``):
the least a service must do to deliver the dispatcher's signed webhooks on the dispatcher's
libraries and settings, so ``dispatcher ÷ floor`` says how much of the dispatcher's CPU is
its own design (bench/README.md, "Floors").

For every fetched batch of auth.status, as one task (batches overlap, at most
``WEBHOOK_MAX_IN_FLIGHT`` events in flight, as the dispatcher):

* the webhook body rendered as the dispatcher renders it (``from_status``: the event's
  pydantic model, then JSON), its ``webhook-id`` as the dispatcher's;
* signed per Standard Webhooks (HMAC-SHA256 of ``id.timestamp.body``, base64; the secret
  decoded once), POSTed through the dispatcher's own client (``open_session`` with the
  dispatcher's pool limits and target policy, ``Sender`` with its time-out and body cap);
* one account's events one after another, across overlapping batches too: an event is sent
  only once the account's earlier one is settled (answered and its log entry acknowledged,
  as the dispatcher settles a pair's head before it attempts the next); accounts concurrently;
* one delivery-log entry per delivery with the fields the dispatcher writes for a finished
  one (``DeliveryLogEntry`` with its ``attempt``, the ``body`` a resend sends, ``occurred_at``),
  the entries written within the dispatcher's window (``WEBHOOK_LOG_FLUSH_S``) in one record
  (``DeliveryLogBatch``, at most ``LOG_BATCH_MAX`` entries or ``LOG_BATCH_BYTES``), whichever
  batch they came from; the offsets committed at the dispatcher's cadence (``floor_loop``).

One endpoint, given in the environment (``FLOOR_ENDPOINT_ID``, ``FLOOR_ENDPOINT_URL``,
``FLOOR_WORKSPACE_ID``, ``BENCH_WEBHOOK_SECRET``): no endpoint registry, no delivery state,
no retries or endpoint gate, no pending entries for a delivery waiting behind its account's
earlier one, no metrics, spans or logs per delivery. Each of those is what the ratio counts.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

from bench.floor_loop import Batch, group_clients, serve_batches
from bench.webhook_receiver import SECRET_ENV
from worker.contract.delivery_log import (
    LOG_BATCH_BYTES,
    LOG_BATCH_MAX,
    AttemptRecord,
    DeliveryLogBatch,
    DeliveryLogEntry,
    excerpt,
    webhook_id,
)
from worker.contract.messages import rfc3339
from worker.contract.webhook_events import WebhookEvent, from_status
from worker.dispatcher.sender import Sender, open_session
from worker.runtime import eventloop, logs
from worker.runtime.process import on_stop_signals, tune_gc
from worker.settings import Settings
from worker.webhooks.signing import SECRET_PREFIX
from worker.webhooks.targets import TargetPolicy


@dataclass(slots=True, eq=False)
class LogRecord:
    """The entries of one window, and what their writers wait on (its record's ack)."""

    acked: asyncio.Future[None]
    entries: list[DeliveryLogEntry] = field(default_factory=list)
    bytes: int = 0


class DispatcherFloor:
    def __init__(self, settings: Settings, endpoint_id: str, url: str, workspace: str) -> None:
        self.settings = settings
        self.endpoint_id = endpoint_id
        self.url = url
        self.workspace = workspace
        self.key = base64.b64decode(os.environ[SECRET_ENV].removeprefix(SECRET_PREFIX))
        self.producer, self.consumer = group_clients(
            settings, settings.topics.status, settings.webhook_consumer_group
        )
        # Accounts an unfinished batch is delivering, with when that batch's lane of the account
        # has every event of it answered.
        self.busy: dict[str, asyncio.Future[None]] = {}
        self.window: LogRecord | None = None
        self.writes: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        session = open_session(
            TargetPolicy.of(s),
            max_connections=s.webhook_max_connections,
            max_connections_per_host=s.webhook_max_connections_per_host,
        )
        self.sender = Sender(session, timeout_s=s.webhook_timeout_s)
        try:
            await serve_batches(
                self.producer,
                self.consumer,
                self.handle,
                limit=s.webhook_max_in_flight,
                max_records=s.kafka_max_poll_records,
                stop=stop,
                commit_interval_s=s.worker_commit_interval_ms / 1000,
            )
        finally:
            await session.close()

    async def handle(self, batch: Batch) -> None:
        """Deliver ``batch``: each account's events in order after its earlier batch's."""
        lanes: dict[str, list[WebhookEvent]] = defaultdict(list)
        for msgs in batch.values():
            for msg in msgs:
                event = from_status(msg.value or b"")
                if event.workspace_id == self.workspace:
                    lanes[event.account_id].append(event)
        tasks = []
        for account, events in lanes.items():
            answered = asyncio.get_running_loop().create_future()
            tasks.append(asyncio.create_task(self.lane(self.busy.get(account), events, answered)))
            self.busy[account] = answered
            answered.add_done_callback(functools.partial(self._release, account))
        await asyncio.gather(*tasks)

    def _release(self, account: str, answered: asyncio.Future[None]) -> None:
        if self.busy.get(account) is answered:
            del self.busy[account]

    async def lane(
        self,
        earlier: asyncio.Future[None] | None,
        events: list[WebhookEvent],
        answered: asyncio.Future[None],
    ) -> None:
        """An account's events in order, each sent once the earlier one is answered (its
        entry put in its log window, as the dispatcher puts a success's); done, so the batch's
        offsets may be committed, once every entry's record is acknowledged."""
        acked: list[asyncio.Future[None]] = []
        try:
            if earlier is not None:
                await asyncio.shield(earlier)
            for event in events:
                acked.append(self.log(await self.deliver(event)))
        finally:
            if not answered.done():
                answered.set_result(None)
        await asyncio.gather(*(asyncio.shield(a) for a in dict.fromkeys(acked)))

    async def deliver(self, event: WebhookEvent) -> DeliveryLogEntry:
        wid = webhook_id(event.event_id, self.endpoint_id)
        body = event.body.encode()
        at = time.time()
        content = f"{wid}.{int(at)}.".encode() + body
        signature = base64.b64encode(hmac.digest(self.key, content, hashlib.sha256)).decode()
        headers = {
            "webhook-id": wid,
            "webhook-timestamp": str(int(at)),
            "webhook-signature": f"v1,{signature}",
            "content-type": "application/json",
        }
        answer = await self.sender.post(self.url, body, headers)
        text, cut = excerpt(answer.body, truncated=answer.truncated)
        error = None if answer.error is None else str(answer.error)
        attempt = AttemptRecord(
            at=rfc3339(at),
            status=answer.status,
            latency_ms=max(0, round(answer.elapsed_s * 1000)),
            response_excerpt=text or None,
            response_truncated=cut,
            error_kind=None if error is None else error[:64],
        )
        return DeliveryLogEntry(
            webhook_id=wid,
            endpoint_id=self.endpoint_id,
            workspace_id=self.workspace,
            account_id=event.account_id,
            event_type=event.event_type,
            event_id=event.event_id,
            version=event.version,
            attempts=1,
            state="delivered" if answer.ok else "failed",
            last_status=answer.status,
            last_error=error,
            updated_at=rfc3339(time.time()),
            attempt=attempt,
            body=event.body,
            occurred_at=event.occurred_at,
        )

    def log(self, entry: DeliveryLogEntry) -> asyncio.Future[None]:
        """Put ``entry`` in the open window's record (opened by the first entry, written when
        the window closes or the record is full); what is set once that record is acked."""
        window = self.window
        if window is None:
            window = self.window = LogRecord(asyncio.get_running_loop().create_future())
            flush_s = self.settings.webhook_log_flush_s
            asyncio.get_running_loop().call_later(flush_s, self._close, window)
        window.entries.append(entry)
        window.bytes += len(entry.body or "") + 1024
        if len(window.entries) >= LOG_BATCH_MAX or window.bytes >= LOG_BATCH_BYTES:
            self._close(window)
        return window.acked

    def _close(self, window: LogRecord) -> None:
        if self.window is not window:
            return  # closed already (full)
        self.window = None
        task = asyncio.create_task(self._write(window))
        self.writes.add(task)
        task.add_done_callback(self.writes.discard)

    async def _write(self, window: LogRecord) -> None:
        entries = window.entries
        record = (
            entries[0]
            if len(entries) == 1
            else DeliveryLogBatch(endpoint_id=self.endpoint_id, entries=tuple(entries))
        )
        try:
            await (
                await self.producer.send(
                    self.settings.topics.webhook_deliveries,
                    record.model_dump_json().encode(),
                    key=self.endpoint_id.encode(),
                )
            )
        except Exception as exc:  # its writers see it; the floor has no re-send
            window.acked.set_exception(exc)
            return
        window.acked.set_result(None)


async def _main(settings: Settings) -> None:
    stop = asyncio.Event()
    floor = DispatcherFloor(
        settings,
        os.environ["FLOOR_ENDPOINT_ID"],
        os.environ["FLOOR_ENDPOINT_URL"],
        os.environ["FLOOR_WORKSPACE_ID"],
    )
    with on_stop_signals(stop.set):
        await floor.run(stop)


def main() -> int:
    settings = Settings()
    logs.configure(settings.log_level, settings.log_format)
    tune_gc(settings.worker_gc_threshold)  # as `python -m worker webhooks` does
    eventloop.run(_main(settings), settings.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
