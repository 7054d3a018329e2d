"""The dispatcher's own code per delivery, in one process: no broker, no consume engine.

``python -m bench.dispatcher_inproc`` builds the real ``Dispatcher`` (its store, gate,
intake, instrumentation, signing and the real ``DeliveryPublisher`` over a producer that
acknowledges every record at once) and drives it as the consume loop does: each event is
handed to ``handle`` inside a record's hold context, the keys it returns and the store's due
timers run as one follow-up lane per pair. The sender answers 204 at once (``--http``: the
real HTTP/1.1 client over loopback to ``bench.webhook_receiver`` in its own process, so its
CPU is not counted). CPU is ``time.process_time`` of this process over ``--events`` status
events (four versions per account, interleaved, over 12 partitions, one endpoint) after a
warm-up of a quarter as many; every delivery must be attempted once.

``--against TREE`` alternates rounds between this tree and a checkout at TREE (``git worktree
add``), each round in a fresh process of its tree, the order flipping each round: the figure
another commit gives under the same load (bench/README.md, "Webhook delivery"). The program
imports only the dispatcher's modules, under either layout (``worker.dispatcher`` or the
older ``worker.webhooks``), so it runs against older trees as they were.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
import zlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PARTITIONS = 12
SECRET = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LW9mLWEtYmVuY2g="
STATUS = "auth.status"


def _in_tree(module: str) -> bool:
    """Whether ``module`` is a file of the tree ``worker`` is imported from (an editable
    install's finder would import a missing one from another tree)."""
    root = Path(importlib.import_module("worker").__file__ or "").parent.parent
    return (root / module.replace(".", "/")).with_suffix(".py").is_file()


def _module(name: str) -> Any:
    """``worker.dispatcher.<name>``, or ``worker.webhooks.<name>`` in older trees."""
    here = f"worker.dispatcher.{name}"
    return importlib.import_module(here if _in_tree(here) else f"worker.webhooks.{name}")


class Acked:
    """A producer whose every record is acknowledged at once."""

    def __init__(self) -> None:
        self.records = 0

    async def send(self, topic: str, value: bytes | None, **_: Any) -> asyncio.Future[None]:
        self.records += 1
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class Answering:
    """The HTTP boundary answering 204 at once."""

    def __init__(self, result: Any) -> None:
        self.result = result
        self.posts = 0

    async def post(self, url: str, body: bytes, headers: Any) -> Any:
        self.posts += 1
        return self.result


class Secrets:
    def signing_secrets(self, record: Any) -> list[str]:
        return [SECRET]


def _events(n: int, run: str) -> Iterator[tuple[int, bytes]]:
    """``n`` status events: ``n // 4`` accounts, versions 1-4, each account's interleaved."""
    accounts = max(1, n // 4)
    for i in range(n):
        account = f"acc_{run}_{i % accounts}"
        version = i // accounts + 1
        event = {
            "schema_version": 1,
            "type": "auth_status_changed",
            "event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{account}/{version}")),
            "account_id": account,
            "workspace_id": "ws_bench",
            "previous_status": "passkey_confirmation",
            "status": "authorized",
            "auth_status": "authorized",
            "version": version,
            "occurred_at": "2026-11-29T17:00:00.000Z",
        }
        yield zlib.crc32(account.encode()) % PARTITIONS, json.dumps(event).encode()


