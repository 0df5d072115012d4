"""deploy/ on a real cluster and a real nats-server: the manifests, the RBAC and the NATS users.

- Every manifest of the base, the local overlay and the NATS-over-TLS overlay is accepted by the
  API server (server-side dry run; cert-manager's objects apart, see test_deploy_tls.py), and the
  pods they describe are hardened as the namespace's PodSecurity level demands.
- Every service and the webhook runs two replicas (one in the local overlay), kept apart by a
  preferred anti-affinity on the node, under a disruption budget of its own, each replica named by
  its pod (RESPAWN_INSTANCE); on the testbed's nodes the scheduler puts the two replicas on
  different nodes and each budget counts exactly its two pods.
- Each service's ServiceAccount, with a token minted for it, may do what the service does and is
  refused what it does not; health and autopilot may do nothing at all.
- The services run as processes with those tokens and their own NATS users, against a
  nats-server started with the generated auth config, and an AppWrapper still runs to Succeeded,
  is reset and fails at its retry limit, and node labels still become node verdicts.
- What each NATS user may and may not do on that server is proven, request by request, in
  test_nats_permissions.py; here the outside subscriber reads the story of the AppWrappers from
  the mirrors in its own account.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from respawn import natsauth
from respawn.testbed import incluster, kubeapi, manifests, pki, realnode, sim
from respawn.testbed.cluster import kubectl, kubectl_binary
from respawn.testbed.manifests import job_appwrapper
from respawn.testbed.modes import Endpoints
from respawn.testbed.nats import find_nats_server
from respawn.testbed.services import ServiceProcess, spawn_service
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.appwrapper.params import (
    RETRY_LIMIT_ANNOTATION,
)
from shared.bus import Bus, Delivery, default_streams
from shared.config import load_config
from shared.messages import (
    LifecycleEvent,
    Message,
    NodeVerdict,
    Verdict,
    decode,
)
from tests.integration.natsauth_fixtures import AuthNats, client, start_auth_nats
from tests.integration.objects import (
    FAST_RESET,
    apply,
    events_when,
    jobs,
    labelled_pods,
    wait_phase,
)
from tests.waiting import until, until_sync

pytestmark = pytest.mark.testbed

M = TypeVar("M", bound=Message)
STREAMS = default_streams()

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
TARGETS = ("base", "overlays/local", "overlays/nats-tls")
AUTH_CONF = DEPLOY / "nats" / "auth.conf"
SYSTEM_NS = "respawn-system"
SERVICES = natsauth.SERVICES
WITH_KUBE = ("watcher", "lifecycle")

# A resource and a node label that only this module's autopilot watches, so labelling a shared
# testbed node disturbs nobody else.
TEST_RESOURCE = "deploy-test.respawn.dev/gpu"
TEST_LABEL = "deploy-test.respawn.dev/health"


# ---------------------------------------------------------------------------------- helpers


def build(target: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [kubectl_binary(), "kustomize", str(DEPLOY / target)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, f"kustomize build of deploy/{target} failed: {proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def dump(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def configmap(docs: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    # Generated ConfigMaps carry a content hash after their name.
    found = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix + "-")]
    assert len(found) == 1, f"expected one ConfigMap {prefix}-<hash>, found {len(found)}"
    return found[0]


def now() -> datetime:
    return datetime.now(UTC)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------- the manifests


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    return {target: build(target) for target in TARGETS}


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }


@pytest.mark.parametrize("target", TARGETS)
def test_build_holds_the_whole_system(built: dict[str, list[dict[str, Any]]], target: str) -> None:
    docs = built[target]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    expected = {
        ("Namespace", SYSTEM_NS),
        ("CustomResourceDefinition", "appwrappers.workload.codeflare.dev"),
        ("StatefulSet", "respawn-nats"),
        ("Service", "respawn-nats"),
        ("Service", "respawn-nats-headless"),
        *(("Deployment", f"respawn-{s}") for s in (*SERVICES, "webhook")),
        *(("ServiceAccount", f"respawn-{s}") for s in (*SERVICES, "webhook")),
        *(("ClusterRoleBinding", f"respawn-{s}") for s in (*WITH_KUBE, "webhook")),
        ("Service", "respawn-webhook"),
        ("MutatingWebhookConfiguration", "respawn-appwrapper"),
        ("ValidatingWebhookConfiguration", "respawn-appwrapper"),
        ("ValidatingAdmissionPolicy", LIFECYCLE_POLICY),
        ("ValidatingAdmissionPolicyBinding", LIFECYCLE_POLICY),
    }
    assert expected <= names
    # The owners between a component and its pods are read, never listed or watched, by both.
    for service in WITH_KUBE:
        chains = one(docs, "ClusterRole", f"respawn-{service}-owner-chains")
        assert chains["metadata"]["labels"][f"rbac.respawn.dev/aggregate-to-{service}"] == "true"
        assert {verb for rule in chains["rules"] for verb in rule["verbs"]} == {"get"}
        assert {res for rule in chains["rules"] for res in rule["resources"]} == set(OWNER_CHAIN_KINDS)
    namespaced = [d for d in docs if d["kind"] not in CLUSTER_SCOPED]
    assert {d["metadata"].get("namespace") for d in namespaced} == {SYSTEM_NS}


# The kinds between a wrapped component and its pods (docs/deploy.md).
OWNER_CHAIN_KINDS = ("pods", "replicasets", "statefulsets", "jobs", "rayclusters")

CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}
LIFECYCLE_POLICY = "respawn-lifecycle-creates-appwrapper-components"


@pytest.mark.parametrize("target", TARGETS)
def test_the_webhook_is_installed_failing_closed_with_the_services_configuration(
    built: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = built[target]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = one(docs, kind, "respawn-appwrapper")["webhooks"]
        # No answer, no AppWrapper: an outage refuses creation rather than skipping the checks.
        assert hook["failurePolicy"] == "Fail", kind
        assert hook["clientConfig"]["service"] == {
            "name": "respawn-webhook",
            "namespace": SYSTEM_NS,
            "path": "/mutate-appwrapper" if kind.startswith("Mutating") else "/validate-appwrapper",
            "port": 443,
        }
    spec = pod_specs(docs)["respawn-webhook"]
    (container,) = spec["containers"]
    assert container["command"] == ["python", "-m", "services.webhook"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The webhook reads the services' generated configuration (admission.* and defaultQueueName).
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == configmap(docs, "respawn-config")["metadata"]["name"]
    assert container["envFrom"] == [
        {"configMapRef": {"name": configmap(docs, "respawn-env")["metadata"]["name"]}}
    ]
    assert volumes["certs"]["secret"]["secretName"] == "respawn-webhook-cert"
    replicas = one(docs, "Deployment", "respawn-webhook")["spec"]["replicas"]
    assert replicas == (1 if target == "overlays/local" else 2)


def test_the_lifecycle_policy_names_the_built_service_account(built: dict[str, list[dict[str, Any]]]) -> None:
    # The policy matches lifecycle by its user name, which kustomize cannot rewrite in CEL: it
    # must agree with the namespace and ServiceAccount the base builds.
    docs = built["base"]
    policy = one(docs, "ValidatingAdmissionPolicy", LIFECYCLE_POLICY)["spec"]
    account = one(docs, "ServiceAccount", "respawn-lifecycle")
    user = f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
    (by_lifecycle,) = [c for c in policy["matchConditions"] if c["name"] == "made-by-lifecycle"]
    assert by_lifecycle["expression"] == f"request.userInfo.username == '{user}'"
    assert f"'{SYSTEM_NS}'" in policy["validations"][0]["expression"]
    binding = one(docs, "ValidatingAdmissionPolicyBinding", LIFECYCLE_POLICY)["spec"]
    assert binding == {"policyName": LIFECYCLE_POLICY, "validationActions": ["Deny"]}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("service", SERVICES)
def test_each_service_deployment_is_hardened(
    built: dict[str, list[dict[str, Any]]], target: str, service: str
) -> None:
    spec = one(built[target], "Deployment", f"respawn-{service}")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == f"respawn-{service}"
    # Service links would add RESPAWN_NATS_* variables, which the config loader rejects.
    assert spec["enableServiceLinks"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] > 0
    (container,) = spec["containers"]
    assert container["image"] == "respawn:0.1.0"
    assert container["command"] == ["python", "-m", f"services.{service}"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 8081}
    env = {e["name"]: e for e in container["env"]}
    assert env["RESPAWN_PROBE_PORT"]["value"] == "8081"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    # The token is mounted only where the service talks to the API server.
    assert spec.get("automountServiceAccountToken", True) is (service in WITH_KUBE)


@pytest.mark.parametrize("service", ("health", "autopilot"))
def test_health_and_autopilot_get_no_kubernetes_access(
    built: dict[str, list[dict[str, Any]]], service: str
) -> None:
    docs = built["base"]
    account = one(docs, "ServiceAccount", f"respawn-{service}")
    assert account["automountServiceAccountToken"] is False
    bound = [
        d
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and any(s.get("name") == f"respawn-{service}" for s in d.get("subjects") or [])
    ]
    assert bound == []


def test_the_quarantine_marks_component_lets_autopilot_get_and_patch_nodes_and_nothing_else(
    built: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    # The base gives autopilot no token; the Component (docs/autopilot.md, "Marks on the Node")
    # gives it one, and the right to read and patch Nodes only.
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    deploy = os.path.relpath(DEPLOY, overlay)
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{deploy}/base]\ncomponents: [{deploy}/quarantine-marks]\n"
    )
    proc = subprocess.run(
        [kubectl_binary(), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(overlay)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert one(docs, "ServiceAccount", "respawn-autopilot")["automountServiceAccountToken"] is True
    deployment = one(docs, "Deployment", "respawn-autopilot")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    bound = [
        d
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and any(s.get("name") == "respawn-autopilot" for s in d.get("subjects") or [])
    ]
    assert [(b["kind"], b["roleRef"]["name"]) for b in bound] == [
        ("ClusterRoleBinding", "respawn-autopilot-node-marks")
    ]
    assert bound[0]["subjects"] == [
        {"kind": "ServiceAccount", "name": "respawn-autopilot", "namespace": SYSTEM_NS}
    ]
    role = one(docs, "ClusterRole", "respawn-autopilot-node-marks")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    # The marks are switched on through the shared environment, and the values load.
    env = configmap(docs, "respawn-env")["data"]
    quarantine = load_config(env=env).node_quarantine
    assert (quarantine.node_label, quarantine.node_taint) == (
        "respawn.dev/quarantined",
        "respawn.dev/quarantined",
    )

    # Everything of the base is still there (the environment's ConfigMap under a new hash).
    def names(found: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {
            (d["kind"], d["metadata"]["name"])
            for d in found
            if not d["metadata"]["name"].startswith("respawn-env-")
        }

    assert names(built["base"]) <= names(docs)


def test_base_runs_three_nats_servers_and_replicates_streams_three_times(
    built: dict[str, list[dict[str, Any]]],
) -> None:
    docs = built["base"]
    assert one(docs, "StatefulSet", "respawn-nats")["spec"]["replicas"] == 3
    assert configmap(docs, "respawn-env")["data"]["RESPAWN_NATS_STREAM_REPLICAS"] == "3"
    cluster = configmap(docs, "respawn-nats-config")["data"]["cluster.conf"]
    routes = [line.strip() for line in cluster.splitlines() if line.strip().startswith("nats://")]
    assert routes == [f"nats://respawn-nats-{i}.respawn-nats-headless:6222" for i in range(3)]
    headless = one(docs, "Service", "respawn-nats-headless")["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert one(docs, "StatefulSet", "respawn-nats")["spec"]["serviceName"] == "respawn-nats-headless"


def test_local_overlay_runs_one_server_with_unreplicated_streams(
    built: dict[str, list[dict[str, Any]]],
) -> None:
    docs = built["overlays/local"]
    assert one(docs, "StatefulSet", "respawn-nats")["spec"]["replicas"] == 1
    assert configmap(docs, "respawn-env")["data"]["RESPAWN_NATS_STREAM_REPLICAS"] == "1"
    assert "cluster {" not in configmap(docs, "respawn-nats-config")["data"]["cluster.conf"]
    for service in SERVICES:
        assert one(docs, "Deployment", f"respawn-{service}")["spec"]["replicas"] == 1


# ------------------------------------------------------------------------------ replicas


DEPLOYABLES = (*SERVICES, "webhook")
HOSTNAME = "kubernetes.io/hostname"


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def template_labels(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The labels of every pod template in ``docs``, by the name of its workload."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"].get("labels") or {}
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("deployable", DEPLOYABLES)
def test_each_deployable_runs_replicas_apart_under_its_own_budget_each_named_by_its_pod(
    built: dict[str, list[dict[str, Any]]], target: str, deployable: str
) -> None:
    docs = built[target]
    name = f"respawn-{deployable}"
    deployment = one(docs, "Deployment", name)["spec"]
    # Two by default, so that losing or evicting one replica stops nothing; one on a single machine.
    assert deployment["replicas"] == (1 if target == "overlays/local" else 2)
    selector = deployment["selector"]["matchLabels"]
    labels = deployment["template"]["metadata"]["labels"]
    assert selects(selector, labels)

    # Its budget selects its pods and no other workload's, and no other budget selects its pods.
    budget = one(docs, "PodDisruptionBudget", name)["spec"]
    assert budget["selector"] == {"matchLabels": selector}
    assert [w for w, pod in template_labels(docs).items() if selects(selector, pod)] == [name]
    budgets = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "PodDisruptionBudget" and selects(d["spec"]["selector"]["matchLabels"], labels)
    ]
    assert budgets == [name]
    # At most one down; minAvailable: 1 would never let a lone replica (the local overlay) be evicted.
    assert budget["maxUnavailable"] == 1 and "minAvailable" not in budget

    spec = deployment["template"]["spec"]
    anti = spec["affinity"]["podAntiAffinity"]
    # Preferred, not required: a cluster with fewer nodes than replicas still runs them all.
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": selector}}
    # One rule spreads the replicas over nodes, not a topology constraint on the same key beside it.
    assert "topologySpreadConstraints" not in spec

    # Each replica's identity is its pod name.
    (container,) = spec["containers"]
    (instance,) = [e for e in container["env"] if e["name"] == "RESPAWN_INSTANCE"]
    assert instance == {"name": "RESPAWN_INSTANCE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}


def test_replicas_land_on_different_nodes_and_each_budget_counts_exactly_its_pods(
    testbed: Endpoints, built: dict[str, list[dict[str, Any]]], namespace: str
) -> None:
    """The base's Deployments and budgets (with their ServiceAccounts, which pod admission
    requires) in a namespace of this test's own, on the testbed's kwok nodes: the scheduler and
    the disruption controller read them as a cluster would; no container runs."""
    kc = testbed.kubeconfig
    names = {f"respawn-{d}" for d in DEPLOYABLES}
    docs = [
        {**d, "metadata": {**d["metadata"], "namespace": namespace}}
        for d in built["base"]
        if d["kind"] in ("ServiceAccount", "Deployment", "PodDisruptionBudget")
        and d["metadata"]["name"] in names
    ]
    kubectl(kc, "apply", "-f", "-", stdin=dump(docs))
    nodes = kubectl(kc, "get", "nodes", "-o", "name").stdout.split()
    assert len(nodes) >= 2, "the spread needs a testbed of two nodes or more"

    def budget_status(name: str) -> dict[str, Any]:
        out = kubectl(kc, "get", "pdb", name, "-n", namespace, "-o", "json").stdout
        return dict(json.loads(out).get("status") or {})

    def all_counted() -> bool:
        return all(
            budget_status(n).get("expectedPods") == 2 and budget_status(n).get("currentHealthy") == 2
            for n in names
        )

    until_sync("every budget to count two healthy replicas", all_counted, within=60, every=0.5)
    for name in sorted(names):
        status = budget_status(name)
        # Exactly its own two pods, of which one may be evicted at a time.
        assert (status["expectedPods"], status["desiredHealthy"], status["disruptionsAllowed"]) == (
            2,
            1,
            1,
        ), name
        component = name.removeprefix("respawn-")
        selector = f"app.kubernetes.io/name=respawn,app.kubernetes.io/component={component}"
        pods = json.loads(kubectl(kc, "get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)
        placed = [
            p["spec"].get("nodeName") for p in pods["items"] if not p["metadata"].get("deletionTimestamp")
        ]
        assert len(placed) == 2 and len(set(placed)) == 2 and None not in placed, (name, placed)


@pytest.mark.parametrize("target", TARGETS)
def test_nats_pods_are_hardened_and_get_every_password(
    built: dict[str, list[dict[str, Any]]], target: str
) -> None:
    spec = pod_specs(built[target])["respawn-nats"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    containers = {c["name"]: c for c in spec["containers"]}
    # With TLS, a reloader beside the server (deploy/nats/tls).
    assert set(containers) == ({"nats", "reloader"} if target == "overlays/nats-tls" else {"nats"})
    for container in containers.values():
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    container = containers["nats"]
    assert container["image"].startswith("nats:")
    secret_env = {e["name"] for e in container["env"] if "secretKeyRef" in (e.get("valueFrom") or {})}
    assert secret_env == {u.password_variable for u in natsauth.default_users()}


NATS_TLS_SECRET = "respawn-nats-tls"


def nats_tls_mount(docs: list[dict[str, Any]]) -> str | None:
    """Where the NATS server container mounts the Secret respawn-nats-tls (None: it does not)."""
    spec = pod_specs(docs)["respawn-nats"]
    volumes = {
        v["name"] for v in spec["volumes"] if (v.get("secret") or {}).get("secretName") == NATS_TLS_SECRET
    }
    (nats,) = [c for c in spec["containers"] if c["name"] == "nats"]
    mounts = [m["mountPath"] for m in nats.get("volumeMounts") or [] if m["name"] in volumes]
    return mounts[0] if mounts else None


def nats_config_files(docs: list[dict[str, Any]], directory: Path) -> Path:
    """The NATS configuration files of ``docs`` written to ``directory``, as the server reads
    them; with TLS, the Secret's files (certificates of a CA of this test's own) are written
    too and the configuration points where they are instead of the pod's mount. Returns the
    path of nats.conf."""
    directory.mkdir(parents=True, exist_ok=True)
    files = dict(configmap(docs, "respawn-nats-config")["data"])
    mount = nats_tls_mount(docs)
    if mount is not None:
        secret = nats_tls_secret(directory / "secret")
        files = {name: text.replace(mount.rstrip("/") + "/", f"{secret}/") for name, text in files.items()}
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory / "nats.conf"


def nats_tls_secret(directory: Path, *, dns_names: tuple[str, ...] = ("localhost",)) -> Path:
    """A directory holding what the Secret respawn-nats-tls holds (tls.crt, tls.key, ca.crt):
    a serving certificate for ``dns_names`` and 127.0.0.1, for server and client use as the
    cert-manager Certificate issues it, and its CA."""
    authority = pki.generate(directory / "pki", clients={})
    crt, key = pki.serving_cert(authority, "nats", dns_names=dns_names, client=True)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(crt.read_bytes())
    (directory / "tls.key").write_bytes(key.read_bytes())
    (directory / "ca.crt").write_bytes(authority.ca_crt.read_bytes())
    return directory


@pytest.mark.parametrize("target", TARGETS)
def test_nats_server_accepts_the_generated_configuration(
    built: dict[str, list[dict[str, Any]]], target: str, tmp_path: Path
) -> None:
    conf = nats_config_files(built[target], tmp_path)
    env = {"POD_NAME": "respawn-nats-0", "PATH": "/usr/bin:/bin"}
    env |= {u.password_variable: natsauth.generate_password() for u in natsauth.default_users()}
    test = [str(find_nats_server()), "-c", str(conf), "-t"]
    proc = subprocess.run(test, env=env, capture_output=True, text=True, check=False, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is valid" in proc.stdout + proc.stderr
    # A password missing from the Secret stops the server instead of leaving a user open.
    env.pop(natsauth.password_variable("health"))
    proc = subprocess.run(test, env=env, capture_output=True, text=True, check=False, timeout=30)
    assert proc.returncode != 0
    assert "NATS_PASSWORD_HEALTH" in proc.stdout + proc.stderr


def test_operator_config_in_the_base_is_valid(built: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(configmap(built["base"], "respawn-config")["data"]["config.yaml"])
    env = dict(configmap(built["base"], "respawn-env")["data"])
    config = load_config(path, env=env)
    assert config.nats.url == "nats://respawn-nats:4222"
    assert config.nats.stream_replicas == 3
    assert (config.admission.max_template_depth, config.admission.max_template_bytes) == (64, 512 * 1024)


def test_dockerfile_builds_one_non_root_image_from_the_package() -> None:
    lines = [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]
    stages = [line for line in lines if line.startswith("FROM ")]
    # Two stages on bases given as arguments, defaulting to the official slim Python image (the
    # images script passes bases made from Debian's packages instead).
    assert stages == ["FROM ${BUILD_IMAGE} AS build", "FROM ${PYTHON_IMAGE}"], stages
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in lines
    assert "ARG BUILD_IMAGE=${PYTHON_IMAGE}" in lines
    assert "USER 10001:10001" in lines
    # The locked dependencies, each checked against its hash, then the package alone on top.
    assert any("pip install --require-hashes" in line and "-r requirements.lock" in line for line in lines)
    assert any("pip install" in line and "--no-deps" in line and line.endswith(" .") for line in lines)
    copied = [
        source
        for line in lines
        if line.startswith("COPY ") and "--from" not in line
        for source in line.split()[1:-1]
    ]
    for source in copied:
        assert (REPO / source).exists(), source
    # The build context is exactly what the COPY lines need.
    allowed = {
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert {s.rstrip("/") for s in copied} == allowed


# ------------------------------------------------------------------------ server dry run


CERT_MANAGER = "cert-manager.io/"
CERT_MANAGER_OBJECTS = {
    ("Issuer", "respawn-nats-selfsigned"),
    ("Certificate", "respawn-nats-ca"),
    ("Issuer", "respawn-nats-ca"),
    ("Certificate", "respawn-nats"),
}


@pytest.mark.parametrize("target", TARGETS)
def test_every_manifest_passes_server_side_dry_run(
    testbed: Endpoints, built: dict[str, list[dict[str, Any]]], target: str
) -> None:
    kc = testbed.kubeconfig
    # cert-manager's kinds are not served by the testbed (no cert-manager there); they are
    # checked by test_deploy_tls.py.
    docs = [d for d in built[target] if not d["apiVersion"].startswith(CERT_MANAGER)]
    skipped = {(d["kind"], d["metadata"]["name"]) for d in built[target] if d not in docs}
    assert skipped == (CERT_MANAGER_OBJECTS if target == "overlays/nats-tls" else set())
    # Namespaced objects can only be dry-run into a namespace that exists; create it for real
    # (with its PodSecurity labels, which the dry run of the pod templates is checked against).
    kubectl(kc, "apply", "-f", "-", stdin=dump([d for d in docs if d["kind"] == "Namespace"]))
    proc = kubectl(kc, "apply", "--dry-run=server", "-f", "-", stdin=dump(docs), check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == len(docs), proc.stdout
    assert all(line.endswith("(server dry run)") for line in lines), proc.stdout
    assert "PodSecurity" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------ RBAC


@dataclass
class Accounts:
    """A kubeconfig per service, authenticated with a token of the service's own ServiceAccount."""

    kubeconfigs: dict[str, Path]

    def __getitem__(self, service: str) -> Path:
        return self.kubeconfigs[service]


