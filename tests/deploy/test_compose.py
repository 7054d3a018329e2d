"""deploy/compose/compose.yaml: Apache Kafka (KRaft) and the stack, for a container engine.

No container engine runs here, so the file is never started by the suite (README says so);
these checks keep it parseable and in step with the code: every process command is one of
``python -m worker``'s, every variable is a setting, and the topics are a deploy step that
runs before any process, on a Kafka that creates no topic by itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.cli import build_parser
from worker.contract.topics import Topics
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose" / "compose.yaml"
PROCESSES = ("worker", "webhooks", "api")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if "build" in s}


def test_the_product_services_run_commands_of_python_m_worker(compose: dict[str, Any]) -> None:
    parser = build_parser()
    services = app_services(compose)
    assert set(PROCESSES) | {"topics"} <= set(services)
    for name in (*PROCESSES, "topics"):
        service = services[name]
        assert "entrypoint" not in service, name  # the image's: python -m worker
        parser.parse_args(service["command"])  # exits (fails the test) on an unknown one
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (COMPOSE.parent / service["build"]["context"] / "deploy" / "Dockerfile").exists()


def test_every_variable_is_a_setting(compose: dict[str, Any]) -> None:
    known = {f.upper() for f in Settings.model_fields} | {
        f"TOPIC_{f.upper()}" for f in Topics.model_fields
    }
    dev_only = {"PYTHONPATH", "SIMULATOR_HOST"}
    for name, service in app_services(compose).items():
        unknown = set(service.get("environment", {})) - known - dev_only
        assert unknown == set(), name


def test_topics_are_created_before_any_process_on_a_kafka_that_creates_none(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert kafka["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in PROCESSES:
        env = services[name]["environment"]
        assert env["KAFKA_AUTO_CREATE_TOPICS"] == "false", name
        after = services[name]["depends_on"]["topics"]["condition"]
        assert after == "service_completed_successfully", name
        settings = Settings(
            kafka_replication_factor=int(env["KAFKA_REPLICATION_FACTOR"]),
            kafka_min_insync_replicas=int(env["KAFKA_MIN_INSYNC_REPLICAS"]),
        )
        assert settings.kafka_replication_factor == 1  # one broker
