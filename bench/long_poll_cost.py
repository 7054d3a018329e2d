"""What waiting costs the worker: callers polling ``GET .../auth`` once a second against the
same number long-polling (``after_version``, ``wait_s``) an account that does not change, side
by side in one run against a running stack (``make run``), the worker's CPU read from /proc.

    python -m bench.long_poll_cost --worker-pid PID --keys KEY [KEY ...] --accounts ACC [ACC ...]

Each key is one workspace's, each account one of that workspace's (registered and quiet); the
callers are spread evenly over the pairs (a workspace's long-polls are held open within its
share, docs/architecture.md, "Long-polls"). Phases alternate (poll, long-poll, poll, …) so a
drift of the machine does not favour either; an idle phase gives the worker's own cost, which
the comparison subtracts. Loopback only; every loop ends with its phase."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass

import httpx

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass
class Phase:
    mode: str
    seconds: float
    worker_cpu_s: float
    answers: int

    @property
    def cores(self) -> float:
        return self.worker_cpu_s / self.seconds


async def _idle(until: float) -> None:
    await asyncio.sleep(max(0.0, until - time.monotonic()))


async def _caller(
    http: httpx.AsyncClient, key: str, account: str, mode: str, until: float, count: list[int]
) -> None:
    url = f"/v1/accounts/{account}/auth"
    headers = {"X-Api-Key": key}
    version: int | None = None
    while time.monotonic() < until:
        started = time.monotonic()
        params: dict[str, str] = {}
        if mode == "long-poll" and version is not None:
            params = {"after_version": str(version), "wait_s": str(max(0.0, until - started))}
        answer = await http.get(url, headers=headers, params=params)
        count[0] += 1
        if answer.status_code == 200:
            version = answer.json()["data"]["version"]
        if mode == "poll" or answer.status_code != 200:
            await asyncio.sleep(max(0.0, started + 1.0 - time.monotonic()))


async def phase(args: argparse.Namespace, mode: str) -> Phase:
    pairs = list(zip(args.keys, args.accounts, strict=True))
    limits = httpx.Limits(max_connections=args.callers, max_keepalive_connections=args.callers)
    async with httpx.AsyncClient(base_url=args.api, timeout=60, limits=limits) as http:
        count = [0]
        until = time.monotonic() + args.seconds
        before = cpu_s(args.worker_pid)
        started = time.monotonic()
        if mode == "idle":  # the worker's own cost with nobody asking: subtracted below
            await _idle(until)
        else:
            await asyncio.gather(
                *(
                    _caller(http, *pairs[i % len(pairs)], mode, until, count)
                    for i in range(args.callers)
                )
            )
        return Phase(mode, time.monotonic() - started, cpu_s(args.worker_pid) - before, count[0])


async def run(args: argparse.Namespace) -> list[Phase]:
    phases = []
    for round_ in range(args.rounds):
        modes = ("idle", "poll", "long-poll") if round_ % 2 == 0 else ("long-poll", "poll", "idle")
        for mode in modes:
            done = await phase(args, mode)
            print(
                f"{done.mode:>9}: {done.answers} answers in {done.seconds:.1f} s, worker"
                f" {done.worker_cpu_s:.2f} CPU s ({done.cores:.3f} cores)",
                flush=True,
            )
            phases.append(done)
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", default="http://127.0.0.1:8080")
    parser.add_argument("--worker-pid", type=int, required=True)
    parser.add_argument("--keys", nargs="+", required=True)
    parser.add_argument("--accounts", nargs="+", required=True)
    parser.add_argument("--callers", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    phases = asyncio.run(run(args))
    cores = {
        m: sum(p.worker_cpu_s for p in phases if p.mode == m)
        / sum(p.seconds for p in phases if p.mode == m)
        for m in ("idle", "poll", "long-poll")
    }
    poll, wait = cores["poll"] - cores["idle"], cores["long-poll"] - cores["idle"]
    ratio = wait / poll if poll > 0 else float("nan")
    answers = {m: sum(p.answers for p in phases if p.mode == m) for m in ("poll", "long-poll")}
    print(json.dumps({"worker_cores": cores, "answers": answers, "over_idle_ratio": ratio}))


if __name__ == "__main__":
    main()
