"""The intended configuration of every topic and the pure check of a cluster against it,
run by ``python -m worker topics`` and by every process before it starts: a state topic on
``delete`` loses accounts, topics that are not co-partitioned mix accounts up
(docs/operations.md, "Topics")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from worker.runtime.process import Misconfigured
from worker.settings import Settings, Topics

#: ``Topics`` fields of the topics compacted to the latest record per key: the changelogs of
#: the state stores, the endpoint registry and the front-ends' presence (docs/architecture.md,
#: "Topics and messages").
COMPACTED: Final = frozenset({"state", "webhook_endpoints", "webhook_state", "api_presence"})
#: ``Topics`` fields of the topics with one partition: the front-ends' presence records, whose
#: one order decides which replica's claim of a workspace's last replay slot came first.
SINGLE_PARTITION: Final = frozenset({"api_presence"})
#: ``Topics`` fields of the streams whose records matter for minutes only (a reply is awaited
#: for ``API_REPLY_TIMEOUT_S``): ``KAFKA_REPLIES_RETENTION_MS``.
SHORT_LIVED: Final = frozenset({"replies"})

#: What Kafka applies to a topic that does not set these (its documented topic defaults). A
#: broker that leaves a config out of its DescribeConfigs answer (the embedded one omits every
#: config a topic was not created with) is read as applying the default.
KAFKA_DEFAULTS: Final[Mapping[str, str]] = {
    "cleanup.policy": "delete",
    "retention.ms": str(7 * 86_400_000),
    "min.insync.replicas": "1",
}

#: Which topics each process uses (``Topics`` fields); the front-end's webhook topics only when
#: its webhook routes are configured (``WEBHOOK_SECRETS_KEY``).
PROCESS_TOPICS: Final[Mapping[str, tuple[str, ...]]] = {
    "worker": ("commands", "state", "status", "errors", "replies", "dlq"),
    "api": ("commands", "replies", "api_presence"),
    "api-webhooks": (
        "webhook_endpoints",
        "webhook_deliveries",
        "webhook_replays",
        "status",
        "errors",
    ),
    "dispatcher": (
        "status",
        "errors",
        "webhook_replays",
        "webhook_state",
        "webhook_endpoints",
        "webhook_deliveries",
        "webhook_dlq",
    ),
}

Process = Literal["worker", "api", "dispatcher"]


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic as it should be. ``configs`` are what ``topics create`` sets."""

    name: str
    topic_field: str  # of ``Topics``
    partitions: int
    replication_factor: int
    configs: Mapping[str, str]

    @property
    def compacted(self) -> bool:
        return self.configs.get("cleanup.policy") == "compact"


@dataclass(frozen=True, slots=True)
class TopicObservation:
    """What the cluster said of one existing topic. ``configs`` is ``None`` when the broker
    did not answer DescribeConfigs for it (``configs_error`` says why)."""

    name: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str] | None = field(default_factory=dict)
    configs_error: str | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """One row of the check: a topic's setting, what it should be, what it is."""

    topic: str
    setting: str
    expected: str
    actual: str
    ok: bool

    def __str__(self) -> str:
        return f"topic {self.topic}: {self.setting} is {self.actual}, expected {self.expected}"


class TopicsMisconfigured(Misconfigured):
    """The cluster's topics are not what the settings say; refuses a process's start."""

    def __init__(self, problems: Sequence[Finding], *, hint: str) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems) + f" ({hint})")


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic's intended configuration, in ``Topics.all()`` order. Commands and state share
    ``COMMANDS_PARTITIONS`` (co-partitioned); ``api.presence`` has one; the others have
    ``OTHER_PARTITIONS``."""
    names = settings.topics.model_dump()
    specs = []
    for name_field in Topics.model_fields:
        common = {"min.insync.replicas": str(settings.kafka_min_insync_replicas)}
        if name_field in COMPACTED:
            configs = {"cleanup.policy": "compact"} | common
        else:
            retention = (
                settings.kafka_replies_retention_ms
                if name_field in SHORT_LIVED
                else settings.kafka_retention_ms
            )
            configs = {"cleanup.policy": "delete", "retention.ms": str(retention)} | common
        partitions = (
            settings.commands_partitions
            if name_field in ("commands", "state")
            else 1
            if name_field in SINGLE_PARTITION
            else settings.other_partitions
        )
        specs.append(
            TopicSpec(
                name=names[name_field],
                topic_field=name_field,
                partitions=partitions,
                replication_factor=settings.kafka_replication_factor,
                configs=configs,
            )
        )
    return specs


def co_partitioned(settings: Settings) -> list[tuple[str, ...]]:
    """Topics whose partition numbers must line up: the worker's commands and its state; the
    dispatcher's inputs (events, replays) and its delivery states."""
    t = settings.topics
    return [
        (t.commands, t.state),
        (t.status, t.errors, t.webhook_replays, t.webhook_state),
    ]


