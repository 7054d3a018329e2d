"""The group consumer the development tools give the product's consume loops on the embedded
broker: an ``AIOKafkaConsumer`` that also leaves its group when the broker says generation 0.

The broker numbers a group's first generation 0 (Kafka starts at 1), so members that joined a
new group together (a pool started at once) are at generation 0 until the next rebalance, and
aiokafka skips LeaveGroup there: a cleanly stopped member would hold its partitions for a full
session timeout before the others get them (docs/architecture.md, "The embedded broker").
Sending LeaveGroup while the heartbeat still runs makes aiokafka rejoin, so it is sent from
inside ``stop()``, after the coordinator stopped its heartbeat, where aiokafka would have sent
it. That reaches into aiokafka's coordinator, which is why it lives here and not in the
product: the worker and the dispatcher take it as ``consumer_class`` (``python -m devstack
worker|webhooks``, the tests' harness).

On Kafka a joined member is never at generation 0, so there this changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka import AIOKafkaConsumer
from aiokafka.protocol.group import LeaveGroupRequest

from worker.runtime.logs import get_logger

__all__ = ["EmbeddedBrokerConsumer"]

log = get_logger(__name__)

LEAVE_TIMEOUT_S = 2.0


class EmbeddedBrokerConsumer(AIOKafkaConsumer):  # type: ignore[misc]
    """``AIOKafkaConsumer`` whose ``stop()`` sends LeaveGroup also at generation 0."""

    async def start(self) -> None:
        await super().start()
        coordinator = getattr(self, "_coordinator", None)
        original = getattr(coordinator, "_maybe_leave_group", None)
        if coordinator is None or original is None:  # no group, or another aiokafka
            return

        async def leave() -> None:
            member_id = getattr(coordinator, "member_id", "")
            if coordinator.generation == 0 and member_id:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        coordinator._send_req(LeaveGroupRequest(coordinator.group_id, member_id)),
                        timeout=LEAVE_TIMEOUT_S,
                    )
                    log.info("left_group", member_id=member_id)
            await original()

        coordinator._maybe_leave_group = leave
