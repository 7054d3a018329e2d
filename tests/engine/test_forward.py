"""Commands from any Kafka client: the worker routes by key, not by arrival partition.

The front-end produces with aiokafka (the Java client's murmur2 partitioner); librdkafka-based
clients default to CRC32 (``consistent_random``). Here commands are produced with
confluent-kafka's defaults against the session broker, and the worker must answer exactly as if
aiokafka had produced them: each mis-partitioned command is forwarded to its home partition
(``worker/engine/home_partition.py``), counted, and a forwarded duplicate is applied once.
"""

from __future__ import annotations

import asyncio
import random
import uuid
import zlib
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner, murmur2
from confluent_kafka import KafkaError, Message, Producer

from tests.auth.test_worker import error_of, registered, sim_calls
from tests.harness import Bus, bus, confirm_cmd, register_cmd, running_worker
from worker.contract.messages import COMMAND_TYPES, DeregisterAccount, ObserveAuthState
from worker.engine.home_partition import FORWARDED_FROM, forwarded_from, home_partition
from worker.settings import Settings

# --- the home-partition function -----------------------------------------------------------

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (the Java client), signed 32-bit.
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}
# The Java client's partition for these keys among 1,000 partitions (kafka-python's and
# aiokafka's compatibility vectors).
JAVA_PARTITION_OF_1000 = {
    b"": 681,
    b"a": 524,
    b"ab": 434,
    b"abc": 107,
    b"123456789": 566,
    b"\x00 ": 742,
}


@pytest.mark.parametrize(("key", "signed"), JAVA_MURMUR2.items())
def test_murmur2_is_the_java_clients(key: bytes, signed: int) -> None:
    assert murmur2(key) == signed & 0xFFFFFFFF
    assert home_partition(key, 2**31 - 1) == (signed & 0x7FFFFFFF) % (2**31 - 1)


@pytest.mark.parametrize(("key", "partition"), JAVA_PARTITION_OF_1000.items())
def test_home_partition_is_the_java_clients(key: bytes, partition: int) -> None:
    assert home_partition(key, 1000) == partition


def test_home_partition_is_aiokafkas_default_partitioner() -> None:
    rng = random.Random(7)
    partitioner = DefaultPartitioner()
    for _ in range(500):
        key = rng.randbytes(rng.randrange(0, 40))
        n = rng.randrange(1, 64)
        all_partitions = list(range(n))
        assert home_partition(key, n) == partitioner(key, all_partitions, all_partitions)


def test_forwarded_from_reads_the_header() -> None:
    assert forwarded_from([("x", b"1"), (FORWARDED_FROM, b"auth.commands:3:17")]) == (
        "auth.commands:3:17"
    )
    assert forwarded_from([("x", b"1")]) is None


# --- through a real broker, produced by librdkafka -----------------------------------------

PARTITIONS = 6


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def misrouted_uid(prefix: str) -> str:
    """An account id librdkafka's CRC32 partitioner puts off its murmur2 home partition."""
    while True:
        account = uid(prefix)
        key = account.encode()
        if zlib.crc32(key) % PARTITIONS != home_partition(key, PARTITIONS):
            return account


