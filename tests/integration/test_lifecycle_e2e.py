"""The lifecycle end to end on the testbed: watcher, health and lifecycle as separate processes.

Each test submits AppWrappers to a fresh namespace and follows them through the real API server
and the real NATS streams, as a user or an outside subscriber would. Grace periods are shortened
with upstream's per-AppWrapper annotations so that every reset takes seconds.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl, kubectl_binary
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess, spawn_service, stop_all
from shared import subjects
from shared.appwrapper.constants import APPWRAPPER_LABEL, FINALIZER
from shared.appwrapper.model import read_appwrapper
from shared.appwrapper.podsets import component_pod_sets, get_at_path
from shared.messages import LifecycleEvent
from tests import mlbatch
from tests.integration.conftest import ServiceFactory
from tests.integration.objects import (
    FAST_RESET,
    apply,
    events_when,
    get_appwrapper,
    has_event,
    jobs,
    labelled_pods,
    running_pods,
    wait_phase,
)
from tests.integration.observe import Observer
from tests.waiting import holds, until

pytestmark = pytest.mark.testbed

# ---------------------------------------------------------------------------------- helpers


def condition(aw: dict[str, Any] | None, ctype: str) -> Mapping[str, Any]:
    return read_appwrapper(aw).condition(ctype)


def two(pods: list[dict[str, Any]]) -> bool:
    return len(pods) == 2


def submit(
    kubeconfig: Path,
    namespace: str,
    name: str,
    *,
    pods: int = 1,
    pod_annotations: dict[str, str] | None = None,
    **clocks: Any,
) -> None:
    """Submit an AppWrapper around one Job whose failed pods are not replaced by the Job, with
    short clocks (``FAST_RESET``, then ``clocks`` as for ``manifests.fault_tolerance``)."""
    annotations = {**FAST_RESET, **manifests.fault_tolerance(**clocks)}
    aw = manifests.job_appwrapper(name, pods=pods, pod_annotations=pod_annotations, annotations=annotations)
    apply(kubeconfig, namespace, aw)


def get_component(kubeconfig: Path, namespace: str, template: dict[str, Any], name: str) -> dict[str, Any]:
    group, _, version = str(template["apiVersion"]).rpartition("/")
    resource = f"{template['kind']}.{version}.{group}" if group else f"{template['kind']}.{version}"
    obj: dict[str, Any] = sim.get_json(kubeconfig, resource, name, "-n", namespace)
    return obj


@pytest.fixture(scope="module")
def observers(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """watcher and health, each its own process, shared by this module's tests.

    Every test starts its own lifecycle (the process under test) with the ``service`` fixture.
    """
    logs = tmp_path_factory.mktemp("observers") / "logs"
    started: list[ServiceProcess] = []
    try:
        for name in ("watcher", "health"):
            started.append(
                spawn_service(name, kubeconfig=testbed.kubeconfig, nats_url=testbed.nats_url, log_dir=logs)
            )
        yield
    finally:
        stop_all(started)


@pytest.fixture
def lifecycle(observers: None, service: ServiceFactory) -> ServiceProcess:
    """The process under test: a lifecycle of its own, beside the module's watcher and health."""
    return service("lifecycle")


async def lifecycle_events(nats_url: str, namespace: str, name: str) -> list[LifecycleEvent]:
    async with Observer(nats_url) as obs:
        return await obs.all(
            subjects.LIFECYCLE_STREAM, subjects.lifecycle_event(namespace, name), LifecycleEvent
        )


