"""Issue 47's check through what ``make run`` runs: how soon a long-poll answers a change.

    python -m bench.long_poll_latency [--wait-s 25] [--idle-wait-s 3] [--rounds 3]

Starts ``python -m devstack stack`` on spare loopback ports (``bench.stack.start_stack``) with
its own keys file, registers one account per round, and for each: a long-poll
(``after_version`` = the registered version) started before the confirm, the confirm, then the
answer (``passkey_confirmation_sent``), a long-poll with that version (``authorized``), and a
long-poll with nothing to wait for (``wait_s`` = ``--idle-wait-s``). Each change's answer is
timed from its status event's ``occurred_at`` (``GET .../events``, the webhook's event); the
idle one from when it was sent. Prints one JSON line per round and a summary; exits non-zero
when an answer is not the one expected, a change is answered more than ``--limit-ms`` after
its event, or the idle long-poll answers before ``wait_s`` or changed. Loopback only; every
wait is bounded."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.long_poll_cost import make_keys, register
from bench.stack import start_stack, stop_process

#: The issue's bound on a change's answer, after its status event.
LIMIT_MS = 250.0
#: How long the first long-poll is given to reach its worker before the confirm is sent.
PARK_S = 1.0


@dataclass(frozen=True)
class Answer:
    """A long-poll's answer: its state, and when it was sent and answered (wall clock)."""

    status: str
    version: int
    sent: float
    answered: float


async def long_poll(http: httpx.AsyncClient, account: str, after: int, wait_s: float) -> Answer:
    sent = time.time()
    resp = await http.get(
        f"/v1/accounts/{account}/auth", params={"after_version": after, "wait_s": wait_s}
    )
    answered = time.time()
    resp.raise_for_status()
    data = resp.json()["data"]
    return Answer(data["status"], int(data["version"]), sent, answered)


async def plain_get(http: httpx.AsyncClient, account: str, timeout_s: float) -> Answer:
    """The account's state once its worker knows it (after a registration)."""
    deadline = time.monotonic() + timeout_s
    while (resp := await http.get(f"/v1/accounts/{account}/auth")).status_code != 200:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{account}: {resp.status_code} after {timeout_s}s")
        await asyncio.sleep(0.2)
    data = resp.json()["data"]
    return Answer(data["status"], int(data["version"]), time.time(), time.time())


async def occurred(http: httpx.AsyncClient, account: str, timeout_s: float) -> dict[int, float]:
    """Each status event's ``occurred_at`` (epoch seconds) by version, once version 3's is
    listed (the events are read from the topic the worker wrote them to)."""
    deadline = time.monotonic() + timeout_s
    while True:
        resp = await http.get(f"/v1/accounts/{account}/events")
        if resp.status_code == 200:
            found = {
                int(e["version"]): datetime.fromisoformat(e["occurred_at"]).timestamp()
                for e in resp.json()["data"]
                if e["event_type"] == "account.auth_status_changed"
            }
            if 3 in found:
                return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{account}: no version 3 event after {timeout_s}s")
        await asyncio.sleep(0.2)


async def one_round(
    http: httpx.AsyncClient, account: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One account's flow, long-polled; what was answered, how late, and what failed."""
    start = await plain_get(http, account, args.timeout_s)
    first = asyncio.ensure_future(long_poll(http, account, start.version, args.wait_s))
    await asyncio.sleep(PARK_S)
    confirm = await http.post(f"/v1/accounts/{account}/auth/passkey-confirm")
    sent = await first
    outcome = await long_poll(http, account, sent.version, args.wait_s)
    idle = await long_poll(http, account, outcome.version, args.idle_wait_s)
    events = await occurred(http, account, args.timeout_s)
    late = {
        a.status: round((a.answered - events[a.version]) * 1000, 1) if a.version in events else None
        for a in (sent, outcome)
    }
    idle_s = idle.answered - idle.sent
    failed = [f"confirm answered {confirm.status_code}"] if confirm.status_code != 200 else []
    if (sent.status, outcome.status) != ("passkey_confirmation_sent", "authorized"):
        failed.append(f"answered {sent.status!r} then {outcome.status!r}")
    failed += [
        f"{s} {ms} ms after its event" for s, ms in late.items() if not ms or ms > args.limit_ms
    ]
    if idle.version != outcome.version or idle_s < args.idle_wait_s:
        failed.append(f"idle long-poll: version {idle.version} after {idle_s:.3f}s")
    return {
        "account": account,
        "versions": [start.version, sent.version, outcome.version, idle.version],
        "ms_after_event": late,
        "idle_wait_s": round(idle_s, 3),
        "failed": failed,
    }


async def drive(base: str, key: str, accounts: list[str], args: argparse.Namespace) -> list[Any]:
    timeout = httpx.Timeout(max(args.wait_s, args.idle_wait_s) + 20.0)
    async with httpx.AsyncClient(
        base_url=base, headers={"X-Api-Key": key}, timeout=timeout
    ) as http:
        return [await one_round(http, account, args) for account in accounts]


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per status, the largest delay after its event; the idle waits; every failure."""
    out: dict[str, Any] = {"rounds": len(rounds)}
    for status in ("passkey_confirmation_sent", "authorized"):
        seen = [r["ms_after_event"].get(status) for r in rounds]
        got = [ms for ms in seen if ms is not None]
        out[f"{status}_max_ms"] = round(max(got), 1) if got else None
    out["idle_wait_s"] = [r["idle_wait_s"] for r in rounds]
    out["failed"] = [f for r in rounds for f in r["failed"]]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wait-s", type=float, default=25.0, help="the changes' long-polls")
    parser.add_argument("--idle-wait-s", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3, help="accounts, one flow each")
    parser.add_argument("--limit-ms", type=float, default=LIMIT_MS)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="long-poll-latency-"))
    keys, pairs = make_keys(workdir, 1, args.rounds)
    stack = start_stack(1, workdir, keys, args.timeout_s)
    try:
        asyncio.run(register(f"127.0.0.1:{stack.ports['broker']}", pairs, 1))
        base = f"http://127.0.0.1:{stack.ports['api']}"
        rounds = asyncio.run(
            asyncio.wait_for(
                drive(base, pairs[0][0], [a for _, a in pairs], args),
                args.timeout_s * (1 + args.rounds),
            )
        )
    finally:
        stop_process(stack.proc)
    for done in rounds:
        print(json.dumps(done), flush=True)
    result = summary(rounds)
    print(json.dumps(result), flush=True)
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