class RdProducer:
    """confluent-kafka with its defaults (partitioner ``consistent_random``); remembers where
    each record landed."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.topics.commands
        self.producer = Producer(
            # the session broker outlives this producer only per test: no reconnect chatter
            {"bootstrap.servers": settings.bootstrap, "acks": "all", "log.connection.close": False}
        )
        self.landed: list[tuple[bytes, int]] = []

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        key = msg.key()
        partition = msg.partition()
        assert isinstance(key, bytes) and partition is not None
        self.landed.append((key, partition))

    async def send(self, cmd: Any) -> None:
        self.producer.produce(
            self.topic,
            cmd.model_dump_json().encode(),
            key=cmd.account_id.encode(),
            on_delivery=self._delivered,
        )
        left = await asyncio.to_thread(self.producer.flush, 15.0)
        assert left == 0, "confluent-kafka did not deliver"


def forwards(registry: Any, command_type: str) -> float:
    value = registry.get_sample_value(
        "passkey_auth_commands_forwarded_total", {"type": command_type}
    )
    return float(value or 0.0)


def answer(body: dict[str, Any]) -> str:
    return str(body["data"]["status"] if "data" in body else body["error"]["code"])


def scenario_shape(b: Bus, account: str, cmd_ids: list[str]) -> dict[str, Any]:
    """What the worker answered about one account, without the ids that differ per account."""
    return {
        "replies": [
            (r["http_status"], answer(r["body"])) for c in cmd_ids for r in b.replies(command_id=c)
        ],
        "statuses": [
            (e["previous_status"], e["status"], e["version"])
            for e in b.status_events(account_id=account)
        ],
        "errors": [(e["error"]["code"], e["http_status"]) for e in b.errors(account_id=account)],
    }


@pytest.mark.integration
async def test_every_command_type_from_confluent_kafka_is_answered_as_from_aiokafka(
    make_settings: Any, simulator: str
) -> None:
    settings = make_settings(
        partitions=PARTITIONS,
        provider_urls={"simulator": simulator},
        worker_follow_up_poll_s=60.0,  # the flow stays at `sent` unless an observe moves it
    )
    rd = RdProducer(settings)
    async with bus(settings) as b, running_worker(settings) as running:
        shapes = []
        for send in (b.send, rd.send):
            acc = misrouted_uid("acc")
            reg = register_cmd(acc, uid("ok"))
            await send(reg)
            await b.wait_for(lambda: bool(b.status_events(command_id=reg.command_id)))  # noqa: B023
            confirm = confirm_cmd(acc)
            await send(confirm)
            assert (await b.reply_to(confirm.command_id))["http_status"] == 200
            assert await sim_calls(simulator, confirm.command_id) == 1
            obs = ObserveAuthState(
                command_id=uid("obs"),
                account_id=acc,
                status="authorized",
                auth_status="authorized",
                source="webhook",
            )
            await send(obs)
            await b.wait_for(lambda: bool(b.status_events(command_id=obs.command_id)))  # noqa: B023
            dereg = DeregisterAccount(command_id=uid("dereg"), workspace_id="ws_a", account_id=acc)
            await send(dereg)
            after = confirm_cmd(acc)
            await send(after)
            assert error_of(await b.reply_to(after.command_id)) == (404, "not_found", 10001)
            await b.wait_for(lambda: bool(b.errors(command_id=after.command_id)))  # noqa: B023
            shapes.append(scenario_shape(b, acc, [confirm.command_id, after.command_id]))

        aiokafka_shape, rdkafka_shape = shapes
        assert rdkafka_shape == aiokafka_shape
        assert rdkafka_shape["statuses"] == [
            (None, "passkey_confirmation", 1),
            ("passkey_confirmation", "passkey_confirmation_sent", 2),
            ("passkey_confirmation_sent", "authorized", 3),
        ]
        # librdkafka really put every command off its home partition, and each was forwarded
        assert len(rd.landed) == 5
        assert all(p != home_partition(k, PARTITIONS) for k, p in rd.landed)
        counted = {t: forwards(running.registry, t) for t in COMMAND_TYPES}
        assert counted == {
            "register_account": 1,
            "passkey_confirm": 2,
            "observe_auth_state": 1,
            "deregister_account": 1,
            "get_auth_state": 0,  # none sent here
        }


@pytest.mark.integration
async def test_a_forwarded_duplicate_is_applied_once(make_settings: Any, simulator: str) -> None:
    """The same command twice on the wrong partition is what a crash between the forward and
    the commit leaves behind: two forwarded copies on the home partition."""
    settings = make_settings(
        partitions=PARTITIONS,
        provider_urls={"simulator": simulator},
        worker_follow_up_poll_s=60.0,
    )
    rd = RdProducer(settings)
    async with bus(settings) as b, running_worker(settings) as running:
        acc = misrouted_uid("acc")
        reg = register_cmd(acc, uid("ok"), status="pending_auth")
        await rd.send(reg)
        await rd.send(reg)
        obs = ObserveAuthState(
            command_id=uid("obs"),
            account_id=acc,
            status="passkey_confirmation",
            auth_status="passkey_confirmation",
        )
        await rd.send(obs)
        await rd.send(obs)
        confirm = confirm_cmd(acc)
        await rd.send(confirm)
        await rd.send(confirm)
        await b.wait_for(lambda: len(b.replies(command_id=confirm.command_id)) == 2)
        first, second = b.replies(command_id=confirm.command_id)
        assert first == second
        assert first["http_status"] == 200
        assert await sim_calls(simulator, confirm.command_id) == 1
        dereg = DeregisterAccount(command_id=uid("dereg"), workspace_id="ws_a", account_id=acc)
        await rd.send(dereg)
        await rd.send(dereg)
        after = confirm_cmd(acc)
        await rd.send(after)
        assert error_of(await b.reply_to(after.command_id)) == (404, "not_found", 10001)

        # each duplicate re-sent the original events (same ids) and moved nothing
        distinct = {e["event_id"]: e for e in b.status_events(account_id=acc)}
        assert [(e["status"], e["version"]) for e in distinct.values()] == [
            ("pending_auth", 1),
            ("passkey_confirmation", 2),
            ("passkey_confirmation_sent", 3),
        ]
        assert len(b.status_events(command_id=reg.command_id)) == 2
        assert len(b.status_events(command_id=obs.command_id)) == 2
        assert forwards(running.registry, "passkey_confirm") == 3
        assert forwards(running.registry, "deregister_account") == 2


@pytest.mark.integration
async def test_a_forwarded_command_off_its_home_again_is_dead_lettered(
    make_settings: Any, simulator: str
) -> None:
    """No ping-pong: a copy that was forwarded once and still is not home (the partition count
    changed between the hops) goes to the DLQ; nothing is decided and it is not forwarded."""
    settings = make_settings(partitions=PARTITIONS, provider_urls={"simulator": simulator})
    async with bus(settings) as b, running_worker(settings) as running:
        acc = uid("acc")
        await registered(b, acc, uid("ok"))
        home = home_partition(acc.encode(), PARTITIONS)
        elsewhere = (home + 1) % PARTITIONS
        confirm = confirm_cmd(acc)
        origin = f"{settings.topics.commands}:{home}:0".encode()
        await b.producer.send_and_wait(
            settings.topics.commands,
            confirm.model_dump_json().encode(),
            key=acc.encode(),
            partition=elsewhere,
            headers=[(FORWARDED_FROM, origin)],
        )
        # a record without a key is still dead-lettered as before, wherever it lands
        await b.producer.send_and_wait(
            settings.topics.commands, confirm_cmd(acc).model_dump_json().encode(), key=None
        )
        await b.wait_for(lambda: len(b.raw.get(settings.topics.dlq, [])) == 2)
        reasons = sorted(dict(h)["dlq.reason"].decode() for _, _, h in b.raw[settings.topics.dlq])
        assert reasons == ["key_mismatch", "misrouted"]
        misrouted = next(
            h for _, _, h in b.raw[settings.topics.dlq] if dict(h)["dlq.reason"] == b"misrouted"
        )
        assert origin in dict(misrouted)["dlq.detail"]
        await b.wait_for(lambda: bool(b.errors(command_id=confirm.command_id)))
        # Its caller is answered (not left to time out), with the catalogued refusal.
        reply = await b.reply_to(confirm.command_id)
        assert (reply["http_status"], reply["body"]["error"]["code"]) == (400, "invalid_request")
        assert await sim_calls(simulator, confirm.command_id) == 0
        assert forwards(running.registry, "passkey_confirm") == 0
        assert [e["status"] for e in b.status_events(account_id=acc)] == ["passkey_confirmation"]
