"""Closed-loop HTTP load on the front-end's POST route, for the issue-4 measurement.

Usage, with ``make run`` up (or a stack on other ports)::

    .venv/bin/python bench/api_load.py --requests 2000 --concurrency 50 --port 8080

Sends ``--requests`` confirms (accounts ``acc_demo_{first}`` onward, so start the stack
with ``--demo-accounts`` at least ``first + requests``) with at most ``--concurrency`` in
flight, loopback only, and prints requests/s, p50/p99 latency and the status/numeric_code
mix. Bounded in count and by ``--timeout`` per request; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time

import httpx


async def run(
    requests: int, concurrency: int, port: int, key: str, timeout: float, first: int
) -> None:
    """``concurrency`` connections, each its own one-connection client working through a
    shared sequence of accounts (a closed loop per connection, as wrk does).

    Not one client with a pool of ``concurrency`` connections: httpcore's pool does work
    proportional to connections x queued requests on every request event, and at 50
    connections the generator itself became the bottleneck (a GET served at 2,800 req/s with
    p99 21 ms, as wrk measured it, showed 280 req/s and p99 1.1 s through one pooled client).
    """
    latencies: list[float] = []
    codes: collections.Counter[tuple[int, int | None]] = collections.Counter()
    numbers = iter(range(first, first + requests))
    clients = [
        httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=1))
        for _ in range(concurrency)
    ]

    async def connection(client: httpx.AsyncClient) -> None:
        for n in numbers:
            started = time.perf_counter()
            r = await client.post(
                f"http://127.0.0.1:{port}/v1/accounts/acc_demo_{n}/auth/passkey-confirm",
                headers={"X-Api-Key": key},
            )
            latencies.append(time.perf_counter() - started)
            codes[(r.status_code, r.json().get("error", {}).get("numeric_code"))] += 1

    try:
        started = time.perf_counter()
        await asyncio.gather(*(connection(c) for c in clients))
        elapsed = time.perf_counter() - started
    finally:
        for client in clients:
            await client.aclose()
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
    parser.add_argument(
        "--first", type=int, default=1, help="first demo account number (acc_demo_FIRST ...)"
    )
    a = parser.parse_args()
    asyncio.run(run(a.requests, a.concurrency, a.port, a.key, a.timeout, a.first))


if __name__ == "__main__":
    main()
