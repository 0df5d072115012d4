"""deploy/ on a real cluster and a real nats-server: the manifests, the RBAC and the NATS users.

- Every manifest of the base and the local overlay is accepted by the API server (server-side
  dry run), and the pods they describe are hardened as the namespace's PodSecurity level demands.
- Each service's ServiceAccount, with a token minted for it, may do what the service does and is
  refused what it does not; health and autopilot may do nothing at all.
- The services run as processes with those tokens and their own NATS users, against a
  nats-server started with the generated auth config, and an AppWrapper still runs to Succeeded,
  is reset and fails at its retry limit, and node labels still become node verdicts.
- On that server each service user can do its job on the bus and nothing more, and an outside
  subscriber can read the public streams and write nowhere.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
import pytest
import yaml
from nats.js import api

from respawn import natsauth
from respawn.testbed import sim
from respawn.testbed.cluster import kubectl, kubectl_binary
from respawn.testbed.manifests import job_appwrapper
from respawn.testbed.modes import Endpoints
from respawn.testbed.nats import NatsServer, find_nats_server, start_nats
from respawn.testbed.services import ServiceProcess, spawn_service
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.appwrapper.params import (
    RETRY_LIMIT_ANNOTATION,
)
from shared.bus import Bus, Delivery, default_streams
from shared.config import load_config
from shared.messages import (
    AnyObservation,
    AppWrapperObservation,
    LifecycleEvent,
    Message,
    NodeObservation,
    NodeVerdict,
    ObjectRef,
    PodObservation,
    Verdict,
    decode,
)
from tests.integration.objects import (
    FAST_RESET,
    apply,
    events_of,
    jobs,
    labelled_pods,
    wait_phase,
)
from tests.integration.observe import Observer
from tests.waiting import holds, until, until_sync

pytestmark = pytest.mark.testbed

M = TypeVar("M", bound=Message)
STREAMS = default_streams()

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
TARGETS = ("base", "overlays/local")
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
        *(("Deployment", f"respawn-{s}") for s in SERVICES),
        *(("ServiceAccount", f"respawn-{s}") for s in SERVICES),
        *(("ClusterRoleBinding", f"respawn-{s}") for s in WITH_KUBE),
    }
    assert expected <= names
    namespaced = [d for d in docs if d["kind"] not in CLUSTER_SCOPED]
    assert {d["metadata"].get("namespace") for d in namespaced} == {SYSTEM_NS}


CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


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


@pytest.mark.parametrize("target", TARGETS)
def test_nats_pods_are_hardened_and_get_every_password(
    built: dict[str, list[dict[str, Any]]], target: str
) -> None:
    spec = pod_specs(built[target])["respawn-nats"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["image"].startswith("nats:")
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    secret_env = {e["name"] for e in container["env"] if "secretKeyRef" in (e.get("valueFrom") or {})}
    assert secret_env == {u.password_variable for u in natsauth.default_users()}


@pytest.mark.parametrize("target", TARGETS)
def test_nats_server_accepts_the_generated_configuration(
    built: dict[str, list[dict[str, Any]]], target: str, tmp_path: Path
) -> None:
    files = configmap(built[target], "respawn-nats-config")["data"]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {"POD_NAME": "respawn-nats-0", "PATH": "/usr/bin:/bin"}
    env |= {u.password_variable: natsauth.generate_password() for u in natsauth.default_users()}
    test = [str(find_nats_server()), "-c", str(tmp_path / "nats.conf"), "-t"]
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


def test_dockerfile_builds_one_non_root_image_from_the_package() -> None:
    lines = [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]
    stages = [line for line in lines if line.startswith("FROM ")]
    assert all(s.startswith("FROM python:3.11-slim") for s in stages) and len(stages) == 2
    assert "USER 10001:10001" in lines
    assert any("pip install ." in line for line in lines)
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


@pytest.mark.parametrize("target", TARGETS)
def test_every_manifest_passes_server_side_dry_run(
    testbed: Endpoints, built: dict[str, list[dict[str, Any]]], target: str
) -> None:
    kc = testbed.kubeconfig
    docs = built[target]
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
    rbac = [
        d
        for d in build("base")
        if d["kind"] in ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding")
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
    yield Accounts(kubeconfigs)
    bindings = [d for d in rbac if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
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
    # Client-side validation would list CRDs, which no service may do.
    create = ("create", "--validate=false", "-f", "-", "-o", "json")
    out = kubectl(kubeconfig, *create, stdin=json.dumps(review)).stdout
    return bool(json.loads(out)["status"].get("allowed"))


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


def test_watcher_may_read_what_it_watches_and_nothing_else(
    testbed: Endpoints, accounts: Accounts, namespace: str
) -> None:
    kc = accounts["watcher"]
    for resource in (APPWRAPPERS, "pods", "nodes", *WRAPPED_KINDS):
        for verb in ("get", "list", "watch"):
            assert can_i(kc, verb, resource), f"watcher cannot {verb} {resource}"
    for verb, resource in [
        ("create", APPWRAPPERS),
        ("update", APPWRAPPERS),
        ("patch", APPWRAPPERS),
        ("delete", APPWRAPPERS),
        ("update", f"{APPWRAPPERS}/status"),
        ("delete", "pods"),
        ("create", "jobs.batch"),
        ("delete", "jobs.batch"),
        ("create", "events"),
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
        ("update", APPWRAPPERS),
        ("patch", APPWRAPPERS),
        ("update", f"{APPWRAPPERS}/status"),
        ("update", f"{APPWRAPPERS}/finalizers"),
        ("list", "pods"),
        ("watch", "pods"),
        ("delete", "pods"),
        ("list", "nodes"),
        ("create", "events"),
        *((verb, kind) for kind in (*WRAPPED_KINDS, "pods") for verb in ("create", "get", "delete")),
    ]:
        assert can_i(kc, verb, resource), f"lifecycle cannot {verb} {resource}"
    for verb, resource in [
        ("create", APPWRAPPERS),
        ("delete", APPWRAPPERS),
        ("watch", APPWRAPPERS),
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
    # Real requests, both ways: it creates and deletes a wrapped kind, but cannot edit it.
    kubectl(kc, "create", "job", "probe", "--image=busybox", "-n", namespace)
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


@dataclass
class AuthNats:
    url: str
    passwords: dict[str, str]
    server: NatsServer


@pytest.fixture(scope="module")
def auth_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthNats]:
    """A nats-server started with the committed auth.conf; passwords come from its environment."""
    passwords = {u.name: natsauth.generate_password() for u in natsauth.default_users()}
    with pytest.MonkeyPatch.context() as env:
        for user, password in passwords.items():
            env.setenv(natsauth.password_variable(user), password)
        server = start_nats(tmp_path_factory.mktemp("nats-auth"), config_file=AUTH_CONF)
    try:
        yield AuthNats(server.url, passwords, server)
    finally:
        server.stop()


@dataclass
class Client:
    """A plain nats-py connection as one user, keeping the server's permission errors."""

    nc: Any
    errors: list[str] = field(default_factory=list)

    @property
    def js(self) -> Any:
        return self.nc.jetstream(timeout=2.0)

    def refusals(self) -> str:
        return "\n".join(e for e in self.errors if "permissions violation" in e.lower())

    async def wait_refused(self, what: str, subject: str) -> None:
        await until(
            f"the server to refuse {what} {subject!r} (refusals so far: {self.refusals()})",
            # nats-py lowercases the server's error text, subject included.
            lambda: f'{what} to "{subject}"'.lower() in self.refusals().lower(),
            within=5,
        )


