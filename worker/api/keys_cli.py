"""``python -m worker keys list|create|disable|enable|rotate|delete``: the key lifecycle. A new
raw key is printed alone on stdout, once (docs/operations.md, "API keys")."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from worker.api.keyfile import (
    KeyFileError,
    KeyInfo,
    create_key,
    delete_key,
    iso,
    list_keys,
    rotate_key,
    set_active,
)
from worker.settings import Settings

__all__ = ["COMMANDS", "LAST_USED_METRIC", "add_arguments", "parse_duration", "run"]

COMMANDS: Final = ("list", "create", "disable", "enable", "rotate", "delete")
LAST_USED_METRIC: Final = "passkey_api_key_last_used_timestamp_seconds"
#: A metrics page larger than this is not read (the URL is operator-given, the answer is not).
MAX_METRICS_BYTES: Final = 8 * 1024 * 1024
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``24h``, ``7d`` → seconds (argparse type)."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m, 24h, 7d")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def add_arguments(keys: argparse.ArgumentParser) -> None:
    """The ``keys`` subcommands, each with ``--file``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--file", type=Path, default=None, help="keys file (API_KEYS_FILE)")
    sub = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    listing = sub.add_parser("list", parents=[common], help="every key, its state, last use")
    listing.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    listing.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        metavar="URL",
        help="a front-end's /metrics to read last-used times from (repeat per replica)",
    )
    create = sub.add_parser("create", parents=[common], help="a new key (printed once)")
    create.add_argument("workspace")
    create.add_argument("--key-id", default=None, help="an id of your choosing (default random)")
    for name, text in (("disable", "refuse a key (401)"), ("enable", "accept it again")):
        sub.add_parser(name, parents=[common], help=text).add_argument("key_id")
    rotate = sub.add_parser(
        "rotate", parents=[common], help="a new key for the workspace; retire the old one"
    )
    rotate.add_argument("key_id")
    rotate.add_argument(
        "--grace",
        type=parse_duration,
        default=0.0,
        metavar="DURATION",
        help="keep the old key valid this long (e.g. 24h); default: disable it now",
    )
    delete = sub.add_parser("delete", parents=[common], help="remove a disabled key")
    delete.add_argument("key_id")
    delete.add_argument("--force", action="store_true", help="even if it is still valid")


def run(settings: Settings, args: argparse.Namespace) -> int:
    """Run one ``keys`` subcommand."""
    path: Path | None = args.file or settings.api_keys_file
    if path is None:
        print("no keys file: pass --file or set API_KEYS_FILE", file=sys.stderr)
        return 2
    command: str = args.keys_command
    try:
        if command == "list":
            return _list(path, args.metrics_url, as_json=args.json)
        if command == "create":
            key_id, raw_key = create_key(path, args.workspace, key_id=args.key_id)
            return _secret(raw_key, f"created {key_id} for workspace {args.workspace} in {path}")
        if command == "rotate":
            old, key_id, raw_key = rotate_key(path, args.key_id, grace_s=args.grace)
            retired = (
                f"{old.key_id} expires at {_when(old.expires_at)}"
                if old.state() == "expiring"
                else f"{old.key_id} is disabled"
            )
            return _secret(raw_key, f"created {key_id} for workspace {old.workspace_id}; {retired}")
        if command in ("disable", "enable"):
            info = set_active(path, args.key_id, command == "enable")
            print(
                f"{command}d {info.key_id} (workspace {info.workspace_id}): {info.state()}; "
                f"in force within API_KEYS_RELOAD_S ({settings.api_keys_reload_s:g} s)"
            )
            return 0
        info = delete_key(path, args.key_id, force=args.force)
        print(f"deleted {info.key_id} (workspace {info.workspace_id}, was {info.state()})")
        return 0
    except (KeyFileError, ValueError, OSError) as exc:
        print(f"keys {command}: {exc}", file=sys.stderr)
        return 1


def _secret(raw_key: str, what: str) -> int:
    print(raw_key, flush=True)
    print(f"{what}; the key is shown only once", file=sys.stderr)
    return 0


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else iso(moment)


def _list(path: Path, metrics_urls: Sequence[str], *, as_json: bool) -> int:
    keys = list_keys(path)
    last_used = asyncio.run(_scrape(metrics_urls)) if metrics_urls else {}
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = [_row(info, now, last_used.get(info.key_id)) for info in keys]
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return 0
    columns = ("key_id", "workspace_id", "state", "created_at", "expires_at", "last_used")
    table = [[c.upper() for c in columns]] + [[str(r[c] or "-") for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    if not metrics_urls:
        print("last_used: pass --metrics-url http://<front-end>/metrics", file=sys.stderr)
    return 0


def _row(info: KeyInfo, now: datetime, last_used: float | None) -> dict[str, Any]:
    return {
        "key_id": info.key_id,
        "workspace_id": info.workspace_id,
        "state": info.state(now),
        "created_at": info.created_at and _when(info.created_at),
        "expires_at": info.expires_at and _when(info.expires_at),
        "replaced_by": info.replaced_by,
        "last_used": None if last_used is None else _when(datetime.fromtimestamp(last_used, UTC)),
    }


async def _scrape(urls: Sequence[str], timeout_s: float = 5.0) -> dict[str, float]:
    """The latest ``passkey_api_key_last_used_timestamp_seconds`` per key id over the front-ends at
    ``urls``; a page that cannot be read is reported on stderr and skipped."""
    latest: dict[str, float] = {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        for url in urls:
            try:
                text = await _fetch(client, url)
                families = list(text_string_to_metric_families(text))
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                print(f"last_used: {url}: {exc or type(exc).__name__}", file=sys.stderr)
                continue
            for family in families:
                for sample in family.samples:
                    key_id = sample.labels.get("key_id")
                    if sample.name == LAST_USED_METRIC and key_id:
                        latest[key_id] = max(latest.get(key_id, 0.0), float(sample.value))
    return latest


async def _fetch(client: aiohttp.ClientSession, url: str) -> str:
    async with client.get(url, allow_redirects=False) as response:
        if not 200 <= response.status < 300:
            raise ValueError(f"HTTP {response.status}")
        body = bytearray()
        async for chunk in response.content.iter_any():
            body += chunk
            if len(body) > MAX_METRICS_BYTES:
                raise ValueError(f"more than {MAX_METRICS_BYTES} bytes")
    return body.decode("utf-8", errors="replace")
