"""The front-end's own code per POST, in one process: Kafka answered at once, no sockets.

``python -m bench.frontend_inproc`` builds the real front-end app (``build_app``: the front
door, the confirm route, key check, body models, reply correlation, metrics) and calls it as
an ASGI server would, ``--concurrency`` requests at a time. The producer it is given answers
every command with the worker's 200 reply on the next loop turn, so what is measured is the
service's code between the socket and Kafka, free of the broker's and the other processes'
noise that ``bench.stack_cost`` carries. Reports CPU µs per POST over ``--rounds`` rounds
(best and median) after a warm-up round, less the time the stand-in producer spends building
replies; asserts nothing beyond every answer being a 200.
Run it from a tree's root to compare trees on one machine (``PYTHONPATH=.``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import uvloop
from prometheus_client import CollectorRegistry

from worker.api.app import build_app
from worker.api.keys import KeyStore, hash_key
from worker.api.replies import ReplyRouter
from worker.contract.messages import AuthData, Reply, ReplyBody
from worker.documents.openapi.document import document_routes
from worker.settings import Settings

KEY = "pk_bench-inproc-key"
SENT = "passkey_confirmation_sent"
BODY = json.dumps(
    {"provider": "simulator", "challenge_id": "ch_bench", "assertion": "a" * 64}
).encode()


class InstantReplies(ReplyRouter):
    """The reply router with nothing to read: ready at once, replies handed to it directly."""

    def __init__(self, topic: str) -> None:
        super().__init__(None, topic, partition=0)

    @property
    def ready(self) -> bool:
        return True

    @property
    def partition(self) -> int:
        return 0


class AnsweringProducer:
    """A producer whose every send is acknowledged at once and answered, on the next loop
    turn, with the reply the worker gives a pending challenge, encoded as the worker encodes
    it. ``own_s`` is the time spent here: the harness's work, not the front-end's."""

    def __init__(self, replies: ReplyRouter) -> None:
        self._replies = replies
        self._offset = 0
        self.own_s = 0.0

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[Any]:
        started = time.perf_counter()  # nothing here awaits: the span is this code's own CPU
        loop = asyncio.get_running_loop()
        cmd = json.loads(value)
        self._offset += 1
        reply = Reply(
            command_id=cmd["command_id"],
            request_id=cmd["request_id"],
            account_id=cmd["account_id"],
            http_status=200,
            body=ReplyBody(
                request_id=cmd["request_id"],
                data=AuthData(account_id=cmd["account_id"], status=SENT, auth_status=SENT),
            ),
            version=2,
        )
        record = SimpleNamespace(
            value=reply.model_dump_json(exclude_none=True).encode(),
            partition=0,
            offset=self._offset,
        )
        loop.call_soon(self._replies.handle, [record])
        acked: asyncio.Future[Any] = loop.create_future()
        acked.set_result(SimpleNamespace(topic=topic, partition=0, offset=self._offset))
        self.own_s += time.perf_counter() - started
        return acked


def _scope(account: str) -> dict[str, Any]:
    path = f"/v1/accounts/{account}/auth/passkey-confirm"
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"x-api-key", KEY.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }


async def _post(app: Any, account: str, statuses: Counter[int]) -> None:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.Event().wait()  # a client that stays: the app never reads past the body
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses[message["status"]] += 1

    await app(_scope(account), receive, send)


async def measure(requests: int, concurrency: int, rounds: int) -> dict[str, Any]:
    """CPU µs per POST of each round (a warm-up round first, not counted)."""
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys.json"
        entry = {"workspace_id": "ws_bench", "key_id": "k", "sha256": hash_key(KEY), "active": True}
        keys.write_text(json.dumps({"keys": [entry]}), encoding="utf-8")
        settings = Settings(api_rate_limit_per_s=0)
        replies = InstantReplies(settings.topics.replies)
        producer = AnsweringProducer(replies)
        app = build_app(
            settings,
            producer=producer,
            replies=replies,
            keys=KeyStore.from_file(keys),
            registry=CollectorRegistry(),
            documents=document_routes,
        ).api
        statuses: Counter[int] = Counter()

        async def lane(first: int) -> None:
            for i in range(first, requests, concurrency):
                await _post(app, f"acc_{i:08d}", statuses)

        per_post: list[float] = []
        harness: list[float] = []
        for n in range(rounds + 1):
            started, own_before = time.process_time(), producer.own_s
            await asyncio.gather(*(lane(s) for s in range(concurrency)))
            own = producer.own_s - own_before
            if n:  # round 0 warms the caches and the allocator
                per_post.append((time.process_time() - started - own) / requests * 1e6)
                harness.append(own / requests * 1e6)
    return {"us_per_post": per_post, "harness_us_per_post": harness, "statuses": dict(statuses)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="POSTs per round")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = uvloop.run(measure(args.requests, args.concurrency, args.rounds))
    if set(result["statuses"]) != {200}:
        raise SystemExit(f"not every answer was a 200: {result['statuses']}")
    costs = result["us_per_post"]
    print(
        f"front-end in process: {min(costs):.1f} µs/POST best, "
        f"{statistics.median(costs):.1f} median of {len(costs)} rounds "
        f"of {args.requests} at {args.concurrency} in flight "
        f"(the harness's own {statistics.median(result['harness_us_per_post']):.1f} µs/POST "
        "left out)"
    )


if __name__ == "__main__":
    main()
