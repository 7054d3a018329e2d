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
  one account's events one after another, accounts concurrently;
* one delivery-log entry per delivery (the dispatcher's ``DeliveryLogEntry``), the batch's
  entries of the endpoint in records of at most ``LOG_BATCH_MAX`` (``DeliveryLogBatch``), as
  the dispatcher's flush window batches them; one wait for their acks, then the batch's
  offsets committed (in fetch order).

One endpoint, given in the environment (``FLOOR_ENDPOINT_ID``, ``FLOOR_ENDPOINT_URL``,
``FLOOR_WORKSPACE_ID``, ``BENCH_WEBHOOK_SECRET``): no endpoint registry, no delivery state,
no retries or endpoint gate, no metrics, spans or logs per delivery. Each of those is what
the ratio counts.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import sys
import time
from collections import defaultdict

from bench.floor_loop import Batch, group_clients, serve_batches
from bench.webhook_receiver import SECRET_ENV
from worker.contract.delivery_log import (
    LOG_BATCH_MAX,
    DeliveryLogBatch,
    DeliveryLogEntry,
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
            )
        finally:
            await session.close()

    async def handle(self, batch: Batch) -> None:
        """Deliver ``batch`` (per account in order), then log it, one ack wait."""
        lanes: dict[str, list[WebhookEvent]] = defaultdict(list)
        for msgs in batch.values():
            for msg in msgs:
                event = from_status(msg.value or b"")
                if event.workspace_id == self.workspace:
                    lanes[event.account_id].append(event)
        done = await asyncio.gather(*(self.lane(events) for events in lanes.values()))
        entries = [entry for lane in done for entry in lane]
        futures = []
        for i in range(0, len(entries), LOG_BATCH_MAX):
            chunk = entries[i : i + LOG_BATCH_MAX]
            record = (
                chunk[0]
                if len(chunk) == 1
                else DeliveryLogBatch(endpoint_id=self.endpoint_id, entries=tuple(chunk))
            )
            futures.append(
                await self.producer.send(
                    self.settings.topics.webhook_deliveries,
                    record.model_dump_json().encode(),
                    key=self.endpoint_id.encode(),
                )
            )
        await asyncio.gather(*futures)

    async def lane(self, events: list[WebhookEvent]) -> list[DeliveryLogEntry]:
        return [await self.deliver(event) for event in events]

    async def deliver(self, event: WebhookEvent) -> DeliveryLogEntry:
        wid = webhook_id(event.event_id, self.endpoint_id)
        body = event.body.encode()
        stamp = int(time.time())
        content = f"{wid}.{stamp}.".encode() + body
        signature = base64.b64encode(hmac.digest(self.key, content, hashlib.sha256)).decode()
        headers = {
            "webhook-id": wid,
            "webhook-timestamp": str(stamp),
            "webhook-signature": f"v1,{signature}",
            "content-type": "application/json",
        }
        answer = await self.sender.post(self.url, body, headers)
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
            last_error=None if answer.error is None else str(answer.error),
            updated_at=rfc3339(time.time()),
        )


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
