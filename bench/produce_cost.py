"""What an acknowledged produce costs the client's process, on aiokafka and on librdkafka
(figures: bench/README.md, "An acknowledged produce").

A command at low load is alone in each of its acknowledged produces (the write-ahead intent,
the settled state, the reply and the event); at full load many commands share a produce
request. So each *trial* produces keyed 300-byte records from ``--in-flight`` lanes, each
lane waiting for its record's acknowledgement before the next: 1 lane is the low-load case
(``--records`` records), 50 the full-load one (ten times as many, for a window as long).
Its CPU (``getrusage``: user and system apart, every thread of the process, so librdkafka's
own threads count) is divided by the records, after a warm-up outside the window.

``python -m bench.produce_cost`` starts an embedded broker and runs every combination of
``--clients``, ``--lingers`` and ``--in-flight``, each trial in a fresh process, ``--rounds``
times with the order of the clients alternating, and writes ``bench/produce-cost.json``.
``python -m bench.produce_cost trial ...`` is one trial (a JSON line on stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, base_env, floats, ints, machine, names
from bench.kafka_floor import CLIENTS, ConfluentProducer
from devstack.broker import EmbeddedBroker
from worker.engine.kafka import build_producer, create_topics
from worker.runtime import eventloop
from worker.settings import Settings

TOPIC = "produce-cost"
WARM_UP = 200


async def trial(
    settings: Settings, client: str, linger_ms: float, records: int, lanes: int
) -> dict[str, Any]:
    """One client, one linger, one lane count: µs of CPU per acknowledged record."""
    value = b"v" * 300
    if client == "aiokafka":
        producer = build_producer(settings.kafka_config(), linger_ms=linger_ms)
        await producer.start()

        async def send(key: bytes) -> None:
            await (await producer.send(TOPIC, value, key=key))

        async def close() -> None:
            await producer.stop()
    else:
        confluent = ConfluentProducer(settings, asyncio.get_running_loop(), linger_ms=linger_ms)

        async def send(key: bytes) -> None:
            await confluent.send(TOPIC, value, key)

        async def close() -> None:
            await asyncio.to_thread(confluent.close)

    async def run(n: int, offset: int) -> None:
        left = iter(range(offset, offset + n))

        async def lane() -> None:
            for number in left:
                await send(b"acc_%d" % number)

        await asyncio.gather(*(lane() for _ in range(lanes)))

    try:
        await run(WARM_UP, 0)
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await run(records, WARM_UP)
        after = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - started
    finally:
        await close()
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "client": client,
        "linger_ms": linger_ms,
        "in_flight": lanes,
        "records": records,
        "rate": records / wall,
        "user_us": user / records * 1e6,
        "system_us": system / records * 1e6,
        "total_us": (user + system) / records * 1e6,
    }


def spawn_trial(bootstrap: str, client: str, linger: float, records: int, lanes: int) -> Any:
    argv = ["trial", client, str(linger), str(records), str(lanes)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.produce_cost", *argv],
        cwd=REPO_ROOT,
        env=base_env() | {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "LOG_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    trials: list[dict[str, Any]] = []
    with EmbeddedBroker() as broker:
        settings = Settings(kafka_bootstrap_servers=broker.bootstrap)
        create = create_topics(
            settings.kafka_config(),
            {TOPIC: settings.commands_partitions},
            replication_factor=settings.kafka_replication_factor,
        )
        eventloop.run(create, "uvloop")
        for round_ in range(args.rounds):
            clients = args.clients if round_ % 2 == 0 else args.clients[::-1]
            for lanes in args.in_flight:
                for linger in args.lingers:
                    for client in clients:
                        n = args.records * (10 if lanes > 1 else 1)
                        result = spawn_trial(broker.bootstrap, client, linger, n, lanes)
                        trials.append(result | {"round": round_})
                        print(line(result), flush=True)
    return {
        "parameters": vars(args) | {"out": str(args.out)},
        "machine": machine(),
        "trials": trials,
    }


def line(t: dict[str, Any]) -> str:
    return (
        f"{t['client']:9} linger {t['linger_ms']:g} ms, {t['in_flight']:3} in flight: "
        f"{t['total_us']:6,.0f} µs/record (user {t['user_us']:,.0f}, system "
        f"{t['system_us']:,.0f}), {t['rate']:,.0f}/s"
    )


def summary(result: dict[str, Any]) -> list[str]:
    """Median µs per record of each (client, linger, in-flight) over the rounds."""
    groups: dict[tuple[str, float, int], list[float]] = {}
    for t in result["trials"]:
        groups.setdefault((t["client"], t["linger_ms"], t["in_flight"]), []).append(t["total_us"])
    return [
        f"{client:9} linger {linger:g} ms, {lanes:3} in flight: median "
        f"{statistics.median(v):,.0f} µs/record ({', '.join(f'{x:,.0f}' for x in v)})"
        for (client, linger, lanes), v in sorted(groups.items())
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["trial"]:
        client, linger, records, lanes = argv[1], float(argv[2]), int(argv[3]), int(argv[4])
        settings = Settings()
        result = eventloop.run(trial(settings, client, linger, records, lanes), "uvloop")
        print(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.produce_cost", description=__doc__)
    parser.add_argument("--clients", type=names(CLIENTS, "clients"), default=list(CLIENTS))
    parser.add_argument("--lingers", type=floats, default=[0.0, 2.0])
    parser.add_argument("--in-flight", type=ints, default=[1, 50])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "produce-cost.json")
    args = parser.parse_args(argv)
    result = measure(args)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(summary(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
