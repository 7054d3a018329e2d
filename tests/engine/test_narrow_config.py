"""The engine and the runtime take narrow config objects, never the settings object
(docs/architecture.md, "The consume engine"): no annotation, parameter or import of a module
of ``worker/engine/`` or ``worker/runtime/`` names ``Settings`` or ``worker.settings``, lazy
and ``TYPE_CHECKING`` imports included. The narrow objects' defaults are the settings'."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from worker.engine.consume_loop import LoopConfig
from worker.engine.kafka import KafkaConfig
from worker.runtime.logs import LogConfig
from worker.settings import DEFAULT_BOOTSTRAP, Settings

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("worker/engine", "worker/runtime")


def _mentions_settings(node: ast.AST | None) -> bool:
    """``node`` (an annotation or an expression) names ``Settings`` or ``worker.settings``."""
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return "Settings" in node.value or "worker.settings" in node.value
    return any(
        (isinstance(n, ast.Name) and n.id.endswith("Settings"))
        or (isinstance(n, ast.Attribute) and (n.attr.endswith("Settings") or n.attr == "settings"))
        for n in ast.walk(node)
    )


def mentions(tree: ast.AST) -> list[str]:
    """Every import, parameter or annotation of ``tree`` that names the settings, as
    ``line: what``."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if (node.module or "") == "worker.settings" or (
                node.module == "worker" and "settings" in names
            ):
                found.append(f"{node.lineno}: from {node.module} import {', '.join(names)}")
            elif any(n.endswith("Settings") for n in names):
                found.append(f"{node.lineno}: imports {names}")
        elif isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if a.name == "worker.settings" or a.name.startswith("worker.settings.")
            ]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            for arg in (a for a in every if a is not None):
                if arg.arg == "settings" or _mentions_settings(arg.annotation):
                    found.append(f"{arg.lineno}: parameter {arg.arg} of {node.name}")
            if _mentions_settings(node.returns):
                found.append(f"{node.lineno}: return annotation of {node.name}")
        elif isinstance(node, ast.AnnAssign) and _mentions_settings(node.annotation):
            found.append(f"{node.lineno}: annotation {ast.unparse(node.annotation)}")
    return found


def crossings(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root).as_posix()}:{where}"
        for layer in LAYERS
        for path in sorted((root / layer).rglob("*.py"))
        for where in mentions(ast.parse(path.read_text(), str(path)))
    ]


def test_no_engine_or_runtime_module_takes_or_imports_the_settings() -> None:
    assert crossings(REPO) == []


@pytest.mark.parametrize(
    "source",
    [
        "from worker.settings import Settings\n",
        "import worker.settings\n",
        "from worker import settings\n",
        "def build(settings): ...\n",
        "def build(config: 'Settings') -> None: ...\n",
        "async def build(*, config: DevSettings) -> None: ...\n",
        "def limit() -> Settings: ...\n",
        "config: Settings\n",
        "def f():\n    from worker.settings import Topics\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from worker.settings import X\n",
    ],
)
def test_each_way_of_reaching_the_settings_is_found(tmp_path: Path, source: str) -> None:
    (tmp_path / "worker" / "engine").mkdir(parents=True)
    (tmp_path / "worker" / "runtime").mkdir(parents=True)
    (tmp_path / "worker" / "engine" / "loop.py").write_text(source)
    assert len(crossings(tmp_path)) == 1


def test_the_check_finds_what_the_engine_took_before_it_was_narrowed() -> None:
    """The engine's signatures as they were, one of each kind, are all found."""
    before = (
        "from worker.settings import Settings\n"
        "def client_options(settings: Settings) -> dict: ...\n"
        "class LoopSpec:\n"
        "    def config(self, settings: Settings) -> LoopConfig: ...\n"
        "if TYPE_CHECKING:\n"
        "    from worker.settings import Settings\n"
        "def run_until_signal(coro, settings: Settings) -> int: ...\n"
    )
    assert len(mentions(ast.parse(before))) == 5


def test_the_narrow_configs_default_to_the_settings_defaults() -> None:
    """Built directly (tests, tools), a narrow config behaves as the defaults of ``Settings``."""
    defaults = Settings.model_construct()
    assert defaults.kafka_config() == KafkaConfig(bootstrap=DEFAULT_BOOTSTRAP)
    topics = defaults.topics
    assert defaults.loop_config("worker") == LoopConfig((topics.commands,), topics.state)
    assert defaults.log_config() == LogConfig()


def test_the_settings_reach_the_narrow_configs() -> None:
    settings = Settings(
        kafka_bootstrap_servers="kafka:9093",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_username="u",
        kafka_sasl_password="hunter2-secret",
        kafka_fetch_max_wait_ms=20,
        kafka_session_timeout_ms=6000,
        kafka_heartbeat_interval_ms=300,
        worker_commit_interval_ms=50,
        worker_shutdown_grace_s=5.0,
        record_max_attempts=2,
        log_level="WARNING",
    )
    kafka = settings.kafka_config()
    assert (kafka.bootstrap, kafka.security_protocol, kafka.sasl_username) == (
        "kafka:9093",
        "SASL_SSL",
        "u",
    )
    assert (kafka.fetch_max_wait_ms, kafka.session_timeout_ms, kafka.heartbeat_interval_ms) == (
        20,
        6000,
        300,
    )
    assert "hunter2" not in repr(kafka), "the password stays out of any log line"
    for process in ("worker", "dispatcher"):
        loop = settings.loop_config(process)
        assert (loop.commit_interval_s, loop.shutdown_grace_s, loop.record_attempts) == (
            0.05,
            5.0,
            2,
        )
    assert settings.log_config().level == "WARNING"


def test_the_dispatchers_loop_reads_its_own_topics_and_bounds() -> None:
    """Its inputs share partition numbers; a take-in hold of 0 keeps the loop's default age."""
    settings = Settings(
        webhook_max_in_flight=40, webhook_timer_interval_s=0.01, webhook_take_in_hold_s=3.0
    )
    loop, topics = settings.loop_config("dispatcher"), settings.topics
    assert loop.topics == (topics.status, topics.errors, topics.webhook_replays)
    assert (loop.state_topic, loop.max_in_flight, loop.timer_interval_s, loop.hold_overdue_s) == (
        topics.webhook_state,
        40,
        0.01,
        3.0,
    )
    assert Settings(webhook_take_in_hold_s=0).loop_config("dispatcher").hold_overdue_s == 2.0
