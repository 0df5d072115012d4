"""Kueue drives Respawn: the MLBatch flow end to end, with a real Kueue on the testbed.

Kueue (``respawn.testbed.kueue``: MLBatch's configuration, its real webhooks) admits, queues and
preempts AppWrappers in namespaces labelled ``respawn.dev/kueue=true``; watcher, health and
lifecycle run as separate processes. Each test gets its own namespace with a ResourceFlavor,
ClusterQueue and LocalQueue (``kueue/queues.yaml``) and follows the AppWrappers, Kueue's
Workloads and the ClusterQueue's usage through the API server.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import pytest
import yaml

from respawn.testbed import kueue, manifests, pki, sim
from respawn.testbed.cluster import State, _http_ok, kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.ports import free_port
from respawn.testbed.process import start, stop_pid, wait_until
from shared.appwrapper.constants import QUEUE_NAME_LABEL
from shared.appwrapper.model import read_appwrapper
from tests.integration.cli import respawn as respawn_cli
from tests.integration.conftest import services_on
from tests.integration.objects import (
    FAST_RESET,
    events_when,
    get_appwrapper,
    labelled_pods,
    running_pods,
    wait_phase,
)
from tests.waiting import holds, until

pytestmark = pytest.mark.testbed

HERE = Path(__file__).resolve().parent
QUEUES = HERE / "kueue" / "queues.yaml"
REPO = HERE.parents[1]
QUEUE = "user-queue"
GPUS = 8
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Kueue's timeout for the waitForPodsReady tests: long enough for a healthy workload's pods to be
# Ready on kwok, short enough to keep the tests quick.
PODS_READY_TIMEOUT = 10.0


# ---------------------------------------------------------------------------------------------
# Fixtures


def _state(testbed: Endpoints) -> State:
    if testbed.mode != "local" or testbed.state_dir is None:
        pytest.skip("Kueue runs as a process of the local testbed only (RESPAWN_TESTBED=local)")
    state = State.load(testbed.state_dir)
    assert state is not None, f"no testbed state in {testbed.state_dir}"
    return state


@pytest.fixture(scope="module")
def kueue_state(testbed: Endpoints, appwrapper_crd: Path) -> Iterator[State]:
    """Kueue with MLBatch's configuration, for this module; stopped (its webhooks removed) after."""
    state = _state(testbed)
    kueue.up(state, restart=True)
    try:
        yield state
    finally:
        kueue.stop(state)


