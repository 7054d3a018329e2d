"""The long-polls due at one grid boundary leave the front-end in one produce request
(docs/architecture.md, "Long-polls"): the front-end's producer lingers 0 ms, so whatever one
loop iteration appended is sent together; with a linger, batches appended after the first one's
linger was up waited for its acknowledgement and left in a second request, which the worker read
in a fetch of its own. Counted through the producer's send calls on the test broker."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from tests.api.conftest import ApiSettings
from tests.api.support import KEY_A, responder, running_api, wait_until
from worker.api.long_poll import SEND_GRID_S

ASKS = 24
HELD_S = 0.0002


async def test_the_long_polls_due_at_one_boundary_leave_in_one_produce_request(
    api_settings: ApiSettings,
) -> None:
    settings = api_settings(partitions=ASKS, api_reply_timeout_s=5.0)
    async with (
        responder(settings, query=lambda _: None) as stand_in,  # never answers a query
        running_api(settings) as api,
    ):
        sender = api.producer._sender
        sent: list[int] = []  # queries per produce request to auth.commands
        produce = sender._send_produce_req

        async def counted(node_id: int, batches: dict[Any, Any]) -> None:
            commands = settings.topics.commands
            queries = sum(b.record_count for tp, b in batches.items() if tp.topic == commands)
            if queries:
                sent.append(queries)
            await produce(node_id, batches)

        sender._send_produce_req = counted
        send = api.producer.send

        async def held(*args: Any, **kwargs: Any) -> Any:
            # A loaded machine (where the split was counted): the loop held a moment after each
            # append, so one boundary's appends spread over more than the producer's linger.
            appended = await send(*args, **kwargs)
            until = time.perf_counter() + HELD_S
            while time.perf_counter() < until:
                pass
            return appended

        api.producer.send = held
        host, port = api.url.removeprefix("http://").split(":")
        conns = [await asyncio.open_connection(host, int(port)) for _ in range(ASKS)]
        loop = asyncio.get_running_loop()
        now = loop.time()
        await asyncio.sleep(math.ceil(now / SEND_GRID_S) * SEND_GRID_S - now + 0.005)
        for i, (_, writer) in enumerate(conns):  # accounts spread over the partitions
            writer.write(
                f"GET /v1/accounts/acc_burst_{i}/auth?wait_s=30 HTTP/1.1\r\nHost: x\r\n"
                f"X-Api-Key: {KEY_A}\r\n\r\n".encode()
            )
        await wait_until(lambda: len(stand_in.queries) == ASKS, timeout=10, what="every query")
        for _, writer in conns:
            writer.close()
        assert sent == [ASKS]