@asynccontextmanager
async def client(auth: AuthNats, user: str, *, inbox_prefix: str | None = None) -> AsyncIterator[Client]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    options: dict[str, Any] = {}
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    nc = await nats.connect(
        auth.url,
        user=user,
        password=auth.passwords[user],
        error_cb=on_error,
        allow_reconnect=False,
        **options,
    )
    try:
        yield Client(nc, errors)
    finally:
        await nc.close()


@asynccontextmanager
async def service_bus(auth: AuthNats, service: str) -> AsyncIterator[Bus]:
    """The bus as the service's runtime opens it (shared/runtime.py), streams set up."""
    bus = await Bus.connect(
        auth.url,
        name=f"respawn-{service}",
        user=service,
        password=auth.passwords[service],
        connect_deadline=10,
    )
    try:
        await bus.ensure_streams()
        yield bus
    finally:
        await bus.close()


def subscriber(auth: AuthNats) -> Any:
    return client(auth, natsauth.SUBSCRIBER, inbox_prefix=natsauth.inbox_prefix(natsauth.SUBSCRIBER))


async def stored(bus: Bus, stream: str, subject: str) -> int:
    """How many messages ``stream`` holds on ``subject``."""
    info = await bus.js.stream_info(stream, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


# Sample messages, each with the subject it is published on and the user that publishes it.


def pod_observation(ns: str, aw: str) -> tuple[str, Message]:
    pod = f"{aw}-0"
    message = PodObservation(
        ref=ObjectRef(namespace=ns, name=pod, uid=unique("uid")), appwrapper=aw, observed_at=now()
    )
    return subjects.appwrapper_obs(ns, aw, "pod", pod), message


def appwrapper_observation(ns: str, aw: str) -> tuple[str, Message]:
    message = AppWrapperObservation(
        ref=ObjectRef(namespace=ns, name=aw, uid=unique("uid")), observed_at=now()
    )
    return subjects.appwrapper_obs(ns, aw, "appwrapper", aw), message


def node_observation(node: str) -> tuple[str, Message]:
    return subjects.node_obs(node), NodeObservation(name=node, observed_at=now(), labels={"a": "b"})


def verdict(ns: str, aw: str) -> tuple[str, Message]:
    message = Verdict(
        ref=ObjectRef(namespace=ns, name=aw, uid=unique("uid")), state="Healthy", decided_at=now()
    )
    return subjects.verdict(ns, aw), message


def node_verdict(resource: str) -> tuple[str, Message]:
    return subjects.node_verdict(resource), NodeVerdict(
        resource=resource, no_schedule=("n1",), decided_at=now()
    )


def lifecycle_event(ns: str, aw: str) -> tuple[str, Message]:
    message = LifecycleEvent(
        ref=ObjectRef(namespace=ns, name=aw, uid=unique("uid")),
        event="PhaseChanged",
        phase="Running",
        at=now(),
    )
    return subjects.lifecycle_event(ns, aw), message


@dataclass(frozen=True)
class Feed:
    """A stream a service consumes: who produces into it, and a sample message."""

    stream: str
    filter_subject: str
    message_cls: type[Message]
    producer: str
    sample: Callable[[], tuple[str, Message]]


OWN_MESSAGE: dict[str, Callable[[], tuple[str, Message]]] = {
    "watcher": lambda: pod_observation(unique("ns"), unique("aw")),
    "health": lambda: verdict(unique("ns"), unique("aw")),
    "lifecycle": lambda: lifecycle_event(unique("ns"), unique("aw")),
    "autopilot": lambda: node_verdict(unique("example.com/res")),
}
FEEDS: dict[str, list[Feed]] = {
    "watcher": [],
    "health": [
        Feed(
            subjects.OBSERVATIONS_STREAM,
            subjects.appwrapper_obs_filter(),
            AnyObservation,
            "watcher",
            lambda: pod_observation(unique("ns"), unique("aw")),
        ),
        Feed(
            subjects.NODE_VERDICTS_STREAM,
            subjects.node_verdict_filter(),
            NodeVerdict,
            "autopilot",
            lambda: node_verdict(unique("example.com/res")),
        ),
    ],
    "lifecycle": [
        Feed(
            subjects.VERDICTS_STREAM,
            subjects.verdict_filter(),
            Verdict,
            "health",
            lambda: verdict(unique("ns"), unique("aw")),
        ),
        Feed(
            subjects.OBSERVATIONS_STREAM,
            subjects.appwrapper_obs_filter(),
            AnyObservation,
            "watcher",
            lambda: appwrapper_observation(unique("ns"), unique("aw")),
        ),
    ],
    "autopilot": [
        Feed(
            subjects.OBSERVATIONS_STREAM,
            subjects.node_obs_filter(),
            NodeObservation,
            "watcher",
            lambda: node_observation(unique("node")),
        )
    ],
}


async def consume_one_and_dead_letter_one(auth: AuthNats, service: str, bus: Bus, feed: Feed) -> None:
    """``service`` consumes a message from ``feed`` (acked) and dead-letters an undecodable one."""
    received: list[str] = []

    async def handler(message: Message, delivery: Delivery) -> None:
        received.append(delivery.subject)

    durable = unique(service)
    consumer = await bus.consume(
        feed.stream,
        durable,
        feed.filter_subject,
        feed.message_cls,
        handler,
        deliver_policy=api.DeliverPolicy.NEW,
        inactive_threshold=60.0,
    )
    await until(f"{service}'s consumer to bind", lambda: consumer.running, within=10)
    dead_letters = subjects.dead_letter(f"respawn-{service}")
    dead_before = await stored(bus, subjects.DEAD_LETTER_STREAM, dead_letters)
    subject, message = feed.sample()
    async with service_bus(auth, feed.producer) as producer:
        await producer.publish(subject, message, msg_id=None)
        await until(f"{service} to receive {subject}", lambda: subject in received, within=10)
        await producer.js.publish(subject, b"\xc1 not msgpack", timeout=5)

    await until(
        f"{service} to dead-letter the undecodable message",
        lambda: stored(bus, subjects.DEAD_LETTER_STREAM, dead_letters),
        done=lambda count: count == dead_before + 1,
        within=10,
    )

    await until(
        f"{service}'s acks to reach the server",
        lambda: bus.js.consumer_info(feed.stream, durable),
        done=lambda info: (
            info.num_pending == 0 and info.num_ack_pending == 0 and info.ack_floor.stream_seq > 0
        ),
        within=10,
    )
    await consumer.stop()


@pytest.mark.parametrize("service", SERVICES)
async def test_each_service_user_can_do_its_job_on_the_bus(auth_nats: AuthNats, service: str) -> None:
    async with service_bus(auth_nats, service) as bus:  # sets up every stream
        subject, message = OWN_MESSAGE[service]()
        published = await bus.publish(subject, message, msg_id=None)
        assert not published.duplicate and published.seq > 0
        for feed in FEEDS[service]:
            await consume_one_and_dead_letter_one(auth_nats, service, bus, feed)
        if service in ("health", "autopilot"):
            # The start-up reads (Bus.replay of the last message per subject): health's of the
            # verdicts, autopilot's of the node verdicts; each deletes its consumer when done.
            stream = subjects.VERDICTS_STREAM if service == "health" else subjects.NODE_VERDICTS_STREAM
            read: list[Message] = []

            async def keep(message: Message, delivery: Delivery) -> None:
                if delivery.subject == subject:
                    read.append(message)

            await bus.replay(
                stream,
                unique(service),
                subject,
                type(message),
                keep,
                last_per_subject=True,
                follow=False,
            )
            assert read == [message]
            # The replay it follows from then on, stopped and deleted at shutdown.
            durable = unique(service)
            observations = await bus.replay(
                subjects.OBSERVATIONS_STREAM,
                durable,
                subjects.node_obs_filter() if service == "autopilot" else subjects.appwrapper_obs_filter(),
                NodeObservation if service == "autopilot" else AnyObservation,
                _ignore,
                fetch_timeout=0.2,
            )
            await asyncio.wait_for(observations.wait_caught_up(), 10)
            await observations.stop()
            with pytest.raises(nats.js.errors.NotFoundError):
                await bus.js.consumer_info(subjects.OBSERVATIONS_STREAM, durable)


async def _ignore(message: Message, delivery: Delivery) -> None:
    return None


MESSAGE_SUBJECTS = {
    "watcher": (subjects.appwrapper_obs("ns", "aw", "pod", "p"), subjects.node_obs("node-1")),
    "health": (subjects.verdict("ns", "aw"),),
    "lifecycle": (subjects.lifecycle_event("ns", "aw"),),
    "autopilot": (subjects.node_verdict("nvidia.com/gpu"),),
}


@pytest.mark.parametrize("service", SERVICES)
async def test_a_service_may_not_publish_another_services_messages(auth_nats: AuthNats, service: str) -> None:
    foreign = [s for owner, subs in MESSAGE_SUBJECTS.items() if owner != service for s in subs]
    foreign += [subjects.dead_letter(f"respawn-{s}") for s in SERVICES if s != service]
    async with client(auth_nats, service) as c, service_bus(auth_nats, "watcher") as reader:
        before = {s: await stored(reader, stream_of(s), s) for s in foreign}
        for subject in foreign:
            await c.nc.publish(subject, b"forged")
            await c.nc.flush()
            await c.wait_refused("publish", subject)
        for subject in foreign:
            assert await stored(reader, stream_of(subject), subject) == before[subject], subject


def stream_of(subject: str) -> str:
    for prefix, stream in (
        (subjects.OBS_PREFIX, subjects.OBSERVATIONS_STREAM),
        (subjects.NODE_VERDICT_PREFIX, subjects.NODE_VERDICTS_STREAM),
        (subjects.VERDICT_PREFIX, subjects.VERDICTS_STREAM),
        (subjects.LIFECYCLE_PREFIX, subjects.LIFECYCLE_STREAM),
        (subjects.DEAD_LETTER_PREFIX, subjects.DEAD_LETTER_STREAM),
    ):
        if subject.startswith(prefix + "."):
            return stream
    raise ValueError(subject)


async def test_a_watchers_verdict_is_refused_and_not_stored(auth_nats: AuthNats) -> None:
    subject, message = verdict(unique("ns"), unique("aw"))
    async with client(auth_nats, "watcher") as watcher, service_bus(auth_nats, "health") as health:
        with pytest.raises((TimeoutError, nats.errors.NoRespondersError)):
            await watcher.js.publish(subject, message.encode(), timeout=1)
        await watcher.wait_refused("publish", subject)
        assert await stored(health, subjects.VERDICTS_STREAM, subject) == 0
        # The same verdict from health is stored: the subject, not the stream, was refused.
        await health.publish(subject, message, msg_id=None)
        assert await stored(health, subjects.VERDICTS_STREAM, subject) == 1


async def test_an_outside_subscriber_reads_the_public_streams(auth_nats: AuthNats) -> None:
    ns, aw = unique("ns"), unique("aw")
    v_subject, v_message = verdict(ns, aw)
    l_subject, l_message = lifecycle_event(ns, aw)
    async with service_bus(auth_nats, "health") as health, service_bus(auth_nats, "lifecycle") as lifecycle:
        await health.publish(v_subject, v_message, msg_id=None)
        await lifecycle.publish(l_subject, l_message, msg_id=None)
    async with subscriber(auth_nats) as sub:
        js = sub.js
        # A durable pull consumer of its own, with explicit acks.
        durable = unique("dashboard")
        psub = await js.pull_subscribe(v_subject, durable=durable, stream=subjects.VERDICTS_STREAM)
        (msg,) = await psub.fetch(1, timeout=5)
        assert decode(Verdict, msg.data) == v_message
        await msg.ack_sync(timeout=5)
        info = await js.consumer_info(subjects.VERDICTS_STREAM, durable)
        assert info.ack_floor.stream_seq == msg.metadata.sequence.stream
        await js.delete_consumer(subjects.VERDICTS_STREAM, durable)
        # An ordered replay of the lifecycle stream, and a direct read of the last verdict.
        osub = await js.subscribe(l_subject, stream=subjects.LIFECYCLE_STREAM, ordered_consumer=True)
        replayed = await osub.next_msg(timeout=5)
        assert decode(LifecycleEvent, replayed.data) == l_message
        await osub.unsubscribe()
        last = await js.get_last_msg(subjects.VERDICTS_STREAM, v_subject)
        assert decode(Verdict, last.data) == v_message
        assert sub.refusals() == ""


async def test_an_outside_subscriber_publishes_nowhere(auth_nats: AuthNats) -> None:
    forbidden = [s for subs in MESSAGE_SUBJECTS.values() for s in subs]
    forbidden += [subjects.dead_letter("respawn-health"), "anything.at.all", "_INBOX.abc"]
    forbidden += [
        f"$JS.API.STREAM.{op}.{stream}"
        for op in ("CREATE", "UPDATE", "DELETE", "PURGE", "MSG.DELETE")
        for stream in (subjects.VERDICTS_STREAM, subjects.LIFECYCLE_STREAM)
    ]
    forbidden += [
        "$JS.API.STREAM.CREATE.MINE",
        f"$JS.API.CONSUMER.CREATE.{subjects.OBSERVATIONS_STREAM}.spy.respawn.obs.v1.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{subjects.OBSERVATIONS_STREAM}.lifecycle-observations",
        f"$JS.ACK.{subjects.OBSERVATIONS_STREAM}.lifecycle-observations.1.1.1.1.0",
    ]
    async with service_bus(auth_nats, "watcher") as reader:
        counts = {s.name: (await reader.js.stream_info(s.name)).state.messages for s in STREAMS}
        async with subscriber(auth_nats) as sub:
            for subject in forbidden:
                await sub.nc.publish(subject, b"{}")
                await sub.nc.flush()
                await sub.wait_refused("publish", subject)
        assert {s.name: (await reader.js.stream_info(s.name)).state.messages for s in STREAMS} == counts


async def test_an_outside_subscriber_cannot_read_the_internal_streams(auth_nats: AuthNats) -> None:
    async with subscriber(auth_nats) as sub:
        with pytest.raises(TimeoutError):
            await sub.js.add_consumer(subjects.OBSERVATIONS_STREAM, api.ConsumerConfig(name="spy"))
        await sub.wait_refused("publish", f"$JS.API.CONSUMER.CREATE.{subjects.OBSERVATIONS_STREAM}.spy")
        # Nor the replies and deliveries of the services, which arrive under _INBOX.
        await sub.nc.subscribe("_INBOX.>")
        await sub.wait_refused("subscription", "_INBOX.>")


async def test_an_outside_subscriber_cannot_write_into_a_stream_through_a_push_consumer(
    auth_nats: AuthNats,
) -> None:
    # A push consumer delivers to any subject that has interest. Were the subscriber allowed to
    # subscribe to a verdict subject, a consumer on the lifecycle stream delivering there would
    # copy lifecycle events into the verdict stream.
    ns, aw = unique("ns"), unique("aw")
    target = subjects.verdict(ns, aw)
    async with subscriber(auth_nats) as sub, service_bus(auth_nats, "lifecycle") as lifecycle:
        await sub.nc.subscribe(target)
        await sub.wait_refused("subscription", target)
        name = unique("relay")
        await sub.js.add_consumer(
            subjects.LIFECYCLE_STREAM,
            api.ConsumerConfig(name=name, deliver_subject=target, ack_policy=api.AckPolicy.NONE),
        )
        subject, message = lifecycle_event(ns, aw)
        await lifecycle.publish(subject, message, msg_id=None)
        # Given time for a delivery, if one were possible, none happens.
        await holds(
            f"nothing delivered to {target}",
            lambda: sub.js.consumer_info(subjects.LIFECYCLE_STREAM, name),
            done=lambda info: info.delivered.stream_seq == 0,
            during=1.0,
        )
        info = await sub.js.consumer_info(subjects.LIFECYCLE_STREAM, name)
        assert info.delivered.stream_seq == 0 and info.num_pending >= 1
        assert await stored(lifecycle, subjects.VERDICTS_STREAM, target) == 0
        await sub.js.delete_consumer(subjects.LIFECYCLE_STREAM, name)


async def test_an_outside_subscriber_needs_its_private_inbox(auth_nats: AuthNats) -> None:
    async with client(auth_nats, natsauth.SUBSCRIBER) as plain:  # default _INBOX prefix
        with pytest.raises(TimeoutError):
            await plain.js.stream_info(subjects.VERDICTS_STREAM)
        assert 'subscription to "_inbox.' in plain.refusals().lower()


async def test_a_wrong_password_is_refused(auth_nats: AuthNats) -> None:
    with pytest.raises(nats.errors.Error) as refused_:
        await nats.connect(
            auth_nats.url,
            user="watcher",
            password="Wrong" + "x" * 30,
            allow_reconnect=False,
            max_reconnect_attempts=0,
        )
    assert "authorization" in str(refused_.value).lower()


# ----------------------------------------------------- the services, least privilege, end to end


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


async def published_for(auth: AuthNats, stream: str, subject: str, cls: type[M]) -> list[M]:
    """Every message on ``subject``, read as the outside subscriber."""
    user = natsauth.SUBSCRIBER
    options = {"user": user, "password": auth.passwords[user], "inbox_prefix": natsauth.inbox_prefix(user)}
    async with Observer(auth.url, **options) as obs:
        return await obs.all(stream, subject, cls)


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
    events = events_of(kc, namespace, "doomed")
    reasons = {e["reason"] for e in events if e.get("source", {}).get("component") == "respawn-lifecycle"}
    assert {"Resetting", "Failed"} <= reasons, reasons
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

        async with service_bus(stack.auth, "autopilot") as autopilot:
            await autopilot.replay(
                subjects.NODE_VERDICTS_STREAM,
                unique("autopilot"),
                subject,
                NodeVerdict,
                keep,
                last_per_subject=True,
                follow=False,
            )
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
