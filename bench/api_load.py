"""Closed-loop HTTP load on the front-end's POST route, for the issue-4 measurement.

Usage, with ``make run`` up (or a stack on other ports)::

    .venv/bin/python bench/api_load.py --requests 2000 --concurrency 50 --port 8080

Sends ``--requests`` confirms (account ``acc_demo_{i}``, so start the stack with
``--demo-accounts`` at least that large) with at most ``--concurrency`` in flight, loopback only,
and prints requests/s, p50/p99 latency and the status/numeric_code mix. Bounded in count and by
``--timeout`` per request; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time

import httpx


async def run(requests: int, concurrency: int, port: int, key: str, timeout: float) -> None:
    latencies: list[float] = []
    codes: collections.Counter[tuple[int, int | None]] = collections.Counter()
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def one(i: int) -> None:
            async with gate:
                started = time.perf_counter()
                r = await client.post(
                    f"http://127.0.0.1:{port}/v1/accounts/acc_demo_{i + 1}/auth/passkey-confirm",
                    headers={"X-Api-Key": key},
                )
                latencies.append(time.perf_counter() - started)
                codes[(r.status_code, r.json().get("error", {}).get("numeric_code"))] += 1

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    print(
        f"requests={requests} concurrency={concurrency} {requests / elapsed:.0f} req/s "
        f"p50={p50:.0f} ms p99={p99:.0f} ms statuses={dict(codes)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--key", default="dev-key-ws-demo")
    parser.add_argument("--timeout", type=float, default=30.0)
    a = parser.parse_args()
    asyncio.run(run(a.requests, a.concurrency, a.port, a.key, a.timeout))


if __name__ == "__main__":
    main()
