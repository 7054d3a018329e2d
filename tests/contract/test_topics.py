"""The product's topic plan (``worker.contract.topics``): which topics exist, how each is kept,
which are co-partitioned and which process uses which; the engine checks a cluster against it
(tests/engine/test_topics.py)."""

from __future__ import annotations

from worker.contract.topics import Topics, TopicSizing, co_partitioned, topic_plan, used_by
from worker.settings import Settings


def test_the_specs_follow_the_settings_and_the_architecture() -> None:
    settings = Settings(
        commands_partitions=6,
        other_partitions=4,
        kafka_replication_factor=3,
        kafka_min_insync_replicas=2,
        kafka_retention_ms=86_400_000,
        kafka_replies_retention_ms=60_000,
    )
    specs = {s.topic_field: s for s in settings.topic_plan().specs}
    assert set(specs) == set(Topics.model_fields)
    assert {f for f, s in specs.items() if s.compacted} == {
        "state",
        "webhook_endpoints",
        "webhook_state",
        "api_presence",
        "api_idempotency",
    }
    assert specs["commands"].partitions == specs["state"].partitions == 6
    # one partition: the one order of the front-ends' replay claims
    assert specs["api_presence"].partitions == 1
    # one partition: the one order of the front-ends' Idempotency-Key claims
    assert specs["api_idempotency"].partitions == 1
    others = ("commands", "state", "api_presence", "api_idempotency")
    assert {specs[f].partitions for f in specs if f not in others} == {4}
    assert specs["replies"].configs["retention.ms"] == "60000"
    assert specs["status"].configs["retention.ms"] == "86400000"
    assert "retention.ms" not in specs["state"].configs
    assert all(s.replication_factor == 3 for s in specs.values())
    assert all(s.configs["min.insync.replicas"] == "2" for s in specs.values())
    # every co-partitioned group is specified with one partition count
    for group in co_partitioned(settings.topics):
        assert len({s.partitions for s in specs.values() if s.name in group}) == 1


def test_each_process_checks_the_topics_it_uses() -> None:
    t = Topics()
    assert set(used_by(t, "worker")) == {
        t.commands, t.state, t.status, t.errors, t.replies, t.dlq
    }  # fmt: skip
    # The front-end reads no auth.state: GET /auth is a query to the worker.
    assert set(used_by(t, "api")) == {t.commands, t.replies, t.api_presence, t.api_idempotency}
    assert {t.webhook_endpoints, t.webhook_replays} <= set(used_by(t, "api", webhooks=True))
    assert {t.webhook_state, t.status, t.errors, t.webhook_replays, t.webhook_dlq} <= set(
        used_by(t, "dispatcher")
    )
    assert t.commands not in used_by(t, "dispatcher")


def test_the_plan_is_built_from_the_names_and_the_sizing_alone() -> None:
    names = Topics(commands="c", state="s")
    sizing = TopicSizing(
        commands_partitions=2,
        other_partitions=5,
        replication_factor=1,
        min_insync_replicas=1,
        retention_ms=-1,
        replies_retention_ms=1000,
    )
    plan = topic_plan(names, sizing)
    assert [s.name for s in plan.specs] == names.all()
    assert plan.co_partitioned[0] == ("c", "s")
    assert plan.only(["c"]).specs == (plan.specs[0],)
    assert plan.only(None) is plan
