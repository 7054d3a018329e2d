"""devstack/consumer.py: on the embedded broker, members that joined a new group together are
all at generation 0, where aiokafka sends no LeaveGroup; a stopped member of the development
tools' consumer leaves all the same, so the other gets its partitions in one rebalance rather
than after the stopped one's session timeout (docs/architecture.md, "The embedded broker")."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer

from devstack.consumer import EmbeddedBrokerConsumer
from tests.conftest import SettingsFactory
from worker.engine.kafka import ConsumerClass, ensure_topics
from worker.engine.runner import group_consumer

pytestmark = pytest.mark.integration

#: Longer than a rebalance takes (the broker's is about half the rebalance timeout, which is
#: this): only a member that left gets its partitions handed over before it.
SESSION_TIMEOUT_MS = 12_000


async def owned_after_peer_stops(make_settings: SettingsFactory, cls: ConsumerClass) -> float:
    """Two members of a new group of class ``cls``, started together, split two partitions;
    one stops cleanly. Returns the seconds until the other owns both (at most the session
    timeout and a little)."""
    settings = make_settings(
        partitions=2,
        kafka_session_timeout_ms=SESSION_TIMEOUT_MS,
        worker_shutdown_grace_s=5.0,
    )
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    topic = settings.topics.commands
    members: list[AIOKafkaConsumer] = []
    for _ in range(2):
        member = group_consumer(
            settings.kafka_config(),
            settings.loop_config("worker"),
            settings.kafka_consumer_group,
            consumer_class=cls,
        )
        member.subscribe([topic])
        members.append(member)
    await asyncio.gather(*(m.start() for m in members))
    stayer, leaver = members
    try:
        deadline = time.monotonic() + 30
        while not (stayer.assignment() and leaver.assignment()):
            assert time.monotonic() < deadline, "the two members never split the partitions"
            await asyncio.gather(*(m.getmany(timeout_ms=100) for m in members))
        await leaver.stop()
        stopped = time.monotonic()
        deadline = stopped + SESSION_TIMEOUT_MS / 1000
        while len(stayer.assignment()) < 2 and time.monotonic() < deadline:
            await stayer.getmany(timeout_ms=100)
        return time.monotonic() - stopped
    finally:
        for member in members:
            await member.stop()


async def test_a_stopped_member_hands_its_partitions_over_without_the_session_timeout(
    make_settings: SettingsFactory,
) -> None:
    took = await owned_after_peer_stops(make_settings, EmbeddedBrokerConsumer)
    print(f"hand-over after a clean stop: {took:.1f} s")
    assert took < SESSION_TIMEOUT_MS / 1000, f"hand-over took {took:.1f} s"