class JobWatch:
    """Every Job created in a namespace, recorded by a `kubectl get --watch` running alongside."""

    def __init__(self, kubeconfig: Path, namespace: str, out: Path) -> None:
        self.out = out
        self.file = out.open("w")
        self.proc = subprocess.Popen(
            [
                kubectl_binary(),
                f"--kubeconfig={kubeconfig}",
                "get",
                "jobs",
                "-n",
                namespace,
                "--watch",
                "--output-watch-events",
                "-o",
                "json",
            ],
            stdout=self.file,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.file.close()

    def created_uids(self) -> list[str]:
        """Uids of the Jobs seen, in order of first appearance."""
        self.file.flush()
        text = self.out.read_text()
        decoder = json.JSONDecoder()
        uids: list[str] = []
        pos = 0
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                return uids
            try:
                event, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                return uids  # a document still being written
            uid = event["object"]["metadata"]["uid"]
            if uid not in uids:
                uids.append(uid)


@pytest.fixture
def job_watch(testbed: Endpoints, namespace: str, tmp_path: Path) -> Iterator[JobWatch]:
    watch = JobWatch(testbed.kubeconfig, namespace, tmp_path / "jobs.watch")
    yield watch
    watch.stop()


# ---------------------------------------------------------------------- MLBatch samples


def mlbatch_sample(name: str) -> dict[str, Any]:
    """An MLBatch sample by its file name in the guide, as an AppWrapper."""
    sample = mlbatch.load(name)
    if sample["kind"] == "AppWrapper":
        return sample
    # The guide submits its PyTorchJob unwrapped; wrapping it is the recommended way.
    return manifests.appwrapper(sample["metadata"]["name"], manifests.component(sample))


def with_pods_succeeding(aw: dict[str, Any], after: str) -> dict[str, Any]:
    # The only change made to a sample: the testbed's pods run forever unless told to finish
    # (pod simulation contract), so every pod template gets `succeed-after`.
    for component in aw["spec"]["components"]:
        for pod_set in component_pod_sets(component):
            pod_template = get_at_path(component["template"], pod_set.path)
            pod_template.setdefault("metadata", {}).setdefault("annotations", {})[sim.SUCCEED_AFTER] = after
    return aw


@pytest.mark.parametrize("sample", ["job", "job-with-podgroup", "pytorchjob"])
async def test_mlbatch_sample_runs_unchanged_to_succeeded(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess, sample: str
) -> None:
    kc = testbed.kubeconfig
    aw = with_pods_succeeding(mlbatch_sample(sample), "1s")
    # No Kueue on the testbed: none of the samples asks to be suspended, so nothing to admit.
    assert aw["spec"].get("suspend") is not True
    name = aw["metadata"]["name"]
    apply(kc, namespace, aw)

    done = await wait_phase(kc, namespace, name, "Succeeded", within=60)
    status = read_appwrapper(done)
    assert status.resetting_count == 0
    assert condition(done, "QuotaReserved")["status"] == "False"
    assert condition(done, "ResourcesDeployed")["reason"] == "Succeeded"
    assert FINALIZER in done["metadata"]["finalizers"]
    expected = sum(ps.count for c in aw["spec"]["components"] for ps in component_pod_sets(c))
    pods = labelled_pods(kc, namespace, name)
    assert len(pods) == expected and all(p["status"]["phase"] == "Succeeded" for p in pods)
    # Every component was created, labelled and owned by its AppWrapper.
    for entry, component in zip(status.component_status, aw["spec"]["components"], strict=True):
        obj = get_component(kc, namespace, component["template"], entry["name"])
        assert obj["metadata"]["labels"][APPWRAPPER_LABEL] == name
        owner = [o for o in obj["metadata"]["ownerReferences"] if o.get("controller")]
        assert [o["uid"] for o in owner] == [done["metadata"]["uid"]]


# ------------------------------------------------------------------------------- resets


async def test_pod_failing_once_is_reset_recreated_and_succeeds(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    # A retry pause long enough to watch the Resetting phase go by.
    submit(kc, namespace, "once", pod_annotations={sim.SUCCEED_AFTER: "4s"}, retry_pause="4s")
    await wait_phase(kc, namespace, "once", "Running")
    first = await until("a running pod", lambda: running_pods(kc, namespace, "once"))
    first_job_uid = jobs(kc, namespace)[0]["metadata"]["uid"]

    sim.fail_pod(kc, namespace, first[0]["metadata"]["name"], exit_code=1)
    resetting = await wait_phase(kc, namespace, "once", "Resetting", within=20)
    assert read_appwrapper(resetting).resetting_count == 1
    assert condition(resetting, "QuotaReserved")["status"] == "True"  # kept throughout the reset

    done = await wait_phase(kc, namespace, "once", "Succeeded", within=40)
    assert read_appwrapper(done).resetting_count == 1
    [job] = jobs(kc, namespace)
    assert job["metadata"]["uid"] != first_job_uid  # recreated, not reused
    pods = labelled_pods(kc, namespace, "once")
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]
    assert pods[0]["metadata"]["name"] != first[0]["metadata"]["name"]

    # Kubernetes Events on the AppWrapper tell the story.
    told = {"Suspended", "Resuming", "Running", "Unhealthy", "Resetting", "Succeeded"}
    await events_when(kc, namespace, "once", f"{sorted(told)}", lambda es: told <= {e["reason"] for e in es})
    # And so does the lifecycle stream.
    events = await lifecycle_events(testbed.nats_url, namespace, "once")
    started = [e for e in events if e.event == "ResetStarted"]
    finished = [e for e in events if e.event == "ResetFinished"]
    assert [e.resetting_count for e in started] == [1] and [e.resetting_count for e in finished] == [1]
    assert started[0].reason in {"FoundFailedPods", "FailedComponent"}


async def test_always_failing_workload_ends_failed_at_the_retry_limit_with_nothing_left(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    submit(kc, namespace, "doomed", pod_annotations={sim.FAIL_AFTER: "1s"}, retry_limit=2)
    failed = await wait_phase(kc, namespace, "doomed", "Failed", within=60)
    assert read_appwrapper(failed).resetting_count == 2
    assert condition(failed, "Unhealthy")["status"] == "True"
    await events_when(
        kc,
        namespace,
        "doomed",
        "Failed: retry limit of 2 is reached",
        has_event("Failed", "retry limit of 2 is reached"),
    )

    final = await until(
        "resources and quota released",
        lambda: get_appwrapper(kc, namespace, "doomed"),
        done=lambda aw: condition(aw, "QuotaReserved").get("status") == "False",
        within=30,
    )
    assert condition(final, "ResourcesDeployed")["status"] == "False"
    assert read_appwrapper(final).phase == "Failed"
    assert jobs(kc, namespace) == []
    assert labelled_pods(kc, namespace, "doomed") == []
    events = await lifecycle_events(testbed.nats_url, namespace, "doomed")
    assert [e.resetting_count for e in events if e.event == "ResetStarted"] == [1, 2]


# ----------------------------------------------------------------------------- deletion


async def test_stuck_terminating_pod_is_removed_only_by_forceful_deletion(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    forceful = 4
    submit(
        kc,
        namespace,
        "stuck",
        pod_annotations={sim.STUCK_TERMINATING: "true"},
        forceful_deletion_grace=f"{forceful}s",
    )
    await wait_phase(kc, namespace, "stuck", "Running")
    [pod] = await until("a running pod", lambda: running_pods(kc, namespace, "stuck"))
    pod_name = pod["metadata"]["name"]
    kubectl(
        kc, "patch", "appwrapper", "stuck", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )

    # The graceful stage: the Job is deleted, its pod is marked for deletion but stays.
    terminating = await until(
        "the pod to be terminating",
        lambda: labelled_pods(kc, namespace, "stuck"),
        done=lambda pods: pods and pods[0]["metadata"].get("deletionTimestamp"),
        within=15,
    )
    stuck = terminating[0]
    assert stuck["metadata"]["name"] == pod_name
    assert stuck["metadata"]["deletionGracePeriodSeconds"] > 0  # a graceful delete, not forced

    # Until the pod is gone, the resources count as deployed (the quota is not free). The
    # AppWrapper is read before the pods: once it says "not deployed", the pod must be gone.
    seen_terminating = last_seen = time.monotonic()

    def undeployed() -> bool:
        nonlocal last_seen
        aw = get_appwrapper(kc, namespace, "stuck")
        pods = labelled_pods(kc, namespace, "stuck")
        if condition(aw, "ResourcesDeployed")["status"] == "False":
            assert pods == [], "ResourcesDeployed turned False while a pod was left"
            return True
        assert read_appwrapper(aw).phase == "Suspending"
        if pods:
            last_seen = time.monotonic()
        return False

    await until("the stuck pod to be removed", undeployed, within=30, every=0.1)
    # The graceful delete alone never removed it: it stayed until the forceful deadline (the
    # clock starts at a whole second, as every metav1.Time, so up to 1s of it may be gone
    # before the pod is first seen terminating here).
    assert last_seen - seen_terminating >= forceful - 2.5

    suspended = await wait_phase(kc, namespace, "stuck", "Suspended", within=15)
    assert condition(suspended, "ResourcesDeployed")["status"] == "False"
    assert condition(suspended, "QuotaReserved")["status"] == "False"

    # The escalation happened, once, with the stuck pod still there.
    events = await lifecycle_events(testbed.nats_url, namespace, "stuck")
    forced = [e for e in events if e.event == "DeletionForceful"]
    assert len(forced) == 1, events
    assert "1 pods (1 stuck terminating)" in forced[0].message
    assert f"ForcefulDeletionGracePeriod of {forceful}s" in forced[0].message
    events = await events_when(
        kc, namespace, "stuck", "ForcefulDeletion", lambda es: "ForcefulDeletion" in {e["reason"] for e in es}
    )
    assert [e["reason"] for e in events].count("ForcefulDeletion") == 1


async def test_suspend_deletes_everything_and_resume_runs_again(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    submit(kc, namespace, "pausable", pods=2)
    await wait_phase(kc, namespace, "pausable", "Running")
    await until("two running pods", lambda: running_pods(kc, namespace, "pausable"), done=two)
    [job] = jobs(kc, namespace)

    patch = ["patch", "appwrapper", "pausable", "-n", namespace, "--type=merge", "-p"]
    kubectl(kc, *patch, '{"spec":{"suspend":true}}')
    suspended = await wait_phase(kc, namespace, "pausable", "Suspended", within=20)
    assert condition(suspended, "QuotaReserved")["status"] == "False"
    assert condition(suspended, "ResourcesDeployed")["status"] == "False"
    assert jobs(kc, namespace) == []
    assert labelled_pods(kc, namespace, "pausable") == []
    events = await lifecycle_events(testbed.nats_url, namespace, "pausable")
    assert ("Running", "Suspending") in [(e.previous_phase, e.phase) for e in events]

    kubectl(kc, *patch, '{"spec":{"suspend":false}}')
    running = await wait_phase(kc, namespace, "pausable", "Running", within=20)
    assert condition(running, "QuotaReserved")["status"] == "True"
    await until("two running pods again", lambda: running_pods(kc, namespace, "pausable"), done=two)
    [again] = jobs(kc, namespace)
    assert again["metadata"]["uid"] != job["metadata"]["uid"]
    assert read_appwrapper(running).resetting_count == 0  # a suspension is not a reset


async def test_component_deleted_behind_the_controllers_back_fails_the_appwrapper(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    submit(kc, namespace, "victim")
    await wait_phase(kc, namespace, "victim", "Running")
    await until("a running pod", lambda: running_pods(kc, namespace, "victim"))

    sim.delete_component(kc, namespace, "job", "victim-job")
    failed = await wait_phase(kc, namespace, "victim", "Failed", within=20)
    assert condition(failed, "Unhealthy")["reason"] == "MissingComponent"
    assert read_appwrapper(failed).resetting_count == 0  # no retry, whatever the limit
    await until(
        "everything removed", lambda: not jobs(kc, namespace) and not labelled_pods(kc, namespace, "victim")
    )
    await until(
        "quota released",
        lambda: condition(get_appwrapper(kc, namespace, "victim"), "QuotaReserved").get("status") == "False",
    )


async def test_deleting_the_appwrapper_mid_reset_leaves_nothing_behind(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    # Pods that only a forceful delete removes keep the reset's deletion going while the
    # AppWrapper is deleted; a long pause would keep it in Resetting afterwards.
    submit(
        kc,
        namespace,
        "doomed",
        pods=2,
        pod_annotations={sim.STUCK_TERMINATING: "true"},
        retry_pause="60s",
        forceful_deletion_grace="4s",
    )
    await wait_phase(kc, namespace, "doomed", "Running")
    pods = await until("two running pods", lambda: running_pods(kc, namespace, "doomed"), done=two)
    sim.fail_pod(kc, namespace, pods[0]["metadata"]["name"])
    mid = await wait_phase(kc, namespace, "doomed", "Resetting", within=20)
    assert condition(mid, "ResourcesDeployed")["status"] == "True"  # the reset's deletion is under way

    kubectl(kc, "delete", "appwrapper", "doomed", "-n", namespace, "--wait=false")
    await until(
        "the AppWrapper to be gone", lambda: get_appwrapper(kc, namespace, "doomed") is None, within=30
    )
    assert jobs(kc, namespace) == []
    assert labelled_pods(kc, namespace, "doomed") == []
    events = await lifecycle_events(testbed.nats_url, namespace, "doomed")
    assert "Terminating" in [e.phase for e in events if e.event == "PhaseChanged"]


# ------------------------------------------------------------------ restarts and replicas


async def test_lifecycle_killed_mid_reset_is_replaced_and_the_reset_completes_with_the_right_count(
    testbed: Endpoints, namespace: str, service: ServiceFactory, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    # Pods that only a forceful delete removes hold the reset in its deletion stage, so the
    # kill lands in the middle of it.
    submit(
        kc,
        namespace,
        "phoenix",
        pods=2,
        pod_annotations={sim.SUCCEED_AFTER: "5s", sim.STUCK_TERMINATING: "true"},
        retry_pause="3s",
        forceful_deletion_grace="4s",
    )
    await wait_phase(kc, namespace, "phoenix", "Running")
    pods = await until("two running pods", lambda: running_pods(kc, namespace, "phoenix"), done=two)
    first_job_uid = jobs(kc, namespace)[0]["metadata"]["uid"]

    sim.fail_pod(kc, namespace, pods[0]["metadata"]["name"])
    await wait_phase(kc, namespace, "phoenix", "Resetting", within=20)
    lifecycle.kill()
    assert not lifecycle.alive()
    killed_during = get_appwrapper(kc, namespace, "phoenix")
    assert read_appwrapper(killed_during).resetting_count == 1
    assert condition(killed_during, "ResourcesDeployed")["status"] == "True"  # still deleting

    # With no lifecycle running, the reset stands still past its forceful deadline and pause...
    def stalled() -> bool:
        aw = get_appwrapper(kc, namespace, "phoenix")
        return (
            read_appwrapper(aw).phase == "Resetting"
            and condition(aw, "ResourcesDeployed")["status"] == "True"
        )

    await holds("the reset standing still (Resetting, resources deployed)", stalled, during=4.5)
    assert [p["metadata"]["name"] for p in labelled_pods(kc, namespace, "phoenix")] == [
        pods[1]["metadata"]["name"]
    ]
    # ...and a new instance, knowing only what the status says, completes it.
    service("lifecycle", instance="2")

    done = await wait_phase(kc, namespace, "phoenix", "Succeeded", within=40)
    assert read_appwrapper(done).resetting_count == 1
    [job] = jobs(kc, namespace)
    assert job["metadata"]["uid"] != first_job_uid
    assert {p["status"]["phase"] for p in labelled_pods(kc, namespace, "phoenix")} == {"Succeeded"}
    events = await lifecycle_events(testbed.nats_url, namespace, "phoenix")
    assert [e.resetting_count for e in events if e.event == "ResetStarted"] == [1]
    assert [e.resetting_count for e in events if e.event == "ResetFinished"] == [1]
    assert len([e for e in events if e.event == "DeletionForceful"]) == 1  # by the new instance


async def test_two_lifecycle_instances_reset_once_and_create_once_per_attempt(
    testbed: Endpoints,
    observers: None,
    namespace: str,
    service: ServiceFactory,
    job_watch: JobWatch,
) -> None:
    kc = testbed.kubeconfig
    # Frequent resyncs make both instances reconcile the same AppWrapper at the same time.
    fast_resync = {"RESPAWN_LIFECYCLE_RESYNC_PERIOD": "300ms"}
    service("lifecycle", instance="a", env=fast_resync)
    service("lifecycle", instance="b", env=fast_resync)
    submit(kc, namespace, "twin", pod_annotations={sim.SUCCEED_AFTER: "4s"})
    await wait_phase(kc, namespace, "twin", "Running")
    [pod] = await until("a running pod", lambda: running_pods(kc, namespace, "twin"))
    assert len(job_watch.created_uids()) == 1

    sim.fail_pod(kc, namespace, pod["metadata"]["name"])
    done = await wait_phase(kc, namespace, "twin", "Succeeded", within=40)
    assert read_appwrapper(done).resetting_count == 1
    [job] = jobs(kc, namespace)
    uids = job_watch.created_uids()
    assert len(uids) == 2, f"expected one Job per attempt, saw {uids}"
    assert uids[-1] == job["metadata"]["uid"]
    events = await lifecycle_events(testbed.nats_url, namespace, "twin")
    assert [e.resetting_count for e in events if e.event == "ResetStarted"] == [1]
    assert [e.resetting_count for e in events if e.event == "ResetFinished"] == [1]
