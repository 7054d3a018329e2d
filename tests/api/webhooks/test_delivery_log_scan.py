"""Deliveries scans do not queue across workspaces (issue 31, row 8): a workspace whose scans
are slow (its partition of the delivery log answers slowly) holds one scan, on its own
consumer, while another workspace's ``GET .../deliveries`` answers 200 in time; and the scans
of a process are bounded (``max_concurrent`` consumers). Over real HTTP against the real
broker; only the slow partition's fetches are held, by a wrapper of the real consumer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from aiokafka import TopicPartition

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_B, headers, running_api, wait_until
from tests.api.test_api_http import assert_error
from tests.api.webhooks.test_routes import ONE, create, hooks, log_entry
from worker.api.keys import KeyEntry, KeyStore, hash_key
from worker.api.webhooks.delivery_log_scan import DeliveryLogScan, LogSlice
from worker.engine.home_partition import home_partition
from worker.engine.kafka import build_consumer, build_producer, ensure_topics
from worker.runtime.admission import NoRoom
from worker.settings import Settings
from worker.webhooks.secrets_box import generate_key

pytestmark = pytest.mark.integration

SLOW_S = 30.0  # a fetch of the slow partition: far past the scan's time-out (cancelled by it)
#: ws_a's scan hangs this long: ws_b's whole scan (a consumer started, a partition read) fits in
#: it with room on a loaded machine.
SCAN_TIMEOUT_S = 10.0


class SlowPartition:
    """A consumer whose fetches hang while it is assigned ``slow`` (``entered`` is set then)."""

    def __init__(self, inner: Any, slow: set[TopicPartition], entered: asyncio.Event) -> None:
        self._inner = inner
        self._slow = slow
        self._entered = entered

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def getmany(self, *args: Any, **kwargs: Any) -> Any:
        if self._slow & set(self._inner.assignment()):
            self._entered.set()
            await asyncio.sleep(SLOW_S)
        return await self._inner.getmany(*args, **kwargs)


@pytest.fixture
def scan_settings(api_settings: ApiSettings) -> Callable[..., Settings]:
    def factory(**overrides: object) -> Settings:
        return api_settings(**{"webhook_secrets_key": generate_key(), **overrides})

    return factory


async def test_a_slow_workspace_does_not_turn_another_workspaces_deliveries_into_a_500(
    scan_settings: Callable[..., Settings],
) -> None:
    """ws_a's scan hangs on its partition until its time-out; ws_b's request, sent while it
    hangs, answers 200 before ws_a's scan ends (before: it waited for the process's one scan
    lock behind ws_a's, and answered 500 once its own time-out had gone)."""
    settings = scan_settings(webhook_deliveries_scan_timeout_s=SCAN_TIMEOUT_S)
    partitions = settings.other_partitions
    async with (
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, timeout=30) as http,
    ):
        mine = (await create(http))["id"]
        slow_partition = home_partition(mine.encode(), partitions)
        theirs = None
        for _ in range(10):  # an endpoint of ws_b on another partition of the log
            candidate = (await create(http, KEY_B))["id"]
            if home_partition(candidate.encode(), partitions) != slow_partition:
                theirs = candidate
                break
        assert theirs is not None

        scan = hooks(api).deliveries
        entered = asyncio.Event()
        slow = {TopicPartition(settings.topics.webhook_deliveries, slow_partition)}
        real = scan.consumer_factory
        scan.consumer_factory = lambda: SlowPartition(real(), slow, entered)
        await scan.stop()
        await scan.start()

        first = asyncio.create_task(http.get(f"{ONE.format(mine)}/deliveries", headers=headers()))
        await asyncio.wait_for(entered.wait(), 10)
        again = await http.get(f"{ONE.format(mine)}/deliveries", headers=headers())
        assert_error(again, 429, "rate_limited", 90002)  # one scan per workspace, as before

        started = time.monotonic()
        other = await http.get(f"{ONE.format(theirs)}/deliveries", headers=headers(KEY_B))
        elapsed = time.monotonic() - started
        print(f"\nws_b's deliveries while ws_a's scan hangs: {other.status_code} in {elapsed:.3f}s")
        assert other.status_code == 200 and other.json()["data"] == []
        assert elapsed < SCAN_TIMEOUT_S, f"ws_b waited {elapsed:.2f}s"
        assert not first.done(), "ws_a's scan still hangs meanwhile: ws_b did not wait for it"

        mine_answer = await first  # its own time-out: the slow workspace's own 500
        assert mine_answer.status_code == 500


