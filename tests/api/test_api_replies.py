"""Reply correlation at scale: many concurrent requests, several front-end replicas, replies
that nobody waits for, mismatched ids, backlogs at start-up and a dying consumer."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

import httpx
import pytest
from aiokafka.errors import KafkaConnectionError

from tests.api.conftest import ApiSettings
from tests.api.support import headers, produce, responder, running_api, wait_until
from worker.api.replies import CorrelatedReply, PendingReply, ReplyError, ReplyRouter
from worker.contract.messages import Reply
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.settings import Settings

pytestmark = pytest.mark.integration

CONFIRM = "/v1/accounts/{}/auth/passkey-confirm"
REPLIES_PARTITION = 0
WRITER_ROUNDS = 400  # of 20 replies per writer: three writers interleave on one partition


def reply_bytes(command_id: str, request_id: str, account_id: str = "acc_1") -> bytes:
    return (
        Reply(
            command_id=command_id,
            request_id=request_id,
            account_id=account_id,
            http_status=200,
            body={
                "request_id": request_id,
                "data": {"account_id": account_id, "status": "s", "auth_status": "s"},
            },
        )
        .model_dump_json(exclude_none=True)
        .encode()
    )


async def confirm_many(
    http: httpx.AsyncClient, n: int, tag: str
) -> list[tuple[str, str, httpx.Response]]:
    async def one(i: int) -> tuple[str, str, httpx.Response]:
        account, rid = f"acc_{tag}_{i % 37}", f"req-{tag}-{i}"
        resp = await http.post(CONFIRM.format(account), headers=headers(**{"X-Request-Id": rid}))
        return account, rid, resp

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def assert_own_replies(results: list[tuple[str, str, httpx.Response]]) -> None:
    for account, rid, resp in results:
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["request_id"] == rid == resp.headers["x-request-id"]
        assert body["data"]["account_id"] == account


def mismatches(logged: list[MutableMapping[str, Any]]) -> list[str]:
    """The command ids of the replies dropped for another request id, as logged."""
    return [e["command_id"] for e in logged if e["event"] == "reply_request_id_mismatch"]


async def test_200_concurrent_requests_one_front_end_then_two_replicas(
    api_settings: ApiSettings, logged: list[MutableMapping[str, Any]]
) -> None:
    """Replies arrive in random order (the responder delays each up to 200 ms); each replica
    reads only the replies of its own commands, on its own partition; each request gets
    exactly its own, and afterwards no waiter is left anywhere."""
    # 400 requests at once from one workspace on one replica: past any sane rate limit.
    settings = api_settings(
        api_reply_timeout_s=20.0, api_rate_limit_per_s=0, api_max_connections_per_client=0
    )
    # A fresh client per phase: httpx's pool gets slow with hundreds of idle connections.
    limits = httpx.Limits(max_connections=250)
    async with (
        responder(settings, max_delay_s=0.2) as worker,
        running_api(settings.model_copy(update={"api_reply_partition": 0})) as one,
        running_api(settings.model_copy(update={"api_reply_partition": 1})) as two,
    ):
        async with httpx.AsyncClient(base_url=one.url, limits=limits, timeout=30) as http:
            started = time.perf_counter()
            results = await confirm_many(http, 200, "single")
            single_s = time.perf_counter() - started
        assert_own_replies(results)
        assert one.replies.pending == 0

        async with (
            httpx.AsyncClient(base_url=one.url, limits=limits, timeout=30) as http_one,
            httpx.AsyncClient(base_url=two.url, limits=limits, timeout=30) as http_two,
        ):
            started = time.perf_counter()
            both = await asyncio.gather(
                confirm_many(http_one, 200, "a"), confirm_many(http_two, 200, "b")
            )
            pair_s = time.perf_counter() - started
        for results in both:
            assert_own_replies(results)
        assert one.replies.pending == 0
        assert two.replies.pending == 0
        assert len(worker.commands) == 600
        assert len({c.command_id for c in worker.commands}) == 600
        # each replica read only its own replies, each request answered with its own (the
        # change of the "front-end at scale" issue: before it, each read all 600)
        assert mismatches(logged) == []
        assert [tp.partition for tp in one.replies.partitions] == [0]
        assert [tp.partition for tp in two.replies.partitions] == [1]
        await wait_until(lambda: (one.replies.records, two.replies.records) == (400, 200))
        print(f"200 concurrent confirms: {single_s:.2f}s; 2x200 on two replicas: {pair_s:.2f}s")


async def test_a_replica_reading_several_partitions_names_them_in_turn(
    api_settings: ApiSettings, logged: list[MutableMapping[str, Any]]
) -> None:
    """``API_REPLY_PARTITIONS=3`` from partition 2 of 4: the replica reads 2, 3 and 0
    (wrapping), its commands name them in turn, so each holds a third of its replies, and
    every request still gets exactly its own reply."""
    settings = api_settings(
        partitions=4,
        api_reply_partition=2,
        api_reply_partitions=3,
        api_rate_limit_per_s=0,
        api_max_connections_per_client=0,
    )
    async with responder(settings, max_delay_s=0.05) as worker, running_api(settings) as api:
        assert [tp.partition for tp in api.replies.partitions] == [2, 3, 0]
        async with httpx.AsyncClient(base_url=api.url, timeout=30) as http:
            results = await confirm_many(http, 60, "spread")
        assert_own_replies(results)
        assert set(worker.reply_to) == {0, 2, 3}
        assert all(worker.reply_to.count(p) == 20 for p in (0, 2, 3))
        assert mismatches(logged) == []
        assert api.replies.pending == 0


async def reply_within(waiter: PendingReply, seconds: float) -> CorrelatedReply | None:
    """The reply as a request handler waits for it: under its deadline (``PendingReply.until``)."""
    async with asyncio.timeout(seconds) as limit:
        return await waiter.until(limit)


async def started_router(settings: Settings, **kw: Any) -> ReplyRouter:
    """A router on partition 0 of the replies topic; the tests produce there."""
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    kw.setdefault("partition", REPLIES_PARTITION)
    router = ReplyRouter(
        build_consumer(settings.kafka_config(), fetch_max_wait_ms=50), settings.topics.replies, **kw
    )
    await router.start()
    assert await router.wait_caught_up(20)
    return router


async def test_only_the_matching_request_id_is_delivered(
    make_settings: Any, logged: list[MutableMapping[str, Any]]
) -> None:
    settings = make_settings()
    router = await started_router(settings)
    try:
        cid = str(uuid.uuid4())
        with router.expect(cid, "req-right") as waiter:
            assert router.pending == 1
            before = router.records
            await produce(
                settings,
                settings.topics.replies,
                partition=REPLIES_PARTITION,
                records=[
                    (b"acc_1", reply_bytes(cid, "req-wrong")),  # same command id, other request
                    (b"acc_1", reply_bytes(str(uuid.uuid4()), "req-right")),  # other command
                    (b"acc_1", b"not json"),
                    (b"acc_1", b"[1, 2]"),
                    (b"acc_1", None),
                ],
            )
            await wait_until(lambda: router.records >= before + 5)
            assert not waiter.done
            assert mismatches(logged) == [cid]
            await produce(
                settings,
                settings.topics.replies,
                partition=REPLIES_PARTITION,
                records=[(b"acc_1", reply_bytes(cid, "req-right"))],
            )
            got = await reply_within(waiter, 10)
            assert got is not None
            assert got.reply.command_id == cid
            want = reply_bytes(cid, "req-right")
            assert got.body in want  # the body is passed on as the record holds it
            assert json.loads(got.body) == json.loads(want)["body"]
        assert router.pending == 0
    finally:
        await router.stop()


async def test_waiters_are_removed_on_timeout_cancel_and_error(make_settings: Any) -> None:
    settings = make_settings()
    router = await started_router(settings)
    try:
        with router.expect("c-timeout", "r1") as waiter:
            assert await reply_within(waiter, 0.05) is None
        assert router.pending == 0

        async def wait_forever() -> None:
            with router.expect("c-cancel", "r2") as w:
                await reply_within(w, 3600)

        task = asyncio.create_task(wait_forever())
        await wait_until(lambda: router.pending == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert router.pending == 0

        with pytest.raises(RuntimeError), router.expect("c-error", "r3"):
            raise RuntimeError("send failed")
        assert router.pending == 0

        with router.expect("c-dup", "r4"), pytest.raises(ValueError, match="already"):
            router.expect("c-dup", "r4")
        assert router.pending == 0

        # replies for commands nobody (or nobody any more) waits for are not kept anywhere;
        # the count is read before producing: the router may read some before ``produce``
        # returns
        before = router.records
        await produce(
            settings,
            settings.topics.replies,
            partition=REPLIES_PARTITION,
            records=[
                (b"acc_1", reply_bytes(c, r)) for c, r in (("c-timeout", "r1"), ("c-cancel", "r2"))
            ]
            + [(b"acc_1", reply_bytes(str(uuid.uuid4()), "x")) for _ in range(500)],
        )
        await wait_until(lambda: router.records >= before + 502)
        assert router.pending == 0
        with router.expect("c-timeout", "r1") as again:  # its reply was kept for nobody
            assert await reply_within(again, 0.05) is None
    finally:
        await router.stop()


async def test_backlog_is_skipped_before_ready_and_new_replies_flow(make_settings: Any) -> None:
    """Start-up on a topic holding 20 000 old replies: ready only after skipping them all
    (a correct 'start at the end' without seek_to_end, which the embedded broker gets
    wrong); a reply produced afterwards is delivered."""
    settings = make_settings()
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    backlog = [
        (f"acc_{i % 50}".encode(), reply_bytes(f"old-{i}", f"req-old-{i}")) for i in range(20_000)
    ]
    await produce(settings, settings.topics.replies, partition=REPLIES_PARTITION, records=backlog)
    started = time.perf_counter()
    router = await started_router(settings)
    took = time.perf_counter() - started
    try:
        assert router.ready
        assert router.records == 20_000
        for tp in router.partitions:
            high = router.consumer.highwater(tp)
            assert high is not None
            assert await router.consumer.position(tp) >= high
        with router.expect("new-1", "req-new-1") as waiter:
            await produce(
                settings,
                settings.topics.replies,
                partition=REPLIES_PARTITION,
                records=[(b"acc_7", reply_bytes("new-1", "req-new-1"))],
            )
            got = await reply_within(waiter, 10)
        assert got is not None
        assert got.reply.request_id == "req-new-1"
        print(f"skipped a 20000-reply backlog in {took:.2f}s")
    finally:
        await router.stop()


class _DyingConsumer:
    """A consumer whose fetch fails after the first (empty) poll."""

    def __init__(self) -> None:
        self.polls = 0
        self.stopped = False

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.stopped = True

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}

    def assign(self, tps: list[Any]) -> None:
        return None

    async def seek_to_beginning(self, *tps: Any) -> None:
        return None

    def highwater(self, tp: Any) -> int | None:
        return 0 if self.polls else None  # an empty partition, once a fetch answered

    async def position(self, tp: Any) -> int:
        return 0

    async def getmany(self, **_: Any) -> dict[Any, list[Any]]:
        self.polls += 1
        if self.polls == 1:
            return {}
        await asyncio.sleep(0.2)
        raise KafkaConnectionError("broker gone")


async def test_a_dying_consumer_fails_waiters_fast_and_turns_unready() -> None:
    consumer = _DyingConsumer()
    router = ReplyRouter(consumer, "replies")
    await router.start()
    assert await router.wait_caught_up(5)
    with router.expect("c1", "r1") as waiter, pytest.raises(ReplyError):
        await reply_within(waiter, 10)
    assert not router.ready
    assert isinstance(router.failure, KafkaConnectionError)
    with pytest.raises(ReplyError):
        router.expect("c2", "r2")
    await router.stop()
    assert consumer.stopped
    assert router.pending == 0


async def test_replies_are_matched_and_duplicates_dropped(
    make_settings: Any,
) -> None:
    settings = make_settings(partitions=6)
    router = await started_router(settings)
    try:
        ids = [(str(uuid.uuid4()), f"r{i}", f"acc_{i}") for i in range(60)]
        waiters = [router.expect(c, r) for c, r, _ in ids]
        records = [(a.encode(), reply_bytes(c, r, a)) for c, r, a in ids]
        await produce(
            settings,
            settings.topics.replies,
            partition=REPLIES_PARTITION,
            records=records + records,
        )  # each twice
        got = await asyncio.gather(*(reply_within(w, 10) for w in waiters))
        for w in waiters:
            w.__exit__(None, None, None)
        assert [g.reply.account_id for g in got if g is not None] == [a for _, _, a in ids]
        assert router.pending == 0
        await wait_until(lambda: router.records >= 120)
    finally:
        await router.stop()


async def test_a_replica_started_and_stopped_under_load_loses_no_reply(
    api_settings: ApiSettings,
) -> None:
    """Replica one serves a steady stream of confirms while replica two comes and goes (as
    an autoscaler or a rolling update does): every request of either gets its own reply, and
    nothing is left waiting."""
    # 300 confirms at once from one workspace: a load test, not the rate limit's (burst 200).
    settings = api_settings(
        api_reply_timeout_s=20.0, api_rate_limit_per_s=0, api_max_connections_per_client=0
    )
    async with (
        responder(settings, max_delay_s=0.05),
        running_api(settings) as one,
        httpx.AsyncClient(base_url=one.url, timeout=30) as http_one,
    ):
        load = asyncio.create_task(confirm_many(http_one, 300, "steady"))
        for round_ in range(2):
            async with (
                running_api(settings) as two,
                httpx.AsyncClient(base_url=two.url, timeout=30) as http_two,
            ):
                assert_own_replies(await confirm_many(http_two, 40, f"visitor{round_}"))
        assert_own_replies(await load)
        assert one.replies.pending == 0


async def test_replies_written_by_several_producers_all_reach_their_waiters(
    make_settings: Any,
) -> None:
    """Workers in a pool all write to one replica's partition. On the embedded broker a
    tailing fetch can see a later producer's batch before an earlier one's is stored; the
    router must wait for the earlier one, not move past it (every waiter answered)."""
    settings = make_settings()
    router = ReplyRouter(
        build_consumer(settings.kafka_config(), fetch_max_wait_ms=5),
        settings.topics.replies,
        partition=REPLIES_PARTITION,
        behind_after_s=30,
        gap_hold_s=5.0,  # as tests/engine/test_fetch_gaps.py: a loaded broker stores late
    )
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    await router.start()
    assert await router.wait_caught_up(20)
    producers = [build_producer(settings.kafka_config()) for _ in range(3)]
    for producer in producers:
        await producer.start()
    waiters: list[Any] = []

    async def write(producer: Any, n: int) -> None:
        # Bounded by count, not time: a slower machine writes as many, only later.
        for round_ in range(WRITER_ROUNDS):
            ids = [(str(uuid.uuid4()), f"req-{n}-{round_}-{i}") for i in range(20)]
            waiters.extend(router.expect(cid, rid) for cid, rid in ids)
            acks = [
                await producer.send(
                    settings.topics.replies, reply_bytes(cid, rid), partition=REPLIES_PARTITION
                )
                for cid, rid in ids
            ]
            await asyncio.gather(*acks)
            await asyncio.sleep(0.001)

    try:
        await asyncio.gather(*(write(p, n) for n, p in enumerate(producers)))
        # Every waiter is answered once the router read the whole partition; the bound only
        # ends a router that lost a reply (a slower machine reads the backlog longer).
        got = await asyncio.gather(*(reply_within(w, 120) for w in waiters))
        missing = sum(reply is None for reply in got)
        for w in waiters:
            w.__exit__(None, None, None)
        assert missing == 0, f"{missing} of {len(waiters)} replies never delivered"
        assert router.gaps is not None and router.gaps.given_up == 0
        assert router.pending == 0
    finally:
        for producer in producers:
            await producer.stop()
        await router.stop()


class _StallingConsumer(_DyingConsumer):
    """A consumer whose fetches, after the first, never come back."""

    async def getmany(self, *tps: Any, **_: Any) -> Any:
        self.polls += 1
        if self.polls > 1:
            await asyncio.Event().wait()
        return {}


async def test_a_reader_that_stops_fetching_says_so_and_turns_unready() -> None:
    router = ReplyRouter(_StallingConsumer(), "replies", behind_after_s=0.2)
    await router.start()
    try:
        assert await router.wait_caught_up(5)
        assert router.keeping_up
        await wait_until(lambda: not router.keeping_up, timeout=5)
        assert router.running, "stalled, not dead: only readiness can tell"
        assert router.state()["reply_fetch_age_s"] > 0.2
    finally:
        await router.stop()