def service_account_kubeconfig(admin: Path, token: str, out: Path) -> Path:
    """The admin kubeconfig's server and CA, with ``token`` as the only credential."""
    config = yaml.safe_load(admin.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = dict(next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"]))
    if "certificate-authority" in cluster:
        ca = Path(cluster.pop("certificate-authority"))
        ca = ca if ca.is_absolute() else admin.parent / ca
        cluster["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": cluster}],
        "users": [{"name": "service-account", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "testbed", "user": "service-account"}}],
        "current-context": "sa",
    }
    out.write_text(yaml.safe_dump(doc))
    out.chmod(0o600)
    return out


def rules_of(kubeconfig: Path, role: str) -> list[dict[str, Any]]:
    body = json.loads(kubectl(kubeconfig, "get", "clusterrole", role, "-o", "json").stdout)
    return list(body.get("rules") or [])


@pytest.fixture(scope="module")
def accounts(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Accounts]:
    """The base's ServiceAccounts and RBAC applied to the testbed, and a token for each."""
    kc = testbed.kubeconfig
    # With lifecycle's admission policy: everything below, the services end to end included, runs
    # under it.
    rbac = [
        d
        for d in build("base")
        if d["kind"]
        in (
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        )
    ]
    kubectl(kc, "apply", "-f", "-", stdin=dump(rbac))

    # The aggregated roles are filled in by the controller manager, shortly after.
    def aggregated() -> bool:
        watcher = json.dumps(rules_of(kc, "respawn-watcher"))
        lifecycle = json.dumps(rules_of(kc, "respawn-lifecycle"))
        return (
            "pytorchjobs" in watcher
            and "nodes" in watcher
            and "pytorchjobs" in lifecycle
            and "events" in lifecycle
        )

    until_sync("the aggregated ClusterRoles to be filled in", aggregated, within=60)
    out = tmp_path_factory.mktemp("service-accounts")
    kubeconfigs = {}
    for service in SERVICES:
        token = kubectl(
            kc, "create", "token", f"respawn-{service}", "-n", SYSTEM_NS, "--duration=2h"
        ).stdout.strip()
        kubeconfigs[service] = service_account_kubeconfig(kc, token, out / f"{service}.kubeconfig")

    # The API server enforces a new policy once its informers have seen it: poll with a dry run.
    def policy_in_force() -> bool:
        probe = ("create", "configmap", "policy-probe", "-n", "default", "--dry-run=server")
        return LIFECYCLE_POLICY in kubectl(kubeconfigs["lifecycle"], *probe, check=False).stderr

    until_sync(f"{LIFECYCLE_POLICY} to be in force", policy_in_force, within=60, every=0.3)
    yield Accounts(kubeconfigs)
    bindings = [d for d in rbac if d["kind"] not in ("Namespace", "ServiceAccount")]
    kubectl(kc, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=dump(bindings), check=False)


