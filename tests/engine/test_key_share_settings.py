"""The bounds added without a setting get one (docs/configuration.md): one key's share of the
in-flight bound (``WORKER_MAX_IN_FLIGHT_PER_KEY``, ``WEBHOOK_MAX_IN_FLIGHT_PER_KEY``) and one
endpoint's pending pairs (``WEBHOOK_MAX_PAIRS_PER_ENDPOINT``), each validated and passed by its
composition root; and a key's pause of its partition is counted
(``{prefix}key_pauses_total``), once per pause."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from tests.engine.test_hot_key import _Consumer, _Gates, _loop, _record, _settle
from worker.dispatcher.app import queue_limits
from worker.settings import Settings

PACKAGE = Path(__file__).resolve().parents[2] / "worker"


def test_the_key_shares_are_unset_by_default_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = Settings()
    assert default.worker_max_in_flight_per_key is None
    assert default.webhook_max_in_flight_per_key is None
    assert default.loop_config("worker").key_share == 50
    assert default.loop_config("dispatcher").key_share == 50

    monkeypatch.setenv("WORKER_MAX_IN_FLIGHT_PER_KEY", "7")
    monkeypatch.setenv("WEBHOOK_MAX_IN_FLIGHT_PER_KEY", "9")
    set_ = Settings()
    assert set_.loop_config("worker").key_share == 7
    assert set_.loop_config("dispatcher").key_share == 9


@pytest.mark.parametrize(
    "values",
    [
        {"worker_max_in_flight_per_key": 0},
        {"webhook_max_in_flight_per_key": 0},
        {"worker_max_in_flight": 10, "worker_max_in_flight_per_key": 11},
        {"webhook_max_in_flight": 10, "webhook_max_in_flight_per_key": 11},
        {"webhook_max_pairs_per_endpoint": 0},
    ],
)
def test_nonsense_is_refused(values: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        Settings(**values)  # type: ignore[arg-type]


def test_the_pairs_per_endpoint_reach_the_dispatchers_queue_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert queue_limits(Settings()).max_pairs_per_endpoint == 1000
    monkeypatch.setenv("WEBHOOK_MAX_PAIRS_PER_ENDPOINT", "12")
    assert queue_limits(Settings()).max_pairs_per_endpoint == 12


@pytest.mark.parametrize(
    ("root", "process"), [("auth/app.py", "worker"), ("dispatcher/app.py", "dispatcher")]
)
def test_each_composition_root_runs_its_loop_as_the_settings_describe_it(
    root: str, process: str
) -> None:
    """Its key share included (the test above): the loop's config is only built there."""
    tree = ast.parse((PACKAGE / root).read_text())
    built = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "settings.loop_config"
    ]
    assert built == [f"settings.loop_config('{process}')"]


async def test_each_pause_for_a_key_is_counted_once() -> None:
    consumer = _Consumer()
    handler = _Gates()
    loop = _loop(handler, consumer, max_in_flight=20, max_in_flight_per_key=2)
    registry: CollectorRegistry = loop.metrics.registry

    def pauses() -> float | None:
        return registry.get_sample_value("passkey_auth_key_pauses_total")

    assert pauses() == 0
    tp0 = TopicPartition("t", 0)
    for i in range(3):
        loop._dispatch(tp0, _record(0, i, b"hot"))
    loop.pressure.apply()
    loop.pressure.apply()
    assert loop.pressure.key_paused == {0}
    assert pauses() == 1, "one pause, however often the loop looks"

    handler.let("hot")
    await _settle(lambda: (0, "hot") not in loop.lanes)
    loop.pressure.apply()
    assert loop.pressure.key_paused == set()
    for i in range(3, 6):
        loop._dispatch(tp0, _record(0, i, b"hot"))
    loop.pressure.apply()
    assert pauses() == 2
    handler.let_all()
    await _settle(lambda: loop.pressure.in_flight == 0)