class Harness:
    """One dispatcher and the lanes the consume loop would run for it."""

    def __init__(self, url: str | None) -> None:
        from aiokafka.structs import ConsumerRecord
        from prometheus_client import CollectorRegistry

        self._record = ConsumerRecord
        endpoints_mod = importlib.import_module("worker.webhooks.endpoints")
        contract = "worker.contract.webhook_endpoints"
        record_cls = (
            importlib.import_module(contract).EndpointRecord
            if _in_tree(contract)
            else endpoints_mod.EndpointRecord
        )
        sender_mod, dispatcher_mod = _module("sender"), _module("dispatcher")
        self.endpoints = endpoints_mod.EndpointRegistry()
        self.endpoints.apply(
            record_cls(
                id="ep_bench",
                workspace_id="ws_bench",
                url=url or "https://hooks.example.test/in",
                status="active",
                created_at="2026-01-01T00:00:00Z",
                updated_at="2026-01-01T00:00:00Z",
                revision=1,
            )
        )
        self.session = None
        if url is None:
            self.sender: Any = Answering(sender_mod.DeliveryResult(204, 0.001))
        else:
            policy = importlib.import_module("worker.webhooks.targets").TargetPolicy(True, True)
            # The pool the dispatcher builds from its settings' defaults (``run_dispatcher``):
            # with open_session's own smaller per-host default, attempts the gate admits
            # would wait for a connection, which the process never does.
            fields = importlib.import_module("worker.settings").Settings.model_fields
            self.session = sender_mod.open_session(
                policy,
                max_connections=fields["webhook_max_connections"].default,
                max_connections_per_host=fields["webhook_max_connections_per_host"].default,
            )
            self.sender = sender_mod.Sender(self.session)
        self.producer = Acked()
        metrics = _module("metrics").WebhookMetrics(CollectorRegistry())
        publisher = _module("publish").DeliveryPublisher(
            self.producer,
            state_topic="webhook.delivery-state",
            log_topic="webhook.deliveries",
            dlq_topic="webhook.dlq",
            on_state=metrics.state_record_bytes.observe,
            log_flush_s=0.01,
        )
        self.store = _module("delivery_store").DeliveryStore(
            workspace_of=self.endpoints.workspace_of
        )
        for p in range(PARTITIONS):
            self.store.load(p, {})
        fields = {f for f in dispatcher_mod.DispatchConfig.__dataclass_fields__}
        config = dispatcher_mod.DispatchConfig(
            status_topic=STATUS,
            replay_topic="webhook.replays",
            schedule=(5.0, 300.0),
            disable_after_s=5 * 86400.0,
            hold_s=2.0,
            **({"errors_topic": "auth.errors"} if "errors_topic" in fields else {}),
        )
        parts = {
            "endpoints": self.endpoints,
            "writer": Secrets(),
            "sender": self.sender,
            "sign": importlib.import_module("worker.webhooks.signing").headers,
            "publisher": publisher,
        }
        kwargs: dict[str, Any] = {"store": self.store, "config": config, "metrics": metrics}
        if "ports" in inspect.signature(dispatcher_mod.Dispatcher).parameters:
            kwargs["ports"] = _module("dispatch_ports").Ports(**parts)
        else:
            kwargs |= parts
        self.dispatcher = dispatcher_mod.Dispatcher(**kwargs)
        self._lanes: dict[str, asyncio.Task[None]] = {}
        self.failures: list[str] = []
        self._holds: deque[Any] = deque()
        self._offsets = [0] * PARTITIONS
        self._trackers: dict[int, Any] = {}  # one a partition, as the loop keeps

    async def _handle(self, partition: int, value: bytes) -> list[str]:
        """``handle`` as the loop runs it: the record's offset tracked, its holds kept."""
        from aiokafka import TopicPartition

        offsets = importlib.import_module("worker.engine.offsets")
        offset = self._offsets[partition]
        self._offsets[partition] += 1
        tracker = self._trackers.get(partition)
        if tracker is None:
            tracker = self._trackers[partition] = offsets.OffsetTracker()
        tracker.dispatched(offset)
        msg = self._record(STATUS, partition, offset, 0, 0, b"k", value, None, 1, len(value), [])
        tp = TopicPartition(STATUS, partition)
        token = offsets.HANDLING.set(offsets.Handling(self._holds, tp, tracker, offset))
        try:
            due: list[str] = await self.dispatcher.handle(msg)
        finally:
            offsets.HANDLING.reset(token)
        tracker.finished(offset)
        for key in due:
            self._lane(partition, key)
        return due

    def _lane(self, partition: int, key: str) -> None:
        if key not in self._lanes:
            task = asyncio.create_task(self.dispatcher.follow_up(partition, key))
            self._lanes[key] = task
            task.add_done_callback(lambda t: self._ended(key, t))

    def _ended(self, key: str, task: asyncio.Task[None]) -> None:
        self._lanes.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            self.failures.append(repr(task.exception()))

    def _sweep(self) -> None:
        """The loop's timer sweep: each due pair without a running lane gets one; and its
        commit tick's: the released holds at the front let go (``Commits.overdue_holds``)."""
        while self._holds and self._holds[0].released:
            self._holds.popleft()
        now = time.time()
        while (due := self.store.pop_due(now, retry_at=now + 0.005)) is not None:
            key, partition = due
            self._lane(partition, key)

    async def run(self, n: int, run: str, *, window: int = 200) -> int:
        """Take ``n`` events in, ``window`` at a time, and follow up until all are attempted."""
        posts = self.sender.posts if isinstance(self.sender, Answering) else 0
        start = self.producer.records
        events = list(_events(n, run))
        deadline = time.monotonic() + 60 + n / 50
        for at in range(0, n, window):
            for partition, value in events[at : at + window]:
                await self._handle(partition, value)
            await asyncio.sleep(0)
            self._sweep()
        while (self._lanes or len(self.store)) and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
            self._sweep()
        if self.failures:
            raise SystemExit(f"follow-ups raised: {self.failures[:3]}")
        if self._lanes or len(self.store):
            raise SystemExit(f"not all attempted: {len(self.store)} pairs left")
        if isinstance(self.sender, Answering) and self.sender.posts - posts != n:
            raise SystemExit(f"{self.sender.posts - posts} attempts for {n} events")
        self._holds.clear()
        return self.producer.records - start


