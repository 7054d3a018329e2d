"""One log stream: the libraries' records (Python ``logging``: aiokafka, uvicorn) are rendered
by the same structlog pipeline as the service's own, with logger and service on every line."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from worker.runtime import logs


@pytest.fixture
def configured() -> Iterator[None]:
    """``logs.configure`` changes process-wide state: put the root logger and structlog back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        structlog.reset_defaults()


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_a_library_record_is_a_json_line_like_ours(
    configured: None, capfd: pytest.CaptureFixture[str]
) -> None:
    logs.configure("INFO", "json", service="passkey-test")
    logs.get_logger("worker.somewhere").info("our_event", partition=3)
    logging.getLogger("aiokafka.consumer").warning("Heartbeat failed for group %s", "g1")
    logging.getLogger("uvicorn.error").error("bad", extra={"token": "s3cr3t"})
    logging.getLogger("aiokafka").info("below the library level, not shown")
    ours, theirs, uvicorn = (json.loads(line) for line in _lines(capfd.readouterr().err))
    assert ours["logger"] == "worker.somewhere" and ours["event"] == "our_event"
    assert theirs["logger"] == "aiokafka.consumer"
    assert theirs["event"] == "Heartbeat failed for group g1"
    assert theirs["level"] == "warning"
    assert {ours["service"], theirs["service"]} == {"passkey-test"}
    assert "timestamp" in theirs
    assert uvicorn["token"] == "[redacted]"


def test_console_lines_have_one_shape(configured: None, capfd: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO", "console", service="passkey-test")
    logs.get_logger("worker.x").warning("ours")
    logging.getLogger("aiokafka").warning("theirs")
    lines = _lines(capfd.readouterr().err)
    assert len(lines) == 2
    for line in lines:
        assert "[warning  ]" in line, line
        assert not line.startswith("WARNING:"), line  # logging's default format


def test_the_access_log_is_off_unless_asked_for(
    configured: None, capfd: pytest.CaptureFixture[str]
) -> None:
    logs.configure("INFO", "json", service="passkey-api")
    logging.getLogger("uvicorn.access").info('127.0.0.1:1 - "GET / HTTP/1.1" 200')
    assert _lines(capfd.readouterr().err) == []
    logs.configure("INFO", "json", service="passkey-api", access_log=True)
    logging.getLogger("uvicorn.access").info('127.0.0.1:1 - "GET / HTTP/1.1" 200')
    [line] = _lines(capfd.readouterr().err)
    assert json.loads(line)["logger"] == "uvicorn.access"


def test_a_bound_context_is_on_every_line_inside_and_gone_after(
    configured: None, capfd: pytest.CaptureFixture[str]
) -> None:
    logs.configure("INFO", "json", service="passkey-test")
    log = logs.get_logger("worker.x")
    with logs.log_context(account_id="acc_1", partition=2):
        log.info("outer")
        with logs.log_context(endpoint_id="ep_1", partition=5):
            log.info("inner", account_id="acc_own")
        log.info("outer_again")
    log.info("after")
    outer, inner, again, after = (json.loads(line) for line in _lines(capfd.readouterr().err))
    assert (outer["account_id"], outer["partition"]) == ("acc_1", 2)
    assert (inner["endpoint_id"], inner["partition"]) == ("ep_1", 5)
    assert inner["account_id"] == "acc_own", "a line's own field wins"
    assert "endpoint_id" not in again and again["partition"] == 2
    assert "account_id" not in after and "partition" not in after


async def test_a_bound_context_reaches_tasks_started_inside_and_survives_a_raise() -> None:
    async def seen() -> dict[str, object]:
        return logs.log_fields()

    async def handler() -> None:
        with logs.log_context(account_id="acc_1"):
            assert await asyncio.create_task(seen()) == {"account_id": "acc_1"}
            raise RuntimeError("the handler failed")

    with pytest.raises(RuntimeError):
        await handler()
    assert logs.log_fields() == {}