def can_i(kubeconfig: Path, verb: str, resource: str, namespace: str = "") -> bool:
    """Whether the kubeconfig's own user may ``verb`` ``resource`` (``plural[.group][/sub]``).

    A SelfSubjectAccessReview, so kinds that are not installed (JobSet, Ray) are asked about
    exactly as named; an empty namespace means every namespace.
    """
    target, _, subresource = resource.partition("/")
    plural, _, group = target.partition(".")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": plural,
                "subresource": subresource,
                "namespace": namespace,
            }
        },
    }
    answer = kubeapi.create(kubeconfig, review, plural="selfsubjectaccessreviews")
    return bool(answer["status"].get("allowed"))


def refused(kubeconfig: Path, service: str, *args: str) -> str:
    """Run kubectl as ``service``; assert the API server refused it, naming the ServiceAccount."""
    proc = kubectl(kubeconfig, *args, check=False)
    assert proc.returncode != 0, f"kubectl {' '.join(args)} was allowed for {service}"
    assert "forbidden" in proc.stderr.lower(), proc.stderr
    assert f"system:serviceaccount:{SYSTEM_NS}:respawn-{service}" in proc.stderr, proc.stderr
    return proc.stderr


WRAPPED_KINDS = (
    "jobs.batch",
    "pytorchjobs.kubeflow.org",
    "podgroups.scheduling.x-k8s.io",
    "deployments.apps",
    "statefulsets.apps",
    "replicasets.apps",
    "services",
    "configmaps",
    "jobsets.jobset.x-k8s.io",
    "rayclusters.ray.io",
    "rayjobs.ray.io",
)
APPWRAPPERS = "appwrappers.workload.codeflare.dev"


