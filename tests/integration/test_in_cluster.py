"""Respawn as pods of its own image on the testbed's real node, deployed from ``deploy/``.

One testbed with a real node and two kwok nodes, Respawn applied from deploy/overlays/testbed by
``respawn local deploy`` (the NATS StatefulSet, the four services and the webhook, each pod with
its own ServiceAccount token projected by the real kubelet and its own NATS user), no Respawn
process outside the cluster. Then:

- every component runs from the built images on the real node, as the manifests say: not as
  root, on a read-only root filesystem (read from the containers' processes on this machine);
- each ServiceAccount's token, read inside its pod, is refused by the API server what its
  service must not do, and allowed what it must;
- the fault scenarios with their workloads on the kwok nodes: a failed pod is reset and the
  AppWrapper Succeeds; an EVICT label on a node migrates the workload; a retry limit ends Failed;
- real workloads on the real node: a wrapped Job whose container runs ``sleep 5; exit 1`` fails
  there with exit code 1, is reset and ends Failed at its retry limit; one that exits 0 Succeeds;
- readiness gates traffic: while NATS is down the services are not Ready, and they are Ready
  again only once they serve again;
- deleted service pods are replaced by their Deployments and no verdict is lost; a rolling update of
  lifecycle to a new image tag, during faults, loses nothing.

Needs root (containerd and the kubelet); the first run builds the images if they are not cached.
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import binaries, incluster, manifests, realnode, sim
from respawn.testbed.cluster import kubectl
from shared.appwrapper.model import read_appwrapper
from tests.integration import cli
from tests.integration.objects import FAST_RESET, apply, get_appwrapper, running_pods, wait_phase
from tests.integration.realnode_marks import REAL_NODE
from tests.waiting import until, until_sync

pytestmark = REAL_NODE

respawn = functools.partial(cli.respawn, timeout=600)
NS = incluster.NAMESPACE
NODE = realnode.NODE_NAME
HEALTH_LABEL = "autopilot.ibm.com/gpuhealth"
SERVICES = ("watcher", "health", "lifecycle", "autopilot")
# What the manifests run their containers as (deploy/base/services, deploy/nats).
SERVICE_UID, NATS_UID = 10001, 1000


@dataclass(frozen=True)
class Cluster:
    state_dir: Path
    kubeconfig: Path
    deploy: dict[str, Any]
    up_seconds: float
    deploy_seconds: float


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = (tmp_path_factory.mktemp("ic") / "tb").resolve()
    started = time.monotonic()
    up = respawn(
        "local", "up", "--state-dir", str(state_dir), "--nodes", "2", "--no-services", "--real-node", "--json"
    )
    up_seconds = time.monotonic() - started
    try:
        assert up.returncode == 0, up.stderr
        kubeconfig = Path(json.loads(up.stdout)["kubeconfig"])
        started = time.monotonic()
        deployed = respawn("local", "deploy", "--state-dir", str(state_dir), "--json")
        assert deployed.returncode == 0, deployed.stderr
        yield Cluster(
            state_dir, kubeconfig, json.loads(deployed.stdout), up_seconds, time.monotonic() - started
        )
    finally:
        down = respawn("local", "down", "--state-dir", str(state_dir))
        assert down.returncode == 0, down.stderr


def get(kc: Path, *args: str) -> Any:
    return sim.get_json(kc, *args)


def pods_of(kc: Path, component: str) -> list[dict[str, Any]]:
    """The running (not terminating) pods of one Respawn component."""
    items = get(kc, "pods", "-n", NS, "-l", f"app.kubernetes.io/component={component}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return conditions.get("Ready") == "True"


def crictl(state_dir: Path, *args: str) -> str:
    socket = f"unix://{realnode.Layout(state_dir).socket}"
    proc = subprocess.run(
        [str(binaries.bin_dir() / "crictl"), "--runtime-endpoint", socket, "--image-endpoint", socket, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def container_pid(state_dir: Path, pod: dict[str, Any], container: str) -> int:
    """The host pid of a pod's container's first process, as containerd reports it."""
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == container]
    container_id = status["containerID"].removeprefix("containerd://")
    return int(json.loads(crictl(state_dir, "inspect", container_id))["info"]["pid"])


def uids(pid: int) -> tuple[int, int]:
    """(real uid, real gid) of a process."""
    fields = {
        line.split(":", 1)[0]: line.split(":", 1)[1].split()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if ":" in line
    }
    return int(fields["Uid"][0]), int(fields["Gid"][0])


def root_mount_options(pid: int) -> set[str]:
    """The mount options of a process's root filesystem, as it sees it."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return set(fields[5].split(","))
    raise AssertionError(f"no root mount in /proc/{pid}/mountinfo")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = unique("ic")
    kubectl(cluster.kubeconfig, "create", "namespace", name)
    yield name
    kubectl(cluster.kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


# ------------------------------------------------------------------ what runs, and as whom


def test_every_component_runs_from_the_built_images_on_the_real_node(cluster: Cluster) -> None:
    kc = cluster.kubeconfig
    images = cluster.deploy["images"]
    for component in (*SERVICES, "webhook", "nats"):
        (pod,) = pods_of(kc, component)
        assert pod["spec"]["nodeName"] == NODE, component
        assert ready(pod), (component, pod["status"])
        (status,) = pod["status"]["containerStatuses"]
        built = images["respawn-nats" if component == "nats" else "respawn"]
        # The image the kubelet runs is the one build.sh made (its id is the config's digest).
        assert (
            status["imageID"].endswith(built["digest"].removeprefix("sha256:"))
            or status["imageID"] == built["digest"]
        ), (component, status["imageID"], built)
        # The pod's container is the component itself, in containerd's cgroup of the node.
        pid = container_pid(cluster.state_dir, pod, status["name"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        want = b"nats-server" if component == "nats" else f"services.{component}".encode()
        assert any(want in arg for arg in cmdline), (component, cmdline)
        assert realnode.Layout(cluster.state_dir).cgroup_root in Path(f"/proc/{pid}/cgroup").read_text()


def test_containers_run_as_non_root_on_read_only_root_filesystems(cluster: Cluster) -> None:
    kc = cluster.kubeconfig
    for component in (*SERVICES, "webhook", "nats"):
        (pod,) = pods_of(kc, component)
        container = pod["spec"]["containers"][0]["name"]
        pid = container_pid(cluster.state_dir, pod, container)
        want = (NATS_UID, NATS_UID) if component == "nats" else (SERVICE_UID, SERVICE_UID)
        assert uids(pid) == want, component
        assert "ro" in root_mount_options(pid), component


# Health and autopilot need no Kubernetes access: their pods get no token at all.
NO_TOKEN = ("health", "autopilot")
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def read_in_pod(kc: Path, component: str, path: str) -> subprocess.CompletedProcess[str]:
    (pod,) = pods_of(kc, component)
    script = f"print(open({path!r}).read())"
    return kubectl(kc, "exec", "-n", NS, pod["metadata"]["name"], "--", "python", "-c", script, check=False)


def token_of(kc: Path, component: str) -> str:
    """The ServiceAccount token the real kubelet projected into the component's pod; for the
    services whose pods get none, one requested for their ServiceAccount (TokenRequest)."""
    if component in NO_TOKEN:
        assert "No such file" in read_in_pod(kc, component, TOKEN_PATH).stderr
        return kubectl(kc, "create", "token", f"respawn-{component}", "-n", NS).stdout.strip()
    read = read_in_pod(kc, component, TOKEN_PATH)
    assert read.returncode == 0, read.stderr
    return read.stdout.strip()


def as_token(kc: Path, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A kubectl request with only ``token`` for credentials (the admin's client cert dropped)."""
    config = json.loads(kubectl(kc, "config", "view", "--raw", "-o", "json").stdout)
    server = config["clusters"][0]["cluster"]["server"]
    ca = config["clusters"][0]["cluster"]["certificate-authority"]
    return kubectl(
        Path("/dev/null"),
        f"--server={server}",
        f"--certificate-authority={ca}",
        f"--token={token}",
        *args,
        check=False,
    )


# (component, a request it must be refused, a request it must be allowed or None)
REFUSALS = (
    ("watcher", ("create", "configmap", "x", "-n", "default"), ("get", "appwrappers", "-A")),
    ("watcher", ("get", "secrets", "-n", NS), None),
    ("health", ("get", "pods", "-A"), None),
    ("autopilot", ("get", "pods", "-A"), None),
    ("lifecycle", ("get", "secrets", "-n", NS), ("get", "appwrappers", "-A")),
    ("lifecycle", ("delete", "node", NODE), None),
    ("webhook", ("get", "secrets", "-n", "default"), None),
)


@pytest.mark.parametrize(("component", "refused", "allowed"), REFUSALS)
def test_each_pods_own_token_is_refused_what_its_service_must_not_do(
    cluster: Cluster, component: str, refused: tuple[str, ...], allowed: tuple[str, ...] | None
) -> None:
    kc = cluster.kubeconfig
    token = token_of(kc, component)
    denied = as_token(kc, token, *refused)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    assert f"system:serviceaccount:{NS}:respawn-{component}" in denied.stderr
    if allowed is not None:
        ok = as_token(kc, token, *allowed)
        assert ok.returncode == 0, ok.stderr


# ------------------------------------------------------------------ faults, kwok's nodes


async def running_pod(kc: Path, namespace: str, name: str, *, other_than: str = "") -> dict[str, Any]:
    pods = await until(
        f"a running pod of {name}",
        lambda: [p for p in running_pods(kc, namespace, name) if p["metadata"]["uid"] != other_than],
        within=90,
    )
    return pods[0]


async def resets(kc: Path, namespace: str, name: str, count: int, *, within: float = 90) -> dict[str, Any]:
    found = await until(
        f"{namespace}/{name} reset {count} time(s)",
        lambda: get_appwrapper(kc, namespace, name),
        done=lambda aw: read_appwrapper(aw).resetting_count >= count,
        within=within,
    )
    assert found is not None
    return found


def short_job(name: str, **kwargs: Any) -> dict[str, Any]:
    """An AppWrapper whose pod (kwok's) runs until it is failed or succeeded by the test."""
    return manifests.job_appwrapper(
        name, annotations={**FAST_RESET, **kwargs.pop("annotations", {})}, **kwargs
    )


async def test_a_failed_pod_is_reset_and_the_appwrapper_succeeds(cluster: Cluster, ns: str) -> None:
    kc = cluster.kubeconfig
    # The recreated pod completes on its own (kwok's simulation); the first is failed long before.
    apply(kc, ns, short_job("reset", pod_annotations={sim.SUCCEED_AFTER: "20s"}))
    pod = await running_pod(kc, ns, "reset")
    assert pod["spec"]["nodeName"] != NODE, "workloads that do not tolerate the real node go to kwok's"
    sim.fail_pod(kc, ns, pod["metadata"]["name"], exit_code=1)
    await resets(kc, ns, "reset", 1)
    await running_pod(kc, ns, "reset", other_than=pod["metadata"]["uid"])
    final = read_appwrapper(await wait_phase(kc, ns, "reset", "Succeeded", within=60))
    assert final.resetting_count == 1


async def test_an_evict_label_migrates_the_workload_off_the_node(cluster: Cluster, ns: str) -> None:
    kc = cluster.kubeconfig
    # 8 GPUs fill a kwok node: the new pod must land on the other one.
    apply(kc, ns, manifests.job_appwrapper("mig", gpus=8, annotations=FAST_RESET))
    pod = await running_pod(kc, ns, "mig")
    node = pod["spec"]["nodeName"]
    try:
        sim.label_node(kc, node, HEALTH_LABEL, "EVICT")
        new = await running_pod(kc, ns, "mig", other_than=pod["metadata"]["uid"])
        assert new["spec"]["nodeName"] not in (node, NODE)
        aw = read_appwrapper(get_appwrapper(kc, ns, "mig") or {})
        assert aw.resetting_count == 0, "a migration off an EVICT node is not a retry"
    finally:
        sim.label_node(kc, node, HEALTH_LABEL, None)


async def test_the_retry_limit_ends_the_appwrapper_failed(cluster: Cluster, ns: str) -> None:
    kc = cluster.kubeconfig
    apply(kc, ns, short_job("limit", annotations=manifests.fault_tolerance(retry_limit=1)))
    pod = await running_pod(kc, ns, "limit")
    sim.fail_pod(kc, ns, pod["metadata"]["name"], exit_code=1)
    await resets(kc, ns, "limit", 1)
    pod = await running_pod(kc, ns, "limit", other_than=pod["metadata"]["uid"])
    sim.fail_pod(kc, ns, pod["metadata"]["name"], exit_code=1)
    final = read_appwrapper(await wait_phase(kc, ns, "limit", "Failed", within=60))
    assert final.resetting_count == 1


# ------------------------------------------------------------------ real workloads, the real node


def real_job(name: str, script: str, *, retry_limit: int) -> dict[str, Any]:
    """An AppWrapper of one Job whose busybox container runs ``sh -c script`` on the real node."""
    template = manifests.pod_template(image="busybox:1.36")
    spec = template["spec"]
    spec["containers"][0] |= {"command": ["sh", "-c", script], "imagePullPolicy": "IfNotPresent"}
    spec["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    spec["tolerations"] = [{"key": realnode.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    spec["terminationGracePeriodSeconds"] = 1
    job = manifests.job(f"{name}-job", pods=1, backoffLimit=0, template=template)
    annotations = {**FAST_RESET, **manifests.fault_tolerance(retry_limit=retry_limit)}
    # There is one real node: excluding the node of a failed pod on retry would leave the next
    # attempt nowhere to run.
    annotations["respawn.dev/node-exclusion"] = "false"
    return manifests.appwrapper(name, manifests.component(job), annotations=annotations)


def terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return statuses[0].get("state", {}).get("terminated") if statuses else None


async def test_a_real_container_that_exits_1_is_reset_until_its_retry_limit_and_fails(
    cluster: Cluster, ns: str
) -> None:
    kc = cluster.kubeconfig
    apply(kc, ns, real_job("crash", "sleep 5; exit 1", retry_limit=1))
    seen: dict[str, dict[str, Any]] = {}

    def record() -> dict[str, Any] | None:
        for pod in get(kc, "pods", "-n", ns)["items"]:
            if (done := terminated(pod)) is not None:
                seen[pod["metadata"]["uid"]] = {"node": pod["spec"]["nodeName"], **done}
        return get_appwrapper(kc, ns, "crash")

    final = await until(
        "crash to end Failed",
        record,
        done=lambda aw: read_appwrapper(aw).phase == "Failed",
        within=120,
    )
    assert read_appwrapper(final).resetting_count == 1
    # Both attempts ran for real on the real node and exited 1 there.
    assert len(seen) == 2, seen
    for attempt in seen.values():
        assert attempt["node"] == NODE and attempt["exitCode"] == 1, attempt


async def test_a_real_container_that_exits_0_succeeds(cluster: Cluster, ns: str) -> None:
    kc = cluster.kubeconfig
    apply(kc, ns, real_job("ok", "sleep 1; exit 0", retry_limit=1))
    final = read_appwrapper(await wait_phase(kc, ns, "ok", "Succeeded", within=90))
    assert final.resetting_count == 0
    (pod,) = get(kc, "pods", "-n", ns)["items"]
    assert pod["spec"]["nodeName"] == NODE
    assert (terminated(pod) or {}).get("exitCode") == 0


# ------------------------------------------------------------------ probes, pod loss, rollout


def services_ready(kc: Path) -> dict[str, bool]:
    return {s: all(ready(p) for p in pods_of(kc, s)) and bool(pods_of(kc, s)) for s in SERVICES}


def scale_nats(kc: Path, replicas: int) -> None:
    kubectl(kc, "scale", "statefulset", incluster.NATS_STATEFULSET, "-n", NS, f"--replicas={replicas}")


def test_readiness_follows_the_services_ability_to_serve(cluster: Cluster) -> None:
    """No NATS, no Ready service (its consumers are not bound); NATS back, all Ready again."""
    kc = cluster.kubeconfig
    assert all(services_ready(kc).values())
    scale_nats(kc, 0)
    try:
        until_sync(
            "every service not Ready while NATS is gone",
            lambda: services_ready(kc),
            done=lambda r: not any(r.values()),
            within=120,
            every=1,
        )
        # Not Ready is not dead: liveness does not depend on NATS, so no container restarted.
        for service in SERVICES:
            (pod,) = pods_of(kc, service)
            assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, service
    finally:
        scale_nats(kc, 1)
    until_sync(
        "every service Ready again", lambda: services_ready(kc), done=lambda r: all(r.values()), within=180
    )
    incluster.wait_ready(kc, timeout=120)


async def fail_each(kc: Path, ns: str, names: list[str]) -> None:
    for name in names:
        pod = await running_pod(kc, ns, name)
        sim.fail_pod(kc, ns, pod["metadata"]["name"], exit_code=1)


async def all_reset_and_succeeded(kc: Path, ns: str, names: list[str]) -> None:
    for name in names:
        final = read_appwrapper(await wait_phase(kc, ns, name, "Succeeded", within=180))
        assert final.resetting_count == 1, (name, final)


async def test_deleted_service_pods_are_replaced_and_no_verdict_is_lost(cluster: Cluster, ns: str) -> None:
    """The watcher's, health's and lifecycle's pods deleted at once, faults injected meanwhile:
    each Deployment starts a new pod, and every fault is still reset exactly once."""
    kc = cluster.kubeconfig
    names = [f"del-{i}" for i in range(3)]
    for name in names:
        apply(kc, ns, short_job(name, pod_annotations={sim.SUCCEED_AFTER: "25s"}))
    for name in names:
        await running_pod(kc, ns, name)
    deleted = {}
    for service in ("watcher", "health", "lifecycle"):
        (old,) = pods_of(kc, service)
        deleted[service] = old["metadata"]["uid"]
        kubectl(kc, "delete", "pod", old["metadata"]["name"], "-n", NS, "--wait=false")
    # The faults happen while the services are going or gone.
    await fail_each(kc, ns, names)

    def replaced() -> dict[str, bool]:
        return {
            service: any(p["metadata"]["uid"] != uid and ready(p) for p in pods_of(kc, service))
            for service, uid in deleted.items()
        }

    await until("a new Ready pod of each deleted one", replaced, done=lambda r: all(r.values()), within=180)
    await all_reset_and_succeeded(kc, ns, names)


async def test_a_rolling_update_of_lifecycle_during_faults_loses_nothing(cluster: Cluster, ns: str) -> None:
    kc = cluster.kubeconfig
    image = cluster.deploy["images"]["respawn"]["name"]
    new_image = f"{image}-next"
    realnode.tag_image(cluster.state_dir, image, new_image)
    names = [f"roll-{i}" for i in range(4)]
    for name in names:
        apply(kc, ns, short_job(name, pod_annotations={sim.SUCCEED_AFTER: "40s"}))
    for name in names:
        await running_pod(kc, ns, name)
    (old,) = pods_of(kc, "lifecycle")
    kubectl(kc, "set", "image", "deployment/respawn-lifecycle", f"lifecycle={new_image}", "-n", NS)
    # Half the faults before the new pod is up, half while it starts.
    await fail_each(kc, ns, names[:2])
    await until(
        "the old lifecycle pod gone",
        lambda: all(p["metadata"]["uid"] != old["metadata"]["uid"] for p in pods_of(kc, "lifecycle")),
        within=120,
    )
    await fail_each(kc, ns, names[2:])
    await asyncio.to_thread(incluster.wait_ready, kc, timeout=180)
    (new,) = pods_of(kc, "lifecycle")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["spec"]["containers"][0]["image"] == new_image
    # The new tag names the same built image (containerd reports it under its first name).
    assert new["status"]["containerStatuses"][0]["imageID"].endswith(
        cluster.deploy["images"]["respawn"]["digest"].removeprefix("sha256:")
    )
    await all_reset_and_succeeded(kc, ns, names)
