"""The event loop selection of ``python -m worker`` processes (``EVENT_LOOP``)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from pydantic import ValidationError

from worker.runtime import eventloop
from worker.settings import Settings


async def _which() -> tuple[type[asyncio.AbstractEventLoop], str]:
    return type(asyncio.get_running_loop()), eventloop.running_loop_name()


def test_uvloop_runs_on_a_uvloop_loop() -> None:
    loop_type, name = eventloop.run(_which(), "uvloop")
    assert issubclass(loop_type, uvloop.Loop)
    assert name == "uvloop"


def test_asyncio_runs_on_the_standard_loop() -> None:
    loop_type, name = eventloop.run(_which(), "asyncio")
    assert not issubclass(loop_type, uvloop.Loop)
    assert name == "asyncio"


def test_run_returns_the_result_and_raises_the_exception() -> None:
    async def fails() -> None:
        raise LookupError("boom")

    assert eventloop.run(asyncio.sleep(0, result=42), "uvloop") == 42
    with pytest.raises(LookupError, match="boom"):
        eventloop.run(fails(), "uvloop")


def test_the_default_is_uvloop_and_other_names_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EVENT_LOOP", raising=False)
    assert Settings().event_loop == "uvloop"
    monkeypatch.setenv("EVENT_LOOP", "asyncio")
    assert Settings().event_loop == "asyncio"
    monkeypatch.setenv("EVENT_LOOP", "trio")
    with pytest.raises(ValidationError, match="event_loop"):
        Settings()