def owned_job(name: str, owner_uid: str) -> dict[str, Any]:
    """A Job as lifecycle creates one: controlled by the AppWrapper ``owner``."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "ownerReferences": [
                {
                    "apiVersion": "workload.codeflare.dev/v1beta2",
                    "kind": "AppWrapper",
                    "name": "owner",
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
            }
        },
    }


def test_watcher_may_read_what_it_watches_and_nothing_else(
    testbed: Endpoints, accounts: Accounts, namespace: str
) -> None:
    kc = accounts["watcher"]
    for resource in (APPWRAPPERS, "pods", "nodes", *WRAPPED_KINDS):
        for verb in ("get", "list", "watch"):
            assert can_i(kc, verb, resource), f"watcher cannot {verb} {resource}"
    for resource in ("pods", "replicasets.apps", "statefulsets.apps", "jobs.batch", "rayclusters.ray.io"):
        assert can_i(kc, "get", resource), f"watcher cannot get {resource} (owner chains)"
    # Its one write: a Warning Event on an object it cannot observe, for the object's owner.
    assert can_i(kc, "create", "events"), "watcher cannot create events"
    for verb, resource in [
        ("create", APPWRAPPERS),
        ("update", APPWRAPPERS),
        ("patch", APPWRAPPERS),
        ("delete", APPWRAPPERS),
        ("update", f"{APPWRAPPERS}/status"),
        ("delete", "pods"),
        ("create", "jobs.batch"),
        ("delete", "jobs.batch"),
        ("update", "events"),
        ("delete", "events"),
        ("patch", "nodes"),
        ("get", "secrets"),
        ("list", "secrets"),
    ]:
        assert not can_i(kc, verb, resource), f"watcher may {verb} {resource}"
    # Real requests, both ways.
    nodes = kubectl(kc, "get", "nodes", "-o", "name").stdout.split()
    assert nodes, "the watcher's token lists no node"
    kubectl(kc, "get", "appwrappers,pods,jobs", "--all-namespaces")
    refused(kc, "watcher", "delete", "pod", "anything", "-n", namespace)
    refused(kc, "watcher", "get", "secrets", "-n", namespace)
    refused(kc, "watcher", "create", "configmap", "probe", "-n", namespace)
    refused(kc, "watcher", "label", "node", nodes[0].removeprefix("node/"), "probe=1")


def test_lifecycle_may_manage_appwrappers_and_their_resources_and_nothing_else(
    testbed: Endpoints, accounts: Accounts, namespace: str
) -> None:
    kc = accounts["lifecycle"]
    for verb, resource in [
        ("get", APPWRAPPERS),
        ("list", APPWRAPPERS),
        ("watch", APPWRAPPERS),
        ("update", APPWRAPPERS),
        ("patch", APPWRAPPERS),
        ("update", f"{APPWRAPPERS}/status"),
        ("update", f"{APPWRAPPERS}/finalizers"),
        ("list", "pods"),
        ("watch", "pods"),
        ("delete", "pods"),
        ("list", "nodes"),
        ("watch", "nodes"),
        ("create", "events"),
        *(
            (verb, kind)
            for kind in (*WRAPPED_KINDS, "pods")
            for verb in ("create", "get", "list", "watch", "delete")
        ),
    ]:
        assert can_i(kc, verb, resource), f"lifecycle cannot {verb} {resource}"
    for verb, resource in [
        ("create", APPWRAPPERS),
        ("delete", APPWRAPPERS),
        ("update", "pods"),
        ("patch", "pods"),
        ("update", "jobs.batch"),
        ("patch", "deployments.apps"),
        ("patch", "nodes"),
        ("get", "secrets"),
        ("create", "secrets"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
        ("create", "pods/exec"),
    ]:
        assert not can_i(kc, verb, resource), f"lifecycle may {verb} {resource}"
    # Real requests, both ways: it creates and deletes a wrapped kind, but cannot edit it. What
    # it creates must belong to an AppWrapper (its admission policy, deploy/base/rbac).
    unowned = kubectl(kc, "create", "job", "unowned", "--image=busybox", "-n", namespace, check=False)
    assert unowned.returncode != 0
    assert f"ValidatingAdmissionPolicy '{LIFECYCLE_POLICY}'" in unowned.stderr, unowned.stderr
    assert "has no controller ownerReference to a workload.codeflare.dev/v1beta2 AppWrapper" in unowned.stderr
    # Owned by a real (suspended) AppWrapper, so the garbage collector leaves the Job alone.
    owner = manifests.job_appwrapper("owner", suspend=True)
    kubectl(testbed.kubeconfig, "create", "-n", namespace, "-f", "-", stdin=json.dumps(owner))
    uid = kubectl(
        testbed.kubeconfig, "get", "appwrapper", "owner", "-n", namespace, "-o", "jsonpath={.metadata.uid}"
    ).stdout
    kubectl(kc, "create", "-n", namespace, "-f", "-", stdin=json.dumps(owned_job("probe", uid)))
    refused(kc, "lifecycle", "label", "job", "probe", "edited=1", "-n", namespace)
    kubectl(kc, "delete", "job", "probe", "-n", namespace, "--wait=false")
    refused(kc, "lifecycle", "get", "secrets", "-n", namespace)
    refused(kc, "lifecycle", "create", "secret", "generic", "probe", "-n", namespace)
    refused(kc, "lifecycle", "delete", "appwrapper", "anything", "-n", namespace)
    refused(kc, "lifecycle", "create", "clusterrolebinding", "probe", "--clusterrole=admin", "--user=me")


@pytest.mark.parametrize("service", ("health", "autopilot"))
def test_health_and_autopilot_tokens_can_do_nothing(
    testbed: Endpoints, accounts: Accounts, namespace: str, service: str
) -> None:
    kc = accounts[service]
    for verb in ("get", "list", "watch"):
        for resource in (APPWRAPPERS, "pods", "nodes", "jobs.batch", "events"):
            assert not can_i(kc, verb, resource), f"{service} may {verb} {resource}"
    refused(kc, service, "get", "nodes")
    refused(kc, service, "get", "pods", "-n", namespace)


# ------------------------------------------------------------- NATS with the generated auth


@pytest.fixture(scope="module")
def auth_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthNats]:
    """A nats-server started with the committed auth.conf; passwords come from its environment."""
    users = [u.name for u in natsauth.default_users()]
    auth = start_auth_nats(tmp_path_factory.mktemp("nats-auth"), AUTH_CONF, users)
    try:
        yield auth
    finally:
        auth.server.stop()


def subscriber(auth: AuthNats) -> Any:
    return client(auth, natsauth.SUBSCRIBER, inbox_prefix=natsauth.inbox_prefix(natsauth.SUBSCRIBER))


@dataclass
class Stack:
    processes: dict[str, ServiceProcess]
    log_dir: Path
    auth: AuthNats

    def refusals(self) -> list[str]:
        """Log lines where RBAC or NATS refused a service something (not e.g. a namespace that
        is being deleted, which the API server also answers with 403)."""
        bad = (
            f'forbidden: user "system:serviceaccount:{SYSTEM_NS}:',
            "permissions violation",
            "authorization violation",
        )
        found = []
        for log in sorted(self.log_dir.glob("*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if any(b in line.lower() for b in bad):
                    found.append(f"{log.name}: {line}")
        return found


@pytest.fixture(scope="module")
def stack(
    testbed: Endpoints,
    appwrapper_crd: Path,
    accounts: Accounts,
    auth_nats: AuthNats,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """All four services as processes, each with its own ServiceAccount token and NATS user."""
    log_dir = tmp_path_factory.mktemp("least-privilege") / "logs"
    extra: dict[str, dict[str, str]] = {
        "autopilot": {
            "RESPAWN_AUTOPILOT_RESOURCE_TAINTS": json.dumps(
                {TEST_RESOURCE: [{"key": TEST_LABEL, "value": "BAD", "effect": "NoSchedule"}]}
            )
        }
    }
    started: dict[str, ServiceProcess] = {}
    try:
        for service in SERVICES:
            env = {
                "NATS_USER": service,
                "NATS_PASSWORD": auth_nats.passwords[service],
                **extra.get(service, {}),
            }
            started[service] = spawn_service(
                service, kubeconfig=accounts[service], nats_url=auth_nats.url, log_dir=log_dir, env=env
            )
        yield Stack(started, log_dir, auth_nats)
    finally:
        for process in started.values():
            process.stop()


async def published_for(auth: AuthNats, stream: str, subject: str, cls: type[Message]) -> list[Any]:
    """Every message on ``subject``, read as the outside subscriber from its mirror of ``stream``."""
    async with client(auth, "watcher") as watcher:
        source = await watcher.js.stream_info(stream, subjects_filter=subject)
        expected = int((source.state.subjects or {}).get(subject, 0))
    async with subscriber(auth) as sub:
        await natsauth.ensure_mirrors(sub.nc, natsauth.SUBSCRIBER)

        async def caught_up() -> bool:
            mirror = await sub.js.stream_info(stream, subjects_filter=subject)
            return int((mirror.state.subjects or {}).get(subject, 0)) >= expected

        await until(f"the subscriber's mirror of {stream} to hold {subject}", caught_up, within=30)
        osub = await sub.js.subscribe(subject, stream=stream, ordered_consumer=True)
        out = []
        try:
            while True:
                try:
                    msg = await osub.next_msg(timeout=1.0)
                except TimeoutError:
                    return out
                out.append(decode(cls, msg.data, msg.headers))
        finally:
            await osub.unsubscribe()


async def test_services_with_their_own_accounts_run_an_appwrapper_to_succeeded(
    testbed: Endpoints, stack: Stack, namespace: str
) -> None:
    kc = testbed.kubeconfig
    aw = job_appwrapper("fine", pod_annotations={sim.SUCCEED_AFTER: "2s"}, annotations=FAST_RESET)
    apply(kc, namespace, aw)
    done = await wait_phase(kc, namespace, "fine", "Succeeded", within=90)
    assert read_appwrapper(done).resetting_count == 0
    # The public streams tell the story to an outside subscriber.
    events = await published_for(
        stack.auth, subjects.LIFECYCLE_STREAM, subjects.lifecycle_event(namespace, "fine"), LifecycleEvent
    )
    assert "Succeeded" in [e.phase for e in events if e.event == "PhaseChanged"]
    verdicts = await published_for(
        stack.auth, subjects.VERDICTS_STREAM, subjects.verdict(namespace, "fine"), Verdict
    )
    assert verdicts, "no verdict was published for the AppWrapper"
    assert stack.refusals() == []
    assert all(p.alive() for p in stack.processes.values())


async def test_services_with_their_own_accounts_reset_a_failing_appwrapper_until_it_fails(
    testbed: Endpoints, stack: Stack, namespace: str
) -> None:
    kc = testbed.kubeconfig
    aw = job_appwrapper(
        "doomed",
        pod_annotations={sim.FAIL_AFTER: "1s"},
        annotations={**FAST_RESET, RETRY_LIMIT_ANNOTATION: "1"},
    )
    apply(kc, namespace, aw)
    failed = await wait_phase(kc, namespace, "doomed", "Failed", within=90)
    assert read_appwrapper(failed).resetting_count == 1

    # Deleting the Job and its pods, with the lifecycle's own token.
    await until(
        "the failed AppWrapper's Job and pods to be deleted",
        lambda: jobs(kc, namespace) + labelled_pods(kc, namespace, "doomed"),
        done=lambda left: not left,
        within=60,
    )

    def reasons(events: list[dict[str, Any]]) -> set[str]:
        return {e["reason"] for e in events if e.get("source", {}).get("component") == "respawn-lifecycle"}

    await events_when(
        kc,
        namespace,
        "doomed",
        "Resetting and Failed from lifecycle",
        lambda es: {"Resetting", "Failed"} <= reasons(es),
    )
    assert stack.refusals() == []


async def test_services_with_their_own_accounts_turn_node_labels_into_node_verdicts(
    testbed: Endpoints, stack: Stack
) -> None:
    kc = testbed.kubeconfig
    node = kubectl(kc, "get", "nodes", "-o", "name").stdout.split()[0].removeprefix("node/")
    subject = subjects.node_verdict(TEST_RESOURCE)

    async def last_verdict() -> NodeVerdict | None:
        # Read with autopilot's own user, the way it reads stored node verdicts at start.
        found: list[NodeVerdict] = []

        async def keep(message: NodeVerdict, delivery: Delivery) -> None:
            found.append(message)

        autopilot = await Bus.connect(
            stack.auth.url,
            name="respawn-autopilot",
            user="autopilot",
            password=stack.auth.passwords["autopilot"],
            connect_deadline=10,
        )
        try:
            await autopilot.replay(
                subjects.NODE_VERDICTS_STREAM,
                unique("autopilot"),
                subject,
                NodeVerdict,
                keep,
                last_per_subject=True,
                follow=False,
            )
        finally:
            await autopilot.close()
        return found[-1] if found else None

    sim.label_node(kc, node, TEST_LABEL, "BAD")
    try:

        async def flagged() -> NodeVerdict | None:
            found = await last_verdict()
            return found if found is not None and node in found.no_schedule else None

        await until(f"a node verdict flagging {node}", flagged, within=30)
    finally:
        sim.label_node(kc, node, TEST_LABEL, None)

    async def cleared() -> bool:
        found = await last_verdict()
        return found is not None and node not in found.no_schedule

    await until(f"the node verdict to clear {node}", cleared, within=30)
    assert stack.refusals() == []


def test_the_testbed_overlay_is_the_local_overlay_with_the_self_managed_webhook_and_the_built_nats(
    built: dict[str, list[dict[str, Any]]],
) -> None:
    """deploy/overlays/testbed (`respawn local deploy`) runs the local overlay's pods as they are:
    only the webhook's certificate (made by itself) and the NATS image (built here) differ."""
    testbed, local = pod_specs(build("overlays/testbed")), pod_specs(built["overlays/local"])
    assert set(testbed) == set(local)
    for name, spec in testbed.items():
        assert not spec.get("hostNetwork"), name
        if name not in ("respawn-webhook", "respawn-nats"):
            assert spec == local[name], name
    (nats,) = testbed["respawn-nats"]["containers"]
    assert nats["image"] == "respawn-nats:2.15.1"
    (webhook,) = testbed["respawn-webhook"]["containers"]
    assert "--self-managed-cert" in webhook["args"]
    namespace = one(build("overlays/testbed"), "Namespace", SYSTEM_NS)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_local_deploy_waits_for_the_claims_of_the_nats_servers_the_testbed_overlay_runs() -> None:
    docs = build("overlays/testbed")
    servers = incluster.nats_servers(docs)
    assert servers == one(docs, "StatefulSet", "respawn-nats")["spec"]["replicas"] == 1
    # The real node makes a claim for every server a release could run.
    assert servers <= len(realnode.NATS_CLAIMS)