def used_by(settings: Settings, process: Process) -> list[str]:
    """The names of the topics ``process`` reads or writes."""
    fields = list(PROCESS_TOPICS[process])
    if process == "api" and settings.webhook_secrets_key is not None:
        fields += PROCESS_TOPICS["api-webhooks"]
    names = settings.topics.model_dump()
    return list(dict.fromkeys(names[f] for f in fields))


def check(
    specs: Iterable[TopicSpec],
    observed: Mapping[str, TopicObservation | None],
    groups: Iterable[Sequence[str]] = (),
) -> list[Finding]:
    """The findings of comparing ``specs`` with ``observed`` (name → observation, ``None`` or
    absent for a missing topic), then the co-partitioning of each of ``groups`` among its
    topics that exist and are specified (each against the group's first). Exact: partitions,
    cleanup.policy. At least: replication factor, min.insync.replicas (and never above the
    replication factor, or every ``acks=all`` write fails), retention.ms (-1 is forever)."""
    findings: list[Finding] = []
    checked: dict[str, int] = {}
    for spec in specs:
        seen = observed.get(spec.name)
        if seen is None:
            findings.append(Finding(spec.name, "exists", "yes", "missing", False))
            continue
        checked[spec.name] = seen.partitions
        findings += _compare(spec, seen)
    for group in groups:
        members = [name for name in group if name in checked]
        for name in members[1:]:
            ref = members[0]
            findings.append(
                Finding(
                    name,
                    "co-partitioning",
                    f"{checked[ref]} partitions, as {ref}",
                    f"{checked[name]} partitions",
                    checked[name] == checked[ref],
                )
            )
    return findings


def _compare(spec: TopicSpec, seen: TopicObservation) -> list[Finding]:
    name = spec.name
    rf_min = spec.replication_factor
    rows = [
        Finding(
            name, "partitions", str(spec.partitions), str(seen.partitions),
            seen.partitions == spec.partitions,
        ),
        Finding(
            name, "replication.factor", f">= {rf_min}", str(seen.replication_factor),
            seen.replication_factor >= rf_min,
        ),
    ]  # fmt: skip
    if seen.configs is None:
        reason = seen.configs_error or "no answer"
        rows.append(Finding(name, "configs", "readable (DescribeConfigs)", reason, False))
        return rows
    actual = {**KAFKA_DEFAULTS, **seen.configs}
    policy = actual["cleanup.policy"]
    wanted_policy = spec.configs["cleanup.policy"]
    rows.append(Finding(name, "cleanup.policy", wanted_policy, policy, policy == wanted_policy))
    if "retention.ms" in spec.configs:
        wanted = int(spec.configs["retention.ms"])
        rows.append(
            Finding(
                name,
                "retention.ms",
                "-1 (forever)" if wanted == -1 else f">= {wanted}",
                actual["retention.ms"],
                _retention_ok(actual["retention.ms"], wanted),
            )
        )
    isr = _int(actual["min.insync.replicas"])
    isr_min = int(spec.configs["min.insync.replicas"])
    ok = isr is not None and isr_min <= isr <= seen.replication_factor
    expected = f">= {isr_min} and <= replication.factor ({seen.replication_factor})"
    rows.append(Finding(name, "min.insync.replicas", expected, actual["min.insync.replicas"], ok))
    return rows


def _retention_ok(actual: str, wanted: int) -> bool:
    value = _int(actual)
    if value is None:
        return False
    if value == -1:
        return True
    return wanted != -1 and value >= wanted


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def problems(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ok]


def render_table(findings: Sequence[Finding]) -> str:
    """A plain-text table: topic, setting, expected, actual, OK or PROBLEM."""
    header = ("topic", "setting", "expected", "actual", "result")
    rows = [
        (f.topic, f.setting, f.expected, f.actual, "OK" if f.ok else "PROBLEM") for f in findings
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in [header, *rows]]  # fmt: skip
    return "\n".join(lines)
