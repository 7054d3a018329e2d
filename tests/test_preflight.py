"""Start-up refusals (worker/preflight.py): in production (the default ``ENVIRONMENT``) a
process whose Kafka or provider address is unset or loopback does not start, and says why;
a provider credential or certificate that cannot be loaded stops a worker in any environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog

from worker.cli import main
from worker.preflight import EXIT_REFUSED, is_loopback, problems
from worker.runtime import logs
from worker.settings import ProviderConnection, Settings

REAL = {
    "kafka_bootstrap_servers": "kafka-0.kafka.svc:9093,kafka-1.kafka.svc:9093",
    "provider_urls": {"primary": "https://passkey-provider.example.com"},
}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("api.localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", True),
        ("::", True),
        ("10.0.0.1", False),
        ("kafka.svc", False),
        ("localhost.example.com", False),
        ("2001:db8::1", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_production_defaults_are_refused_naming_each_setting() -> None:
    found = problems(Settings(), providers=True)
    assert Settings().environment == "production"
    assert len(found) == 2
    assert found[0].startswith("KAFKA_BOOTSTRAP_SERVERS is unset")
    assert found[1].startswith("PROVIDER_URLS['simulator'] points at the loopback host")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"kafka_bootstrap_servers": "kafka:9092,127.0.0.1:9092"},
            "names the loopback host '127.0.0.1'",
        ),
        ({"kafka_bootstrap_servers": "[::1]:9092"}, "names the loopback host '::1'"),
        ({"kafka_bootstrap_servers": "localhost"}, "names the loopback host 'localhost'"),
        ({"provider_urls": {"p": "http://localhost:8090/api"}}, "PROVIDER_URLS['p'] points at"),
        ({"provider_urls": {"p": "https://[::1]/"}}, "PROVIDER_URLS['p'] points at"),
        ({"provider_urls": {}}, "PROVIDER_URLS is empty"),
        ({"provider_urls": {"p": "https:///v1"}}, "PROVIDER_URLS['p'] has no host"),
    ],
)
def test_production_refuses_loopback_and_empty(overrides: dict[str, object], expected: str) -> None:
    settings = Settings(**(REAL | overrides))  # type: ignore[arg-type]
    (found,) = problems(settings, providers=True)
    assert expected in found


def test_real_addresses_start_and_development_allows_loopback() -> None:
    assert problems(Settings(**REAL), providers=True) == []  # type: ignore[arg-type]
    assert problems(Settings(environment="development"), providers=True) == []
    # the front-end and the dispatcher do not call providers: only Kafka is checked
    assert problems(Settings(kafka_bootstrap_servers="kafka:9092")) == []


def test_an_unloadable_credential_is_refused_in_every_environment(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    for environment in ("production", "development"):
        settings = Settings(
            **(REAL | {"environment": environment}),  # type: ignore[arg-type]
            providers={"primary": ProviderConnection(token_file=missing)},
        )
        (found,) = problems(settings, providers=True)
        assert "PROVIDER_PRIMARY_TOKEN_FILE" in found and str(missing) in found


@pytest.mark.parametrize("command", ["run", "api", "webhooks", "topics"])
def test_the_commands_refuse_to_start_with_a_clear_log_line(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m worker <command>`` with nothing configured: exit 2 before any connection,
    one ``startup_refused`` line naming every problem."""
    for name in ("ENVIRONMENT", "KAFKA_BOOTSTRAP_SERVERS", "PROVIDER_URLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(logs, "configure", lambda *_, **__: None)
    with structlog.testing.capture_logs() as events:
        argv = [command, "check"] if command == "topics" else [command]  # topics create|check
        assert main(argv) == EXIT_REFUSED
    (event,) = [e for e in events if e["event"] == "startup_refused"]
    assert event["command"] == command
    assert event["environment"] == "production"
    assert "KAFKA_BOOTSTRAP_SERVERS is unset" in event["problems"][0]
    assert any("PROVIDER_URLS" in p for p in event["problems"]) is (command == "run")
    json.dumps(event)  # a log line a JSON renderer can write
