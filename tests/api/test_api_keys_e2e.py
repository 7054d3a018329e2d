"""The API key lifecycle against a running front-end on the session broker: each ``python -m
worker keys`` edit is in force within ``API_KEYS_RELOAD_S`` (disabled, rotated and deleted
keys answer 401 invalid_api_key, re-enabled and new keys are accepted), the last-used time of
each key id is exported and shown by ``keys list``, and no key reaches a log line."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import structlog

from tests.api.conftest import ApiSettings
from tests.api.support import responder, running_api
from worker.cli import main
from worker.runtime import logs

pytestmark = pytest.mark.integration

AUTH = "/v1/accounts/{}/auth"
RELOAD_S = 0.2


def keys_cli(capsys: pytest.CaptureFixture[str], path: Path, *argv: str) -> str:
    """One ``python -m worker keys`` command on ``path``; its stdout."""
    code = main(["keys", *argv, "--file", str(path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


async def until_status(
    probe: Callable[[], Awaitable[httpx.Response]], wanted: int, *, timeout_s: float = 10.0
) -> httpx.Response:
    """Poll until the answer has status ``wanted`` (the front-end reloads every RELOAD_S)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = await probe()
        if answer.status_code == wanted:
            return answer
        assert time.monotonic() < deadline, f"still {answer.status_code}, wanted {wanted}"
        await asyncio.sleep(RELOAD_S / 4)


def invalid_key(answer: httpx.Response) -> bool:
    error = answer.json()["error"]
    return (answer.status_code, error["code"], error["numeric_code"]) == (
        401,
        "invalid_api_key",
        11001,
    )


async def test_key_lifecycle_through_a_running_front_end(
    api_settings: ApiSettings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "lifecycle-keys.json"
    settings = api_settings(api_keys_file=path, api_keys_reload_s=RELOAD_S)
    # The CLI would configure structlog for a process; here the test owns the log pipeline.
    monkeypatch.setattr(logs, "configure", lambda *_, **__: None)
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    with structlog.testing.capture_logs() as events:
        first = keys_cli(capsys, path, "create", "ws_a", "--key-id", "key_live").strip()
        shown.append(first)
        async with (
            responder(settings),  # a worker without accounts: every query answers 404
            running_api(settings) as api,
            httpx.AsyncClient(base_url=api.url) as http,
        ):

            def with_key(key: str) -> Callable[[], Awaitable[httpx.Response]]:
                return lambda: http.get(AUTH.format("acc_none"), headers={"X-Api-Key": key})

            accepted = await with_key(first)()
            assert accepted.status_code == 404  # the key passed; the account does not exist

            keys_cli(capsys, path, "disable", "key_live")
            assert invalid_key(await until_status(with_key(first), 401))

            keys_cli(capsys, path, "enable", "key_live")
            await until_status(with_key(first), 404)

            assert api.metrics_url is not None  # the side door (API_METRICS_PORT)
            metrics = (await http.get(f"{api.metrics_url}/metrics")).text
            assert 'passkey_api_key_last_used_timestamp_seconds{key_id="key_live"}' in (metrics)
            # in a thread: the front-end it scrapes answers on this event loop
            listed = await asyncio.to_thread(
                keys_cli,
                capsys,
                path,
                "list",
                "--json",
                "--metrics-url",
                f"{api.metrics_url}/metrics",
            )
            (row,) = [json.loads(line) for line in listed.splitlines()]
            assert row["key_id"] == "key_live" and row["state"] == "active"
            assert row["last_used"] is not None and row["last_used"].endswith("Z")

            second = keys_cli(capsys, path, "rotate", "key_live").strip()
            shown.append(second)
            assert invalid_key(await until_status(with_key(first), 401))
            assert (await with_key(second)()).status_code == 404

            new_id = next(
                json.loads(line)["key_id"]
                for line in keys_cli(capsys, path, "list", "--json").splitlines()
                if json.loads(line)["key_id"] != "key_live"
            )
            keys_cli(capsys, path, "delete", new_id, "--force")
            assert invalid_key(await until_status(with_key(second), 401))
            assert (await with_key(first)()).status_code == 401  # still disabled

            assert api.metrics_url is not None  # the side door (API_METRICS_PORT)
            metrics = (await http.get(f"{api.metrics_url}/metrics")).text
            assert f'key_id="{new_id}"' not in metrics  # a deleted key's series goes with it
            assert 'key_id="key_live"' in metrics

    assert any(e["event"] == "api_keys_reloaded" for e in events)
    logged = "\n".join(repr(e) for e in events) + caplog.text + capsys.readouterr().err
    for key in shown:
        assert key not in logged