@pytest.fixture(scope="module")
def respawn_services(
    testbed: Endpoints, kueue_state: State, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    with services_on(
        testbed.kubeconfig, testbed.nats_url, tmp_path_factory.mktemp("kueue-services") / "logs"
    ) as start_service:
        for name in ("watcher", "health", "lifecycle"):
            start_service(name)
        yield


@dataclass(frozen=True)
class Queues:
    namespace: str
    cluster_queue: str
    flavor: str


def _create_queues(kubeconfig: Path, namespace: str, *, gpus: int = GPUS) -> Queues:
    """The namespace put in Kueue's reach, with its flavor, ClusterQueue and LocalQueue."""
    kubectl(kubeconfig, "label", "namespace", namespace, f"{kueue.NAMESPACE_LABEL}=true")
    text = Template(QUEUES.read_text()).substitute(namespace=namespace, gpus=gpus, queue=QUEUE)
    kubectl(kubeconfig, "apply", "-f", "-", stdin=text)
    return Queues(namespace, cluster_queue=namespace, flavor=f"{namespace}-gpu")


@pytest.fixture
def queues(testbed: Endpoints, namespace: str, respawn_services: None) -> Iterator[Queues]:
    q = _create_queues(testbed.kubeconfig, namespace)
    yield q
    for kind, name in (("clusterqueue", q.cluster_queue), ("resourceflavor", q.flavor)):
        kubectl(testbed.kubeconfig, "delete", kind, name, "--wait=false", check=False)


def test_local_up_kueue_adds_kueue_to_a_running_testbed(kueue_state: State) -> None:
    kueue.stop(kueue_state)
    assert not kueue.running(kueue_state)
    proc = respawn_cli(
        "local",
        "up",
        "--state-dir",
        str(kueue_state.state_dir),
        "--no-services",
        "--kueue",
        "--json",
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kueue"] is True
    assert kueue.running(kueue_state)
    port = kueue_state.ports["kueue-health"]
    assert _http_ok(f"http://127.0.0.1:{port}/readyz")
    # Its webhooks are registered, pointing at the process.
    hooks = sim.get_json(kueue_state.kubeconfig, "mutatingwebhookconfiguration", kueue.MUTATING)["webhooks"]
    urls = {h["name"]: h["clientConfig"]["url"] for h in hooks}
    webhook_port = kueue_state.ports["kueue-webhook"]
    assert urls["mappwrapper.kb.io"] == (
        f"https://127.0.0.1:{webhook_port}/mutate-workload-codeflare-dev-v1beta2-appwrapper"
    )
    assert "mjob.kb.io" not in urls  # only Kueue's own kinds and AppWrappers


# ---------------------------------------------------------------------------------------------
# Reading Kueue's side


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            found: dict[str, Any] = c
            return found
    return {}


def is_true(obj: dict[str, Any] | None, ctype: str) -> bool:
    return condition(obj, ctype).get("status") == "True"


def workload_of(kubeconfig: Path, namespace: str, appwrapper: str) -> dict[str, Any] | None:
    """Kueue's Workload of the AppWrapper (its owner), None while there is none."""
    items = sim.get_json(kubeconfig, "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
    for wl in items:
        if any(
            o.get("kind") == "AppWrapper" and o.get("name") == appwrapper
            for o in wl["metadata"].get("ownerReferences") or []
        ):
            found: dict[str, Any] = wl
            return found
    return None


def gpus_reserved(kubeconfig: Path, cluster_queue: str) -> int:
    """The nvidia.com/gpu the ClusterQueue has reserved for admitted workloads."""
    cq = sim.get_json(kubeconfig, "clusterqueue", cluster_queue)
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
        for res in flavor.get("resources") or []:
            if res["name"] == "nvidia.com/gpu":
                return int(res.get("total", "0"))
    return 0


def holds_quota(wl: dict[str, Any] | None) -> bool:
    """Whether Kueue counts the Workload's quota: reserved, and not finished."""
    return is_true(wl, "QuotaReserved") and not is_true(wl, "Finished")


async def until_reserved(kubeconfig: Path, cluster_queue: str, gpus: int) -> None:
    """The ClusterQueue's status (written by Kueue a moment after its decisions) showing ``gpus``."""
    await until(
        f"ClusterQueue {cluster_queue} to show {gpus} GPUs reserved",
        lambda: gpus_reserved(kubeconfig, cluster_queue),
        done=lambda n: n == gpus,
        within=20,
    )


def queued_aw(
    name: str,
    *,
    pods: int = 1,
    gpus: int = 2,
    pod_annotations: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    queue: str | None = QUEUE,
) -> dict[str, Any]:
    """An AppWrapper of one Job, submitted as a user does: no spec.suspend, a queue label."""
    aw = manifests.job_appwrapper(
        name, pods=pods, gpus=gpus, pod_annotations=pod_annotations, annotations=annotations
    )
    aw["spec"].pop("suspend", None)
    aw["metadata"]["labels"] = {**({QUEUE_NAME_LABEL: queue} if queue else {}), **(labels or {})}
    return aw


def create(kubeconfig: Path, namespace: str, aw: dict[str, Any]) -> dict[str, Any]:
    """Create through the API server's admission chain; the object as stored."""
    out = kubectl(kubeconfig, "create", "-n", namespace, "-o", "json", "-f", "-", stdin=json.dumps(aw)).stdout
    stored: dict[str, Any] = json.loads(out)
    return stored


def aw_now(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    aw = get_appwrapper(kubeconfig, namespace, name)
    assert aw is not None, f"AppWrapper {namespace}/{name} is gone"
    return aw


async def wait_admitted(kubeconfig: Path, namespace: str, name: str, *, within: float = 30) -> dict[str, Any]:
    found: dict[str, Any] = await until(
        f"Kueue to admit {namespace}/{name}",
        lambda: workload_of(kubeconfig, namespace, name),
        done=lambda wl: is_true(wl, "QuotaReserved") and is_true(wl, "Admitted"),
        within=within,
    )
    return found


def resetting_count(aw: dict[str, Any]) -> int:
    return int((aw.get("status") or {}).get("resettingCount") or 0)


# ---------------------------------------------------------------------------------------------
# Admission, running, success


async def test_a_queued_appwrapper_is_created_suspended_admitted_with_its_flavor_and_frees_quota_when_done(
    testbed: Endpoints, queues: Queues
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    stored = create(kc, ns, queued_aw("train", pods=2, gpus=2, pod_annotations={sim.SUCCEED_AFTER: "6s"}))
    # Kueue's mutating webhook suspends it on creation, before Respawn could deploy anything.
    assert stored["spec"]["suspend"] is True

    wl = await wait_admitted(kc, ns, "train")
    assert wl["spec"]["queueName"] == QUEUE
    aw = await wait_phase(kc, ns, "train", "Running")
    assert aw["spec"].get("suspend") is not True
    # podSetInfos from the flavor: Kueue wrote them, Respawn put them on the pod template it created.
    info = aw["spec"]["components"][0]["podSetInfos"][0]
    assert info["nodeSelector"] == {"type": "kwok"}
    toleration = {"key": "respawn.dev/kueue-flavor", "operator": "Equal", "value": ns, "effect": "NoSchedule"}
    assert toleration in info["tolerations"]
    job = sim.get_json(kc, "jobs", "-n", ns)["items"][0]
    assert job["spec"]["template"]["spec"]["nodeSelector"]["type"] == "kwok"
    assert toleration in job["spec"]["template"]["spec"]["tolerations"]
    pods = labelled_pods(kc, ns, "train")
    assert len(pods) == 2
    assert all(
        toleration in p["spec"]["tolerations"] and p["spec"]["nodeSelector"]["type"] == "kwok" for p in pods
    )
    await until_reserved(kc, queues.cluster_queue, 4)

    # The quota stays reserved for as long as the AppWrapper has not finished ...
    samples: list[tuple[str, bool]] = []

    def sample() -> tuple[str, bool]:
        # The Workload first: the AppWrapper's phase, read after, is at least as far along.
        held = holds_quota(workload_of(kc, ns, "train"))
        samples.append((read_appwrapper(aw_now(kc, ns, "train")).phase, held))
        return samples[-1]

    await until("train to succeed and its quota to be released", sample, done=lambda s: not s[1], within=40)
    early = [s for s in samples if s[0] != "Succeeded"]
    assert early and all(held for _, held in early), samples
    # ... and Kueue releases it when the AppWrapper reports Succeeded: its pods have completed.
    assert read_appwrapper(aw_now(kc, ns, "train")).phase == "Succeeded"
    assert is_true(workload_of(kc, ns, "train"), "Finished")
    await until_reserved(kc, queues.cluster_queue, 0)


async def test_the_second_of_two_appwrappers_over_quota_waits_suspended_then_runs_when_the_first_finishes(
    testbed: Endpoints, queues: Queues
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    create(kc, ns, queued_aw("first", gpus=6, pod_annotations={sim.SUCCEED_AFTER: "8s"}))
    await wait_phase(kc, ns, "first", "Running")
    create(kc, ns, queued_aw("second", gpus=6))

    def second_waits() -> bool:
        aw = aw_now(kc, ns, "second")
        wl = workload_of(kc, ns, "second")
        return (
            aw["spec"].get("suspend") is True
            and read_appwrapper(aw).phase == "Suspended"
            and not is_true(wl, "QuotaReserved")
            and not labelled_pods(kc, ns, "second")
            and read_appwrapper(aw_now(kc, ns, "first")).phase == "Running"
        )

    await until("second to be held back while first runs", second_waits, within=15)
    await holds("second stays suspended while first runs", second_waits, during=3)

    await wait_phase(kc, ns, "first", "Succeeded", within=30)
    await wait_admitted(kc, ns, "second")
    aw = await wait_phase(kc, ns, "second", "Running")
    assert aw["spec"].get("suspend") is not True
    await until_reserved(kc, queues.cluster_queue, 6)


async def test_a_pytorchjobs_pod_sets_pair_with_kueues_by_position_whatever_the_replica_order(
    testbed: Endpoints, queues: Queues
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    template = manifests.pod_template(container="pytorch", restart_policy=None, gpus=1)
    # Worker before Master in the object: both Kueue and Respawn take Master as pod set 0.
    job = manifests.pytorchjob("ddp-job", replicas={"Worker": 2, "Master": 1}, template=template)
    aw = manifests.appwrapper("ddp", manifests.component(job), labels={QUEUE_NAME_LABEL: QUEUE})
    create(kc, ns, aw)
    wl = await wait_admitted(kc, ns, "ddp")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [("ddp-0", 1), ("ddp-1", 2)]
    await wait_phase(kc, ns, "ddp", "Running")
    created = sim.get_json(kc, "pytorchjobs", "ddp-job", "-n", ns)
    for role, podset in (("Master", "ddp-0"), ("Worker", "ddp-1")):
        spec = created["spec"]["pytorchReplicaSpecs"][role]["template"]
        assert spec["metadata"]["labels"]["kueue.x-k8s.io/podset"] == podset, role
        assert spec["spec"]["nodeSelector"]["type"] == "kwok", role
    await until_reserved(kc, queues.cluster_queue, 3)


# ---------------------------------------------------------------------------------------------
# Resets and failure


async def test_a_reset_keeps_the_workload_admitted_and_the_appwrapper_unsuspended_throughout(
    testbed: Endpoints, queues: Queues
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    create(
        kc,
        ns,
        queued_aw(
            "flaky",
            pods=2,
            gpus=2,
            annotations={**FAST_RESET, "workload.codeflare.dev.appwrapper/retryLimit": "3"},
        ),
    )
    await wait_admitted(kc, ns, "flaky")
    await wait_phase(kc, ns, "flaky", "Running")
    wl = workload_of(kc, ns, "flaky")
    assert wl is not None
    wl_uid = wl["metadata"]["uid"]
    pod = labelled_pods(kc, ns, "flaky")[0]["metadata"]["name"]
    sim.fail_pod(kc, ns, pod, exit_code=1)

    samples: list[dict[str, Any]] = []

    def sample() -> dict[str, Any]:
        aw = aw_now(kc, ns, "flaky")
        wl = workload_of(kc, ns, "flaky")
        s = {
            "phase": read_appwrapper(aw).phase,
            "resets": resetting_count(aw),
            "suspend": aw["spec"].get("suspend") is True,
            "admitted": is_true(wl, "Admitted") and is_true(wl, "QuotaReserved"),
            "workload": (wl or {}).get("metadata", {}).get("uid"),
            "held": holds_quota(wl),
        }
        samples.append(s)
        return s

    await until(
        "flaky to be reset and running again",
        sample,
        done=lambda s: (
            s["resets"] == 1 and s["phase"] == "Running" and len(running_pods(kc, ns, "flaky")) == 2
        ),
        within=40,
    )
    assert all(
        s["admitted"] and not s["suspend"] and s["workload"] == wl_uid and s["held"] for s in samples
    ), samples


async def test_a_workload_at_its_retry_limit_releases_its_quota_only_once_every_resource_is_gone(
    testbed: Endpoints, queues: Queues
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    # The surviving pod's graceful deletion never completes: Respawn needs its forceful deletion
    # (after 5 s), so the window between Failed and "everything gone" is wide enough to watch.
    annotations = {**FAST_RESET, "workload.codeflare.dev.appwrapper/retryLimit": "0"}
    create(
        kc,
        ns,
        queued_aw(
            "doomed", pods=2, gpus=1, annotations=annotations, pod_annotations={sim.STUCK_TERMINATING: "true"}
        ),
    )
    await wait_admitted(kc, ns, "doomed")
    await wait_phase(kc, ns, "doomed", "Running")
    await until("doomed's pods to run", lambda: running_pods(kc, ns, "doomed"), done=lambda p: len(p) == 2)
    pod = labelled_pods(kc, ns, "doomed")[0]["metadata"]["name"]
    sim.fail_pod(kc, ns, pod, exit_code=1)

    samples: list[dict[str, Any]] = []

    def sample() -> dict[str, Any]:
        # The Workload first: what the AppWrapper and its pods show after is no older.
        wl = workload_of(kc, ns, "doomed")
        aw = aw_now(kc, ns, "doomed")
        s = {
            "phase": read_appwrapper(aw).phase,
            "deployed": condition(aw, "ResourcesDeployed").get("status"),
            "pods": len(labelled_pods(kc, ns, "doomed")),
            "finished": is_true(wl, "Finished"),
            "held": holds_quota(wl),
        }
        samples.append(s)
        return s

    await until(
        "doomed to fail and its quota to be released", sample, done=lambda s: not s["held"], within=60
    )
    failed_while_deployed = [s for s in samples if s["phase"] == "Failed" and s["deployed"] == "True"]
    assert failed_while_deployed, f"never saw Failed with resources still deployed: {samples}"
    # Kueue counts the quota for as long as anything of it may still exist.
    released = [s for s in samples if not s["held"] or s["finished"]]
    assert released and all(s["deployed"] == "False" and s["pods"] == 0 for s in released), samples
    assert read_appwrapper(aw_now(kc, ns, "doomed")).phase == "Failed"
    assert is_true(workload_of(kc, ns, "doomed"), "Finished")
    await until_reserved(kc, queues.cluster_queue, 0)


# ---------------------------------------------------------------------------------------------
# Preemption


async def test_preemption_suspends_a_running_appwrapper_which_resumes_after_the_preemptor_keeping_its_resets(
    testbed: Endpoints, queues: Queues
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    low, high = f"{ns}-low", f"{ns}-high"
    for name, value in ((low, 100), (high, 1000)):
        kubectl(
            kc,
            "apply",
            "-f",
            "-",
            stdin=json.dumps(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                }
            ),
        )
    try:
        create(
            kc, ns, queued_aw("background", gpus=GPUS, annotations=FAST_RESET, labels={PRIORITY_LABEL: low})
        )
        await wait_phase(kc, ns, "background", "Running")
        # One reset first, so that there is a count to keep.
        sim.fail_pod(kc, ns, labelled_pods(kc, ns, "background")[0]["metadata"]["name"], exit_code=1)
        await until(
            "background to be running again after its reset",
            lambda: aw_now(kc, ns, "background"),
            done=lambda aw: (
                resetting_count(aw) == 1
                and read_appwrapper(aw).phase == "Running"
                and len(running_pods(kc, ns, "background")) == 1
            ),
            within=40,
        )

        create(
            kc,
            ns,
            queued_aw(
                "urgent", gpus=GPUS, pod_annotations={sim.SUCCEED_AFTER: "6s"}, labels={PRIORITY_LABEL: high}
            ),
        )
        suspended = await wait_phase(kc, ns, "background", "Suspended", within=30)
        assert suspended["spec"]["suspend"] is True
        assert resetting_count(suspended) == 1
        assert condition(suspended, "QuotaReserved")["status"] == "False"
        assert condition(suspended, "ResourcesDeployed")["status"] == "False"
        assert not labelled_pods(kc, ns, "background")
        assert not [
            j
            for j in sim.get_json(kc, "jobs", "-n", ns)["items"]
            if j["metadata"]["name"].startswith("background")
        ]
        await events_when(
            kc, ns, "background", "Suspending", lambda es: "Suspending" in {e["reason"] for e in es}
        )
        wl = workload_of(kc, ns, "background")
        assert (
            condition(wl, "Preempted").get("status") == "True"
            or condition(wl, "Evicted").get("reason") == "Preempted"
        ), wl

        await wait_phase(kc, ns, "urgent", "Running", within=30)
        await wait_phase(kc, ns, "urgent", "Succeeded", within=30)
        resumed = await wait_phase(kc, ns, "background", "Running", within=40)
        assert resumed["spec"].get("suspend") is not True
        assert resetting_count(resumed) == 1
        await until(
            "background's pod to run again",
            lambda: running_pods(kc, ns, "background"),
            done=lambda p: len(p) == 1,
            within=20,
        )
    finally:
        for name in (low, high):
            kubectl(kc, "delete", "workloadpriorityclass", name, "--wait=false", check=False)


# ---------------------------------------------------------------------------------------------
# The default queue, with Kueue's and Respawn's mutating webhooks both active


@dataclass
class RespawnWebhook:
    url: str
    ca_bundle: str


@pytest.fixture(scope="module")
def respawn_webhook(
    testbed: Endpoints, kueue_state: State, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RespawnWebhook]:
    """Respawn's webhook process on 127.0.0.1 (a certificate of the testbed's CA), with
    ``defaultQueueName`` set to the LocalQueue every test namespace here has."""
    directory = tmp_path_factory.mktemp("respawn-webhook")
    p = pki.Pki(kueue_state.state_dir / "pki")
    crt, key = pki.serving_cert(p, "respawn-webhook-kueue-test")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RESPAWN_CONFIG"}
    env.update({"KUBECONFIG": str(testbed.kubeconfig), "RESPAWN_DEFAULT_QUEUE_NAME": QUEUE})
    argv = [sys.executable, "-m", "services.webhook.server", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--cert-file", str(crt), "--key-file", str(key)]
    proc = start("respawn-webhook", argv, directory / "webhook.log", env=env)
    ctx = ssl.create_default_context(cafile=str(p.ca_crt))

    def healthy() -> bool:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)

    try:
        wait_until(proc, healthy, timeout=30, what="serving /healthz")
        yield RespawnWebhook(f"https://127.0.0.1:{port}", base64.b64encode(p.ca_crt.read_bytes()).decode())
    finally:
        stop_pid(proc.pid)


def _register(kubeconfig: Path, hook: RespawnWebhook, namespace: str, name: str) -> list[tuple[str, str]]:
    """deploy/webhook's configurations, named ``name`` and limited to ``namespace``."""
    documents = list(yaml.safe_load_all((REPO / "deploy" / "webhook" / "configurations.yaml").read_text()))
    registered = []
    for conf in documents:
        conf["metadata"]["name"] = name
        for spec in conf["webhooks"]:
            path = spec["clientConfig"]["service"]["path"]
            spec["clientConfig"] = {"url": hook.url + path, "caBundle": hook.ca_bundle}
            spec["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        registered.append((conf["kind"].lower(), name))
    kubectl(
        kubeconfig,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
    )
    return registered


@pytest.mark.parametrize(
    "order",
    [
        # The API server calls mutating webhooks in the order of their configurations' names.
        pytest.param("a-respawn", id="respawn-first"),
        pytest.param("z-respawn", id="kueue-first"),
    ],
)
async def test_an_appwrapper_without_a_queue_label_is_queued_through_the_default_queue(
    testbed: Endpoints, queues: Queues, respawn_webhook: RespawnWebhook, order: str
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    name = f"{order}-{ns}"
    assert (name < kueue.MUTATING) == order.startswith("a-")
    registered = _register(kc, respawn_webhook, ns, name)
    try:
        # Registration takes effect when the API server's webhook informer sees it.
        def labelled_by_respawn() -> bool:
            probe = queued_aw("probe", queue=None)
            out = kubectl(
                kc,
                "create",
                "--dry-run=server",
                "-n",
                ns,
                "-o",
                "json",
                "-f",
                "-",
                stdin=json.dumps(probe),
                check=False,
            )
            return out.returncode == 0 and QUEUE_NAME_LABEL in json.loads(out.stdout)["metadata"].get(
                "labels", {}
            )

        await until("Respawn's webhook to be called", labelled_by_respawn, within=20)

        stored = create(kc, ns, queued_aw("unlabelled", gpus=2, queue=None))
        assert stored["metadata"]["labels"][QUEUE_NAME_LABEL] == QUEUE
        assert stored["spec"]["suspend"] is True
        wl = await wait_admitted(kc, ns, "unlabelled")
        assert wl["spec"]["queueName"] == QUEUE
        aw = await wait_phase(kc, ns, "unlabelled", "Running")
        assert aw["spec"]["components"][0]["podSetInfos"][0]["nodeSelector"] == {"type": "kwok"}
    finally:
        for kind, conf in registered:
            kubectl(kc, "delete", kind, conf, "--ignore-not-found", check=False)


# ---------------------------------------------------------------------------------------------
# waitForPodsReady: Respawn's PodsReady is what Kueue reads, and its timeout runs from admission


def evicted_for_pods_ready_timeout(wl: dict[str, Any] | None) -> bool:
    """Whether Kueue evicted the Workload for its PodsReady timeout (its Evicted condition; once
    the Workload is requeued, that condition is False with the same reason)."""
    return condition(wl, "Evicted").get("reason") == "PodsReadyTimeout"


@pytest.fixture(scope="module")
def pods_ready_timeout(testbed: Endpoints, kueue_state: State) -> Iterator[float]:
    """Kueue restarted with waitForPodsReady on (timeout ``PODS_READY_TIMEOUT``), then back to
    MLBatch's configuration. Once for the module (a restart takes 10-20 s): the tests that use it
    come last in it, and each has a ClusterQueue of its own."""
    kueue.up(kueue_state, wait_for_pods_ready=f"{PODS_READY_TIMEOUT:g}s", restart=True)
    try:
        yield PODS_READY_TIMEOUT
    finally:
        kueue.up(kueue_state, restart=True)


async def test_with_wait_for_pods_ready_kueue_reads_respawns_pods_ready_and_never_evicts_a_ready_workload(
    testbed: Endpoints, pods_ready_timeout: float, queues: Queues
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    create(kc, ns, queued_aw("ready", pods=2, gpus=1))
    await wait_admitted(kc, ns, "ready")
    await until(
        "Kueue to read PodsReady from the AppWrapper",
        lambda: (aw_now(kc, ns, "ready"), workload_of(kc, ns, "ready")),
        done=lambda pair: is_true(pair[0], "PodsReady") and is_true(pair[1], "PodsReady"),
        within=20,
    )
    await holds(
        "the ready workload stays admitted past Kueue's timeout",
        lambda: (
            is_true(workload_of(kc, ns, "ready"), "Admitted")
            and not is_true(workload_of(kc, ns, "ready"), "Evicted")
        ),
        during=pods_ready_timeout + 2,
    )


async def test_with_a_timeout_shorter_than_warmup_kueue_evicts_and_respawn_suspends_without_a_reset(
    testbed: Endpoints, pods_ready_timeout: float, queues: Queues
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    annotations = {**FAST_RESET, "workload.codeflare.dev.appwrapper/warmupGracePeriodDuration": "5m"}
    create(
        kc,
        ns,
        queued_aw(
            "slow",
            gpus=2,
            annotations=annotations,
            pod_annotations={sim.STUCK_INIT: "true"},
        ),
    )
    await wait_admitted(kc, ns, "slow")
    admitted_at = time.monotonic()
    await until(
        "Kueue to evict slow for PodsReady timeout",
        lambda: workload_of(kc, ns, "slow"),
        done=evicted_for_pods_ready_timeout,
        within=pods_ready_timeout + 20,
    )
    assert time.monotonic() - admitted_at >= pods_ready_timeout - 2
    suspended = await wait_phase(kc, ns, "slow", "Suspended", within=30)
    # Kueue's eviction is a suspension for Respawn: everything deleted, no retry used up.
    assert resetting_count(suspended) == 0
    assert condition(suspended, "ResourcesDeployed")["status"] == "False"
    await events_when(kc, ns, "slow", "Suspending", lambda es: "Suspending" in {e["reason"] for e in es})


async def test_with_warmup_shorter_than_the_timeout_respawn_resets_first_keeping_quota_then_kueue_evicts(
    testbed: Endpoints, pods_ready_timeout: float, queues: Queues
) -> None:
    kc, ns = testbed.kubeconfig, queues.namespace
    annotations = {
        **FAST_RESET,
        "workload.codeflare.dev.appwrapper/admissionGracePeriodDuration": "2s",
        "workload.codeflare.dev.appwrapper/warmupGracePeriodDuration": "2s",
        "workload.codeflare.dev.appwrapper/retryLimit": "20",
    }
    create(
        kc, ns, queued_aw("stuck", gpus=2, annotations=annotations, pod_annotations={sim.STUCK_INIT: "true"})
    )
    wl = await wait_admitted(kc, ns, "stuck")
    wl_uid = wl["metadata"]["uid"]
    # Respawn's warmup grace ends first: a reset (InsufficientPodsReady), the quota kept.
    reset = await until(
        "Respawn to reset stuck before Kueue's timeout",
        lambda: aw_now(kc, ns, "stuck"),
        done=lambda aw: resetting_count(aw) >= 1,
        within=pods_ready_timeout,
    )
    assert reset["spec"].get("suspend") is not True
    now_wl = workload_of(kc, ns, "stuck")
    assert now_wl is not None and now_wl["metadata"]["uid"] == wl_uid and is_true(now_wl, "Admitted")
    # Kueue's clock runs from admission and a reset does not restart it (the workload's PodsReady
    # was never True): it evicts the workload anyway, and Respawn suspends it.
    await until(
        "Kueue to evict stuck for its PodsReady timeout",
        lambda: workload_of(kc, ns, "stuck"),
        done=evicted_for_pods_ready_timeout,
        within=pods_ready_timeout + 20,
    )
    suspended = await wait_phase(kc, ns, "stuck", "Suspended", within=30)
    assert suspended["spec"]["suspend"] is True
    assert resetting_count(suspended) >= 1
