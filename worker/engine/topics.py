"""Topics as they should be (``TopicSpec``, a ``TopicPlan``) and the pure check of a cluster
against them, run by ``python -m worker topics`` and by every process before it starts: a
state topic on ``delete`` loses accounts, topics that are not co-partitioned mix accounts up
(docs/operations.md, "Topics"). Which topics the product has is its contract's
(``worker.contract.topics``); the engine checks whatever plan it is given."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from worker.runtime.process import Misconfigured

#: What Kafka applies to a topic that does not set these (its documented topic defaults). A
#: broker that leaves a config out of its DescribeConfigs answer (some omit every config a topic
#: was not created with: ``kafka.observe_topics``) is read as applying the default.
KAFKA_DEFAULTS: Final[Mapping[str, str]] = {
    "cleanup.policy": "delete",
    "retention.ms": str(7 * 86_400_000),
    "min.insync.replicas": "1",
}


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic as it should be. ``configs`` are what ``topics create`` sets."""

    name: str
    topic_field: str  # the plan's own key for the topic (the setting that names it)
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


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """Every topic's spec, and the groups of topic names whose partition numbers must line up
    (co-partitioned inputs and their changelog)."""

    specs: tuple[TopicSpec, ...]
    co_partitioned: tuple[tuple[str, ...], ...] = ()

    def only(self, names: Iterable[str] | None) -> TopicPlan:
        """The plan of ``names`` alone (``None``: all of it); a group is then checked among
        its named members."""
        if names is None:
            return self
        wanted = set(names)
        return TopicPlan(tuple(s for s in self.specs if s.name in wanted), self.co_partitioned)


class TopicsMisconfigured(Misconfigured):
    """The cluster's topics are not as their plan specifies; refuses a process's start."""

    def __init__(self, problems: Sequence[Finding], *, hint: str) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems) + f" ({hint})")


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
            ref, count = members[0], checked[name]
            expected = f"{checked[ref]} partitions, as {ref}"
            same = count == checked[ref]
            findings.append(Finding(name, "co-partitioning", expected, f"{count} partitions", same))
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
        wanted, kept = int(spec.configs["retention.ms"]), actual["retention.ms"]
        expected = "-1 (forever)" if wanted == -1 else f">= {wanted}"
        rows.append(Finding(name, "retention.ms", expected, kept, _retention_ok(kept, wanted)))
    isr = _int(actual["min.insync.replicas"])
    isr_min = int(spec.configs["min.insync.replicas"])
    ok = isr is not None and isr_min <= isr <= seen.replication_factor
    expected = f">= {isr_min} and <= replication.factor ({seen.replication_factor})"
    rows.append(Finding(name, "min.insync.replicas", expected, actual["min.insync.replicas"], ok))
    return rows


def _retention_ok(actual: str, wanted: int) -> bool:
    value = _int(actual)
    return value == -1 or (value is not None and wanted != -1 and value >= wanted)


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
