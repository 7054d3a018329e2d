"""Outbound HTTP clients side by side, in one run: the client CPU of one call, and the calls
per second, of each contender calling a loopback receiver (bench/README.md, "HTTP clients";
issue 33, deliverable 3: lower the floor where a library sets it).

Contenders, each the same JSON POST (~300 bytes, the dispatcher's signed-delivery headers) and
the same ~100-byte JSON answer, each answer checked (status 200, body parsed):
- ``aiohttp-sender``: the dispatcher's client as the product built it on aiohttp until
  ``worker.runtime.http1`` replaced it (bench/http_aiohttp.py; its pool limits from
  ``Settings``) -- the reference (called ``aiohttp-today`` in runs before the change);
- ``aiohttp-provider``: the worker's provider client as it was on aiohttp; it sends no body
  (a provider call has none), so it is shown, not compared like for like;
- ``aiohttp-tuned``: aiohttp with only what keeps the wire, the vetting and the bounds
  (``tuned_session``);
- ``pycurl``: libcurl's multi interface on the loop (bench/http_curl.py), when importable;
- ``http1-sender``: the dispatcher's client as the product builds it now (``open_session``
  and ``Sender`` of worker/dispatcher/sender.py on ``worker.runtime.http1``);
- ``http1-provider``: the worker's provider client as built now (``build_http_client``), the
  same call as ``aiohttp-provider``.

The receiver runs in its own process (bench/http_receiver.py; uvloop and httptools, so its
CPU is not counted and it is not the bottleneck) with three listeners: plain, TLS and mTLS (a
client certificate required), on certificates made at start with ``cryptography``. Each
trial: a warm-up, then ``--calls`` calls (``--calls-50`` with 50 in flight) from that many
lanes; CPU is ``time.process_time`` of this process over the window, so every thread counts.
Rounds alternate the contenders' order so noise hits all of them; each trial stops at
``--trial-max-s`` whatever it has done.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import fmt, ints, names
from bench.http_aiohttp import (
    AiohttpVettingResolver,
    provider_request,
    provider_session,
    sender_post,
    sender_session,
)
from bench.http_curl import CurlClient, load_pycurl
from bench.http_receiver import ANSWER, Material, make_material, receiver
from worker import __version__
from worker.auth.provider import build_http_client
from worker.dispatcher.sender import DEFAULT_BODY_CAP, Sender, open_session
from worker.runtime import eventloop
from worker.settings import Settings
from worker.webhooks.signing import headers as signed_headers
from worker.webhooks.targets import TargetPolicy, validate_url

CONTENDERS = (
    "aiohttp-sender",
    "aiohttp-provider",
    "aiohttp-tuned",
    "pycurl",
    "http1-sender",
    "http1-provider",
)
REFERENCE = "aiohttp-sender"
PROVIDER_HEADERS = {"Idempotency-Key": "cmd_000000000001", "Accept": "application/json"}
"""What a provider contender asks with (a confirm's headers; no body)."""
MODES = ("plain", "tls", "mtls")
USER_AGENT = "passkey-auth-worker-webhooks"  # open_session's, sent by every contender
LOCAL = TargetPolicy(allow_http=True, allow_private=True)  # loopback receivers only

SETTLE_S = 0.1
"""After each trial's close, outside the window: its connections' TLS shutdowns complete."""

Post = Callable[[str, bytes, Mapping[str, str]], Awaitable[tuple[int | None, bytes]]]


# -- the contenders ---------------------------------------------------------------------


@dataclass
class Contender:
    post: Post
    close: Callable[[], Awaitable[None]]


async def _capped(answer: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The body, or None past ``cap`` bytes (then the connection is dropped)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await answer.content.read(cap + 1 - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            answer.close()
            return None


def tuned_session(settings: Settings, context: ssl.SSLContext | None) -> aiohttp.ClientSession:
    """aiohttp with what the dispatcher's session keeps (vetting resolver, pool limits, no
    proxy, no cookies, no decompression, the same headers on the wire), less per-call work:
    one session-wide time-out instead of a ``ClientTimeout`` and an ``asyncio.timeout`` per
    call, and the default headers computed by us once rather than by aiohttp per call."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            resolver=AiohttpVettingResolver(LOCAL),
            limit=settings.webhook_max_connections,
            limit_per_host=settings.webhook_max_connections_per_host,
            ssl=context if context is not None else True,
        ),
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=settings.webhook_timeout_s),
        headers=DEFAULT_HEADERS,
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
    )


DEFAULT_HEADERS = {"User-Agent": USER_AGENT, "Accept": "*/*", "Accept-Encoding": "gzip, deflate"}
"""What aiohttp-sender puts on the wire besides the caller's headers (Host and Content-Length
aside): the session's User-Agent and aiohttp's own Accept and Accept-Encoding."""


async def build(
    name: str, mode: str, material: Material, settings: Settings, pycurl: Any
) -> Contender:
    context = None if mode == "plain" else material.client_context(mode == "mtls")
    cap = DEFAULT_BODY_CAP
    if name == "aiohttp-sender":
        session = sender_session(
            LOCAL,
            max_connections=settings.webhook_max_connections,
            max_connections_per_host=settings.webhook_max_connections_per_host,
            ssl_context=context,
        )

        async def aiohttp_sender(
            url: str, body: bytes, headers: Mapping[str, str]
        ) -> tuple[int | None, bytes]:
            return await sender_post(
                session, LOCAL, url, body, headers, timeout_s=settings.webhook_timeout_s, cap=cap
            )

        return Contender(aiohttp_sender, session.close)
    if name == "aiohttp-provider":
        old = provider_session(
            timeout_s=settings.provider_timeout_s,
            max_connections=settings.provider_max_connections,
            user_agent=f"passkey-auth-worker/{__version__}",
            tls=context,
        )
        provider_cap = settings.provider_body_cap_bytes

        async def aiohttp_provider(
            url: str, body: bytes, headers: Mapping[str, str]
        ) -> tuple[int | None, bytes]:
            answer = await provider_request(old, "POST", url, PROVIDER_HEADERS, provider_cap)
            return answer.status, answer.body

        return Contender(aiohttp_provider, old.close)
    if name == "aiohttp-tuned":
        tuned = tuned_session(settings, context)

        async def tuned_post(
            url: str, body: bytes, headers: Mapping[str, str]
        ) -> tuple[int | None, bytes]:
            target = validate_url(url, LOCAL)  # vetted per call, as the dispatcher's is
            async with tuned.post(
                target, data=body, headers=headers, allow_redirects=False
            ) as answer:
                return answer.status, await _capped(answer, cap) or b""

        return Contender(tuned_post, tuned.close)
    if name == "pycurl":
        curl = CurlClient(
            pycurl,
            cafile=material.ca if context else None,
            cert=material.client if mode == "mtls" else None,
            max_per_host=settings.webhook_max_connections_per_host,
            timeout_s=settings.webhook_timeout_s,
            body_cap=cap,
        )

        async def curl_post(
            url: str, body: bytes, headers: Mapping[str, str]
        ) -> tuple[int | None, bytes]:
            return await curl.post(url, body, {**DEFAULT_HEADERS, **headers})

        return Contender(curl_post, curl.aclose)
    if name == "http1-sender":
        client = open_session(
            LOCAL,
            max_connections=settings.webhook_max_connections,
            max_connections_per_host=settings.webhook_max_connections_per_host,
            ssl_context=context,
        )
        sender = Sender(client, timeout_s=settings.webhook_timeout_s)

        async def http1_sender(
            url: str, body: bytes, headers: Mapping[str, str]
        ) -> tuple[int | None, bytes]:
            result = await sender.post(url, body, headers)
            return result.status, result.body

        return Contender(http1_sender, client.aclose)
    provider = build_http_client(settings, tls=context)

    async def http1_provider(
        url: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int | None, bytes]:
        answer = await provider.request("POST", url, headers=PROVIDER_HEADERS)
        return answer.status, answer.body

    return Contender(http1_provider, provider.aclose)


# -- trials -----------------------------------------------------------------------------


def request_body() -> tuple[bytes, dict[str, str]]:
    """A ~300-byte JSON delivery and its signed headers (signed once: not the client's cost)."""
    event = {
        "type": "auth.status_changed",
        "timestamp": "2026-11-27T12:00:00.000000Z",
        "data": {
            "workspace_id": "ws_0000000000000001",
            "account_id": "acc_000000000001",
            "status": "verified",
            "auth_status": "passkey_confirmed",
            "event_id": "evt_00000000-0000-0000-0000-000000000001",
            "occurred_at": "2026-11-27T12:00:00.000000Z",
        },
    }
    body = json.dumps(event).encode().ljust(300)
    secret = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
    return body, signed_headers([secret], "msg_0000000000000001", 1_790_000_000, body)


@dataclass
class Tally:
    calls: int = 0
    valid: int = 0
    error: str = ""


async def drive(
    post: Post,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    n: int,
    lanes: int,
    deadline: float,
) -> Tally:
    """``n`` calls from ``lanes`` lanes (fewer if ``deadline`` passes), each answer checked."""
    tally = Tally()
    left = [n]

    async def lane() -> None:
        while left[0] > 0 and time.monotonic() < deadline:
            left[0] -= 1
            tally.calls += 1
            try:
                status, content = await post(url, body, headers)
                if status == 200 and json.loads(content) == ANSWER:
                    tally.valid += 1
                elif not tally.error:
                    tally.error = f"status {status}, body {content[:60]!r}"
            except Exception as exc:
                tally.error = tally.error or f"{type(exc).__name__}: {exc}"[:200]

    await asyncio.gather(*(lane() for _ in range(lanes)))
    return tally


async def trial(
    contender: Contender, url: str, calls: int, lanes: int, max_s: float
) -> dict[str, Any]:
    body, headers = request_body()
    deadline = time.monotonic() + max_s
    await drive(contender.post, url, body, headers, max(50, 2 * lanes), lanes, deadline)
    cpu, wall = time.process_time(), time.perf_counter()
    tally = await drive(contender.post, url, body, headers, calls, lanes, deadline)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "calls": tally.calls,
        "valid": tally.valid,
        "error": tally.error,
        "cpu_us": cpu / max(tally.calls, 1) * 1e6,
        "rate": tally.calls / wall if wall > 0 else 0.0,
    }


async def measure(
    args: argparse.Namespace, material: Material, ports: dict[str, int]
) -> list[dict[str, Any]]:
    settings = Settings()
    pycurl = load_pycurl(args.pycurl_path)
    contenders = [c for c in args.contenders if c != "pycurl" or pycurl is not None]
    if pycurl is None and "pycurl" in args.contenders:
        print("pycurl: not importable here (--pycurl-path DIR): skipped", file=sys.stderr)
    results: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        shift = round_ % len(contenders)
        order = contenders[shift:] + contenders[:shift]
        for mode in args.modes:
            scheme = "http" if mode == "plain" else "https"
            url = f"{scheme}://127.0.0.1:{ports[mode]}/hook{'/chunked' if args.chunked else ''}"
            for lanes in args.in_flight:
                calls = args.calls if lanes == 1 else args.calls_50
                for name in order:
                    contender = await build(name, mode, material, settings, pycurl)
                    try:
                        row = await trial(contender, url, calls, lanes, args.trial_max_s)
                    finally:
                        await contender.close()
                        await asyncio.sleep(SETTLE_S)  # closing transports finish (TLS too)
                    row |= {"contender": name, "mode": mode, "in_flight": lanes, "round": round_}
                    results.append(row)
                    if args.verbose:
                        print(json.dumps(row), file=sys.stderr, flush=True)
    return results


def table(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per contender, in-flight and mode: medians over the rounds, ratio to the
    reference's."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for row in results:
        groups.setdefault((row["contender"], row["in_flight"], row["mode"]), []).append(row)
    rows = []
    for (name, lanes, mode), trials in groups.items():
        rows.append(
            {
                "contender": name,
                "in_flight": lanes,
                "mode": mode,
                "cpu_us": statistics.median(t["cpu_us"] for t in trials),
                "rate": statistics.median(t["rate"] for t in trials),
                "calls": sum(t["calls"] for t in trials),
                "valid": sum(t["valid"] for t in trials),
                "error": next((t["error"] for t in trials if t["error"]), ""),
            }
        )
    reference = {
        (r["in_flight"], r["mode"]): r["cpu_us"] for r in rows if r["contender"] == REFERENCE
    }
    for row in rows:
        base = reference.get((row["in_flight"], row["mode"]))
        row["ratio"] = row["cpu_us"] / base if base else float("nan")
    order = {name: i for i, name in enumerate(CONTENDERS)}
    rows.sort(key=lambda r: (r["in_flight"], MODES.index(r["mode"]), order[r["contender"]]))
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| contender | in flight | TLS | µs client CPU per call | calls/s | ÷ aiohttp-sender "
        "| valid |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['contender']} | {r['in_flight']} | {r['mode']} | {fmt(r['cpu_us'])} | "
            f"{fmt(r['rate'])} | {fmt(r['ratio'], '.2f')} | {r['valid']}/{r['calls']} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Certificates, the receiver, every trial; the table's rows."""
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        material = make_material(Path(tmp))
        with receiver(material, args.trial_max_s * 200) as ports:
            results = eventloop.run(measure(args, material, ports), "uvloop")
    return table(results)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.http_clients", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=2000, help="calls per trial with 1 in flight")
    p.add_argument("--calls-50", type=int, default=8000, help="calls per trial with more in flight")
    p.add_argument("--in-flight", type=ints, default=[1, 50])
    p.add_argument("--modes", type=names(MODES, "mode"), default=list(MODES))
    p.add_argument("--contenders", type=names(CONTENDERS, "contender"), default=list(CONTENDERS))
    p.add_argument("--chunked", action="store_true", help="the receiver answers chunked")
    p.add_argument("--trial-max-s", type=float, default=20.0)
    p.add_argument("--pycurl-path", default=os.environ.get("BENCH_PYCURL_PATH"))
    p.add_argument("--json", type=Path, help="write every trial and the table here")
    p.add_argument("--verbose", action="store_true", help="each trial on stderr as it ends")
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse(argv)
    before = os.getloadavg()
    rows = run(args)
    after = os.getloadavg()
    print(render(rows))
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    print(
        f"\n{stamp}, load average {before[0]:.2f} before, {after[0]:.2f} after; "
        f"{os.cpu_count()} CPUs"
    )
    if args.json:
        args.json.write_text(json.dumps({"argv": argv, "at": stamp, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