async def test_scans_of_many_workspaces_run_at_once_bounded_by_max_concurrent(
    make_settings: Callable[..., Settings],
) -> None:
    """Five scans of five workspaces at once on a scan of ``max_concurrent=2``: two consumers
    are built and two scans run at once, never more; the other three are refused at once
    (``NoRoom``, the pool full, a Retry-After), not queued; once the two end, the rest are
    served. One workspace's second scan while its first runs is refused for its share."""
    settings = make_settings(partitions=3)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    delay = 0.3
    built = closed = 0

    class Paced:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        async def getmany(self, *args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(delay)
            return await self._inner.getmany(*args, **kwargs)

        async def stop(self) -> None:
            nonlocal closed
            closed += 1
            await self._inner.stop()

    def factory() -> Any:
        nonlocal built
        built += 1
        return Paced(build_consumer(settings.kafka_config(), fetch_max_wait_ms=50))

    scan = DeliveryLogScan(
        factory, settings.topics.webhook_deliveries, window=100, timeout_s=20, max_concurrent=2
    )
    await scan.start()
    try:
        answers = await asyncio.gather(
            *(scan.read(f"ep_{i}", owner=f"ws_{i}", upto=None, lo=None) for i in range(5)),
            return_exceptions=True,
        )
        refused = [a for a in answers if isinstance(a, NoRoom)]
        assert [a.reason for a in refused] == ["full"] * 3
        assert all(a.retry_after_s >= 1 for a in refused)
        assert [a.entries for a in answers if isinstance(a, LogSlice)] == [[]] * 2
        for i in range(2, 5):  # served now that the two have ended
            assert (await scan.read(f"ep_{i}", owner=f"ws_{i}", upto=None, lo=None)).entries == []
        first = asyncio.create_task(scan.read("ep_0", owner="ws_0", upto=None, lo=None))
        await wait_until(lambda: scan.admission.in_use == 1, what="ws_0's scan running")
        with pytest.raises(NoRoom) as again:
            await scan.read("ep_9", owner="ws_0", upto=None, lo=None)
        assert again.value.reason == "share"
        assert (await first).entries == []  # the sixth scan served
    finally:
        await scan.stop()
    # a second consumer is built only for a second scan at once, and no more than two ran
    assert built == 2
    assert closed == built  # all closed by stop


async def test_scans_full_answer_429_with_retry_after_at_once_never_500(
    scan_settings: Callable[..., Settings],
) -> None:
    """Four workspaces' deliveries scans hang (their log answers slowly) and hold the four
    scan slots; a fifth workspace's ``GET .../deliveries`` is answered 429 ``rate_limited``
    with Retry-After at once. On main it waited for the semaphore until its 3 s time-out and
    answered 500 ``get_webhook_endpoint_failed`` with no Retry-After."""
    workspaces = [f"ws_s{i}" for i in range(5)]
    keys = KeyStore([KeyEntry(w, f"k_{w}", bytes.fromhex(hash_key(f"pk_{w}"))) for w in workspaces])
    settings = scan_settings(webhook_deliveries_scan_timeout_s=3.0)
    async with (
        running_api(settings, keys=keys) as api,
        httpx.AsyncClient(base_url=api.url, timeout=30) as http,
    ):
        ids = {w: (await create(http, f"pk_{w}"))["id"] for w in workspaces}
        scan = hooks(api).deliveries
        entered = asyncio.Event()
        every = {
            TopicPartition(settings.topics.webhook_deliveries, p)
            for p in range(settings.other_partitions)
        }
        real = scan.consumer_factory
        scan.consumer_factory = lambda: SlowPartition(real(), every, entered)
        await scan.stop()
        await scan.start()
        hanging = [
            asyncio.create_task(
                http.get(f"{ONE.format(ids[w])}/deliveries", headers=headers(f"pk_{w}"))
            )
            for w in workspaces[:4]
        ]
        await wait_until(lambda: scan.admission.in_use == 4, what="four scans holding the slots")
        fifth = workspaces[4]
        resp = await http.get(
            f"{ONE.format(ids[fifth])}/deliveries", headers=headers(f"pk_{fifth}")
        )
        body = assert_error(resp, 429, "rate_limited", 90002)
        assert "every deliveries scan slot" in body["error"]["message"]
        assert int(resp.headers["retry-after"]) >= 1
        assert not any(t.done() for t in hanging), "the four still hold their slots"
        for answer in await asyncio.gather(*hanging):
            assert answer.status_code == 500  # their own scans' time-out, their own 500
        # the slots are free again, and the four spent their own time, not the fifth's
        assert scan.admission.in_use == 0


class LateFirstAnswer:
    """A real consumer whose first poll comes back empty before any fetch answer, as on a
    loaded broker: until a poll hands out records it reports no high-water mark."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.answered = False
        self.polls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._inner.highwater(tp) if self.answered else None

    async def getmany(self, *args: Any, **kwargs: Any) -> Any:
        self.polls += 1
        if self.polls == 1:
            return {}
        batch = await self._inner.getmany(*args, **kwargs)
        self.answered = self.answered or bool(batch)
        return batch


async def test_a_scan_learns_where_the_partition_ends_from_an_answer_not_an_empty_poll(
    make_settings: Callable[..., Settings],
) -> None:
    """Two log records in one batch, the wanted delivery in the second. The embedded broker's
    ``end_offsets`` names the start of its last batch + 1, so the scan takes the end from the
    first fetch answer's high-water mark; a first poll that comes back before any answer
    must not stand for it (before: it did, the end stayed short of the batch's second record,
    and the delivery's page answered 404 while the list, read a moment earlier, showed it;
    seen in the portal's browser test)."""
    settings = make_settings(partitions=1)
    await ensure_topics(settings.kafka_config(), settings.topic_plan())
    topic = settings.topics.webhook_deliveries
    producer = build_producer(settings.kafka_config())
    await producer.start()
    try:
        batch = producer.create_batch()
        for webhook_id in ("msg_other", "msg_wanted"):
            entry = log_entry("ep_batched", webhook_id, "delivered", 1)
            batch.append(key=b"ep_batched", value=entry.model_dump_json().encode(), timestamp=None)
        batch.close()
        await (await producer.send_batch(batch, topic, partition=0))
    finally:
        await producer.stop()

    made: list[LateFirstAnswer] = []

    def factory() -> LateFirstAnswer:
        made.append(LateFirstAnswer(build_consumer(settings.kafka_config(), fetch_max_wait_ms=50)))
        return made[-1]

    scan = DeliveryLogScan(factory, topic, window=100, timeout_s=20)
    await scan.start()
    try:
        found = await scan.read("ep_batched", owner="ws_a", upto=None, lo=None)
    finally:
        await scan.stop()
    assert made[0].polls >= 2
    assert [e.webhook_id for _, e in found.entries] == ["msg_other", "msg_wanted"]