async def _child(n: int, url: str | None, label: str) -> dict[str, Any]:
    from worker.runtime import logs

    logs.configure("INFO", "json", service="dispatcher-bench")
    gc.set_threshold(50_000, *gc.get_threshold()[1:])  # WORKER_GC_THRESHOLD's default
    harness = Harness(url)
    try:
        await harness.run(max(4, n // 4), f"w{label}")
        started = time.process_time()
        records = await harness.run(n, label)
        cpu = time.process_time() - started
    finally:
        if harness.session is not None:
            await harness.session.close()
    source = sys.modules[type(harness.dispatcher).__module__].__file__
    return {"us_per_delivery": cpu * 1e6 / n, "records_per_delivery": records / n, "source": source}


def _round(tree: Path, args: argparse.Namespace, label: str, url: str | None) -> dict[str, Any]:
    # -P: the tree's root, not bench/, is first on the path (a module here could shadow one).
    argv = [sys.executable, "-P", str(Path(__file__).resolve()), "--child"]
    argv += ["--events", str(args.events)]
    argv += ["--label", label] + (["--url", url] if url else [])
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        argv, cwd=tree, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not str(result["source"]).startswith(str(tree)):
        raise SystemExit(f"{tree}: the dispatcher came from {result['source']}")
    return result


@contextlib.contextmanager
def _receiver(http: bool) -> Iterator[str | None]:
    if not http:
        yield None
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.webhook_receiver", "--port", str(port)], cwd=root
    )
    try:
        for _ in range(200):
            with socket.socket() as s, contextlib.suppress(OSError):
                s.connect(("127.0.0.1", port))
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/hooks"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--against", type=Path, help="another tree (a git worktree) to alternate with")
    p.add_argument("--http", action="store_true", help="the real HTTP client over loopback")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--label", default="r", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import uvloop

        print(json.dumps(uvloop.run(_child(args.events, args.url, args.label))))
        return
    here = Path(__file__).resolve().parents[1]
    trees = [("this", here)] + ([("against", args.against.resolve())] if args.against else [])
    figures: dict[str, list[float]] = {name: [] for name, _ in trees}
    with _receiver(args.http) as url:
        for r in range(args.rounds):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                got = _round(tree, args, f"{name}{r}", url)
                figures[name].append(got["us_per_delivery"])
                print(
                    f"round {r + 1} {name} ({tree}): {got['us_per_delivery']:.1f} µs/delivery, "
                    f"{got['records_per_delivery']:.4f} records/delivery",
                    flush=True,
                )
    for name, values in figures.items():
        print(
            f"{name}: median {statistics.median(values):.1f} µs/delivery, best "
            f"{min(values):.1f}, over {len(values)}"
        )
    if args.against:
        this, against = figures["this"], figures["against"]
        ratio = statistics.median(this) / statistics.median(against)
        print(f"this / against: {ratio:.3f} (medians), {min(this) / min(against):.3f} (bests)")


if __name__ == "__main__":
    main()
