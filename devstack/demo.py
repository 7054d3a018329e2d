"""``python -m devstack demo``: drive the worker straight through Kafka, without the front-end.

``register`` puts an account in the flow, ``confirm`` sends a passkey_confirm and prints its
reply and the account's status events until the flow ends, ``watch`` prints the events only.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from datetime import UTC, datetime

from aiokafka import TopicPartition

from worker.contract.messages import PasskeyConfirm, RegisterAccount
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.engine.tail import partitions_of
from worker.settings import Settings


async def register_accounts(
    settings: Settings,
    workspace_id: str,
    accounts: list[tuple[str, str]],
    *,
    provider: str = "simulator",
    status: str = "passkey_confirmation",
) -> None:
    """Register (account_id, provider_account_ref) pairs; command ids are deterministic, so
    running it twice registers once."""
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        for account_id, ref in accounts:
            cmd = RegisterAccount(
                command_id=f"register-{workspace_id}-{account_id}-{ref}",
                workspace_id=workspace_id,
                account_id=account_id,
                provider=provider,
                provider_account_ref=ref,
                status=status,
            )
            await producer.send(
                settings.topics.commands, cmd.model_dump_json().encode(), key=account_id.encode()
            )
        await producer.flush()
    finally:
        await producer.stop()


async def run_demo(settings: Settings, args: argparse.Namespace) -> None:
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    if args.action == "register":
        await register_accounts(
            settings,
            args.workspace,
            [(args.account_id, args.ref or args.account_id)],
            provider=args.provider,
            status=args.status,
        )
        print(f"registered {args.account_id} in {args.workspace} ({args.status})")
        return
    command_id = None
    if args.action == "confirm":
        command_id = str(uuid.uuid4())
        now = datetime.now(UTC)
        cmd = PasskeyConfirm(
            command_id=command_id,
            request_id=f"req_{uuid.uuid4().hex}",
            workspace_id=args.workspace,
            account_id=args.account_id,
            issued_at=now,
        )
        producer = build_producer(settings.kafka_config())
        await producer.start()
        try:
            await producer.send_and_wait(
                settings.topics.commands,
                cmd.model_dump_json().encode(),
                key=args.account_id.encode(),
            )
        finally:
            await producer.stop()
        print(f"sent passkey_confirm {command_id} for {args.account_id}")
    await _watch(settings, args.account_id, command_id, args.timeout)


async def _watch(
    settings: Settings, account_id: str, command_id: str | None, timeout: float
) -> None:
    """Print the reply (if any) and the account's status events until the flow ends."""
    topics = [settings.topics.replies, settings.topics.status, settings.topics.errors]
    consumer = build_consumer(settings.kafka_config())
    await consumer.start()
    try:
        tps = [
            TopicPartition(t, p)
            for t in topics
            for p in (consumer.partitions_for_topic(t) or await _partitions(consumer, t))
        ]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for msg in records:
                    if msg.key != account_id.encode() or msg.value is None:
                        continue
                    value = json.loads(msg.value)
                    if value.get("type") == "reply" and value.get("command_id") != command_id:
                        continue
                    print(f"{msg.topic:<24} {json.dumps(value)}")
                    if value.get("type") == "auth_status_changed" and value.get("status") in (
                        "authorized",
                        "failed",
                    ):
                        return
    finally:
        await consumer.stop()


async def _partitions(consumer: object, topic: str) -> set[int]:
    return await partitions_of(consumer, topic, deadline=time.monotonic() + 10) or {0}
