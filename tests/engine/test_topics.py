"""Topics as a deploy step (``python -m worker topics create|check``) and the check every
process makes before it starts (docs/operations.md, "Topics").

Two layers. The decisions (``worker.engine.topics.check``: spec + observation → findings) are tested
on constructed observations, including answers the embedded broker never gives (a broker that
refuses DescribeConfigs, ``compact,delete``, a replication factor below the setting). The
I/O and the refusal to start run against the embedded broker, which answers DescribeConfigs
and keeps the configs a topic was created with: so a topic with the wrong cleanup policy is
really created wrong here, not faked.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Mapping

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from tests.conftest import SettingsFactory
from tests.harness import REPO, worker_env
from worker.api.app import api_runtime
from worker.api.keys import KeyStore
from worker.auth.app import run_worker
from worker.contract.topics import used_by
from worker.dispatcher.app import run_dispatcher
from worker.engine.kafka import client_options, ensure_topics, observe_topics, topics_report
from worker.engine.topics import (
    KAFKA_DEFAULTS,
    Finding,
    TopicObservation,
    TopicsMisconfigured,
    TopicSpec,
    check,
    problems,
    render_table,
)
from worker.runtime.process import EX_CONFIG
from worker.settings import Settings
from worker.startup import RootOptions
from worker.webhooks.secrets_box import generate_key

# -- the decisions, on constructed observations -------------------------------------------------


def spec(name: str = "auth.state", *, compacted: bool = True, partitions: int = 3) -> TopicSpec:
    configs = {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    if not compacted:
        configs = {"cleanup.policy": "delete", "retention.ms": "1000", "min.insync.replicas": "2"}
    return TopicSpec(name, name, partitions, 3, configs)


def seen(
    s: TopicSpec, *, partitions: int | None = None, rf: int = 3, **configs: str | None
) -> TopicObservation:
    """``s`` as a cluster would describe it when made right, with ``configs`` changed (a
    ``None`` value leaves the config out of the answer)."""
    values = {k.replace("_", "."): v for k, v in configs.items()}
    merged = {k: v for k, v in ({**s.configs, **values}).items() if v is not None}
    return TopicObservation(s.name, partitions or s.partitions, rf, merged)


def wrong(findings: list[Finding]) -> set[tuple[str, str]]:
    return {(f.topic, f.setting) for f in problems(findings)}


def test_a_topic_made_as_specified_has_no_problem() -> None:
    for s in (spec(), spec("auth.status", compacted=False)):
        findings = check([s], {s.name: seen(s)})
        assert findings and problems(findings) == []


def test_a_state_topic_that_deletes_by_time_is_a_problem() -> None:
    s = spec()
    for policy in ("delete", "compact,delete"):
        findings = check([s], {s.name: seen(s, cleanup_policy=policy)})
        assert wrong(findings) == {("auth.state", "cleanup.policy")}, policy
    (problem,) = problems(check([s], {s.name: seen(s, cleanup_policy="delete")}))
    assert str(problem) == "topic auth.state: cleanup.policy is delete, expected compact"


def test_a_stream_that_compacts_is_a_problem() -> None:
    s = spec("auth.status", compacted=False)
    assert wrong(check([s], {s.name: seen(s, cleanup_policy="compact")})) == {
        ("auth.status", "cleanup.policy")
    }


def test_a_config_left_out_of_the_answer_is_read_as_kafkas_default() -> None:
    """The embedded broker leaves out every config a topic was not created with; Kafka
    applies its default there, so a state topic created without configs is caught."""
    state, stream = spec(), spec("auth.status", compacted=False)
    observed = {
        state.name: seen(state, cleanup_policy=None, min_insync_replicas=None),
        stream.name: seen(stream, cleanup_policy=None, retention_ms=None),
    }
    findings = check([state, stream], observed)
    assert KAFKA_DEFAULTS["cleanup.policy"] == "delete"
    assert ("auth.state", "cleanup.policy") in wrong(findings)
    assert ("auth.status", "cleanup.policy") not in wrong(findings)
    # the default retention (7 days) is longer than this spec's 1 s: enough
    assert ("auth.status", "retention.ms") not in wrong(findings)
    # the default min.insync.replicas (1) is below the spec's 2
    assert ("auth.state", "min.insync.replicas") in wrong(findings)


def test_configs_the_broker_would_not_describe_are_a_problem_not_a_pass() -> None:
    s = spec()
    observation = TopicObservation(
        s.name, 3, 3, None, "DescribeConfigs: TopicAuthorizationFailedError"
    )
    (problem,) = problems(check([s], {s.name: observation}))
    assert problem.setting == "configs"
    assert "TopicAuthorizationFailedError" in str(problem)


@pytest.mark.parametrize(
    ("actual", "wanted", "ok"),
    [("1000", "1000", True), ("5000", "1000", True), ("999", "1000", False),
     ("-1", "1000", True), ("1000", "-1", False), ("-1", "-1", True), ("soon", "1000", False)],
)  # fmt: skip
def test_retention_is_at_least_the_setting(actual: str, wanted: str, ok: bool) -> None:
    s = spec("auth.status", compacted=False)
    s = TopicSpec(s.name, s.topic_field, 3, 3, {**s.configs, "retention.ms": wanted})
    findings = check([s], {s.name: seen(s, retention_ms=actual)})
    assert (("auth.status", "retention.ms") not in wrong(findings)) is ok


def test_replication_and_min_insync_replicas() -> None:
    s = spec()
    assert wrong(check([s], {s.name: seen(s, rf=5)})) == set()
    assert wrong(check([s], {s.name: seen(s, rf=2)})) == {("auth.state", "replication.factor")}
    assert wrong(check([s], {s.name: seen(s, min_insync_replicas="1")})) == {
        ("auth.state", "min.insync.replicas")
    }
    # above the replication factor every acks=all write would fail
    assert wrong(check([s], {s.name: seen(s, min_insync_replicas="4")})) == {
        ("auth.state", "min.insync.replicas")
    }


def test_missing_topics_and_partition_counts() -> None:
    commands, state = spec("auth.commands", compacted=False), spec()
    findings = check([commands, state], {commands.name: seen(commands)})
    assert wrong(findings) == {("auth.state", "exists")}
    findings = check(
        [commands, state],
        {commands.name: seen(commands), state.name: seen(state, partitions=6)},
        [("auth.commands", "auth.state")],
    )
    assert wrong(findings) == {("auth.state", "partitions"), ("auth.state", "co-partitioning")}
    copart = next(f for f in findings if f.setting == "co-partitioning")
    assert str(copart) == (
        "topic auth.state: co-partitioning is 6 partitions, expected 3 partitions, as auth.commands"
    )


def test_co_partitioning_compares_the_topics_that_exist() -> None:
    names = ("auth.status", "auth.errors", "webhook.replays")
    specs = [spec(n, compacted=False, partitions=4) for n in names]
    observed: dict[str, TopicObservation | None] = {s.name: seen(s) for s in specs}
    observed["auth.errors"] = None
    findings = check(specs, observed, [names])
    assert wrong(findings) == {("auth.errors", "exists")}
    assert [f.topic for f in findings if f.setting == "co-partitioning"] == ["webhook.replays"]


def test_the_message_names_every_problem_and_the_table_marks_them() -> None:
    s = spec()
    findings = check([s], {s.name: seen(s, partitions=5, cleanup_policy="delete")})
    error = TopicsMisconfigured(problems(findings), hint="see the docs")
    assert "topic auth.state: partitions is 5, expected 3" in str(error)
    assert "topic auth.state: cleanup.policy is delete, expected compact" in str(error)
    table = render_table(findings).splitlines()
    assert table[0].split() == ["topic", "setting", "expected", "actual", "result"]
    rows = {(line.split()[0], line.split()[1]): line.split()[-1] for line in table[1:]}
    assert rows[("auth.state", "cleanup.policy")] == "PROBLEM"
    assert rows[("auth.state", "partitions")] == "PROBLEM"
    assert rows[("auth.state", "replication.factor")] == "OK"


def test_settings_refuse_an_impossible_topic_configuration() -> None:
    with pytest.raises(ValidationError, match="KAFKA_MIN_INSYNC_REPLICAS"):
        Settings(kafka_replication_factor=1, kafka_min_insync_replicas=2)
    with pytest.raises(ValidationError, match="retention"):
        Settings(kafka_retention_ms=0)
    assert Settings(kafka_retention_ms=-1).kafka_retention_ms == -1
    # production defaults: nothing made on the fly, three replicas, two acknowledge
    production = Settings()
    assert production.kafka_auto_create_topics is False
    assert (production.kafka_replication_factor, production.kafka_min_insync_replicas) == (3, 2)


# -- against the embedded broker ---------------------------------------------------------------


async def create_raw(settings: Settings, topics: Mapping[str, tuple[int, dict[str, str]]]) -> None:
    """Create topics exactly as given (name → partitions, configs), as a careless operator
    or a forgotten auto-creation would."""
    admin = AIOKafkaAdminClient(**client_options(settings.kafka_config()))
    await admin.start()
    try:
        new = [
            NewTopic(name, n, settings.kafka_replication_factor, topic_configs=configs)
            for name, (n, configs) in topics.items()
        ]
        response = await admin.create_topics(new)
        assert all(code == 0 for _, code, *_ in response.topic_errors), response
    finally:
        await admin.close()


async def listed(settings: Settings) -> set[str]:
    admin = AIOKafkaAdminClient(**client_options(settings.kafka_config()))
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def run_briefly(settings: Settings) -> None:
    """``run_worker`` as the process runs it; it must refuse before it ever starts."""
    await asyncio.wait_for(
        run_worker(
            settings, RootOptions(stop=asyncio.Event(), install_signals=False, serve_probes=False)
        ),
        timeout=30,
    )


@pytest.mark.integration
async def test_the_embedded_broker_keeps_and_describes_the_configs_topics_are_made_with(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(partitions=2)
    kafka = settings.kafka_config()
    findings = await ensure_topics(kafka, settings.topic_plan())
    assert problems(findings) == []
    t = settings.topics
    admin = AIOKafkaAdminClient(**client_options(kafka))
    await admin.start()
    try:
        observed = await observe_topics(admin, [t.state, t.replies, t.commands])
    finally:
        await admin.close()
    state, replies = observed[t.state], observed[t.replies]
    assert state is not None and replies is not None
    assert state.configs is not None and state.configs["cleanup.policy"] == "compact"
    assert replies.configs is not None
    assert replies.configs["retention.ms"] == str(settings.kafka_replies_retention_ms)
    assert state.partitions == 2


@pytest.mark.integration
async def test_a_worker_refuses_a_state_topic_that_deletes_by_time(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(partitions=2)
    t = settings.topics
    await create_raw(settings, {t.state: (2, {"cleanup.policy": "delete"})})
    with pytest.raises(TopicsMisconfigured) as refused:
        await run_briefly(settings)
    assert f"topic {t.state}: cleanup.policy is delete, expected compact" in str(refused.value)
    assert {(p.topic, p.setting) for p in refused.value.problems} == {(t.state, "cleanup.policy")}


@pytest.mark.integration
async def test_a_worker_refuses_state_and_commands_not_co_partitioned(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(partitions=3)
    t = settings.topics
    await create_raw(settings, {t.state: (2, {"cleanup.policy": "compact"})})
    with pytest.raises(TopicsMisconfigured) as refused:
        await run_briefly(settings)
    message = str(refused.value)
    assert f"topic {t.state}: partitions is 2, expected 3" in message
    assert f"topic {t.state}: co-partitioning is 2 partitions, expected 3 partitions" in message


@pytest.mark.integration
async def test_without_auto_creation_a_missing_topic_refuses_the_start_and_nothing_is_made(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(kafka_auto_create_topics=False)
    with pytest.raises(TopicsMisconfigured, match=f"topic {settings.topics.commands}: exists"):
        await run_briefly(settings)
    assert not set(used_by(settings.topics, "worker")) & await listed(settings)


@pytest.mark.integration
async def test_the_dispatcher_refuses_delivery_states_not_co_partitioned_with_its_inputs(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(partitions=3, webhook_secrets_key=generate_key())
    t = settings.topics
    await create_raw(settings, {t.webhook_state: (4, {"cleanup.policy": "compact"})})
    with pytest.raises(TopicsMisconfigured) as refused:
        await asyncio.wait_for(
            run_dispatcher(
                settings,
                RootOptions(stop=asyncio.Event(), install_signals=False, serve_probes=False),
            ),
            timeout=30,
        )
    assert (t.webhook_state, "co-partitioning") in {
        (p.topic, p.setting) for p in refused.value.problems
    }


@pytest.mark.integration
async def test_the_front_end_refuses_an_endpoints_topic_that_deletes_by_time(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(webhook_secrets_key=generate_key())
    t = settings.topics
    await create_raw(settings, {t.webhook_endpoints: (3, {})})  # the broker's default: delete
    with pytest.raises(TopicsMisconfigured) as refused:
        async with api_runtime(settings, registry=CollectorRegistry(), keys=KeyStore()):
            pass
    assert {(p.topic, p.setting) for p in refused.value.problems} == {
        (t.webhook_endpoints, "cleanup.policy")
    }


@pytest.mark.integration
def test_python_m_worker_run_exits_with_ex_config_naming_the_problem(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(partitions=2)
    t = settings.topics
    asyncio.run(create_raw(settings, {t.state: (2, {"cleanup.policy": "delete"})}))
    done = subprocess.run(
        [sys.executable, "-m", "worker", "run"],
        env=worker_env(settings, 0, LOG_FORMAT="json"),
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )
    output = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == EX_CONFIG, output
    (line,) = [x for x in output.splitlines() if "refusing_to_start" in x]
    assert f"topic {t.state}: cleanup.policy is delete, expected compact" in line
    assert "Traceback" not in output


def topics_cli(action: str, settings: Settings) -> tuple[int, str]:
    """``python -m worker topics <action>`` with the environment of ``settings``; its exit
    status and its table (stdout)."""
    env = worker_env(settings, 0, KAFKA_AUTO_CREATE_TOPICS="false")  # the command decides
    done = subprocess.run(
        [sys.executable, "-m", "worker", "topics", action],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout.decode()


def rows(table: str) -> dict[tuple[str, str], str]:
    lines = table.strip().splitlines()[1:]
    return {(line.split()[0], line.split()[1]): line.split()[-1] for line in lines}


@pytest.mark.integration
def test_topics_check_reports_what_a_process_refuses(make_settings: SettingsFactory) -> None:
    settings = make_settings(partitions=2)
    t = settings.topics
    asyncio.run(
        create_raw(
            settings,
            {t.state: (2, {"cleanup.policy": "delete"}), t.commands: (3, {})},
        )
    )
    code, out = topics_cli("check", settings)
    assert code == 1
    table = rows(out)
    assert table[(t.state, "cleanup.policy")] == "PROBLEM"
    assert table[(t.commands, "partitions")] == "PROBLEM"
    assert table[(t.state, "co-partitioning")] == "PROBLEM"
    assert table[(t.replies, "exists")] == "PROBLEM"
    assert table[(t.state, "partitions")] == "OK"
    # `create` makes the missing topics but never alters an existing one
    code, out = topics_cli("create", settings)
    assert code == 1
    table = rows(out)
    assert (t.replies, "exists") not in table
    assert table[(t.replies, "cleanup.policy")] == "OK"
    assert table[(t.state, "cleanup.policy")] == "PROBLEM"


@pytest.mark.integration
def test_topics_create_then_check_passes(make_settings: SettingsFactory) -> None:
    settings = make_settings(partitions=2)
    code, out = topics_cli("check", settings)
    assert code == 1
    assert set(rows(out).values()) == {"PROBLEM"}  # every topic missing
    code, out = topics_cli("create", settings)
    assert code == 0, out
    code, out = topics_cli("check", settings)
    assert code == 0, out
    table = rows(out)
    assert set(table.values()) == {"OK"}
    expected = {s.name for s in settings.topic_plan().specs}
    assert {topic for topic, _ in table} == expected
    assert table[(settings.topics.state, "cleanup.policy")] == "OK"
    findings = asyncio.run(
        topics_report(settings.kafka_config(), settings.topic_plan(), create=False)
    )
    assert problems(findings) == []
