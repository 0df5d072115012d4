"""The kinds MLBatch users wrap besides Jobs and PyTorchJobs, end to end on the testbed: a JobSet
(run by the JobSet controller), a RayCluster and a RayJob (run by the KubeRay operator), each in an
AppWrapper, with watcher, health and lifecycle running as separate processes.

For each kind: the AppWrapper reaches Running with the pods its inferred pod sets ask for; one
failed pod resets the whole workload (every pod replaced, ``resettingCount`` 1, Running again);
deleting the AppWrapper removes the wrapped object, its pods and whatever its controller made
from it (Jobs, Services, a RayJob's RayCluster and submitter Job).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from shared.appwrapper.model import read_appwrapper
from shared.appwrapper.podsets import component_pod_sets
from tests.integration.conftest import services_on
from tests.integration.objects import (
    FAST_RESET,
    apply,
    get_appwrapper,
    labelled_pods,
    running_pods,
    wait_phase,
)
from tests.waiting import until

pytestmark = pytest.mark.testbed

RAY_IMAGE = "rayproject/ray:2.46.0"


def jobset() -> dict[str, Any]:
    """A JobSet of a driver (one Job of one pod) and workers (two Jobs of two pods each): 5 pods.

    ``backoffLimit: 0``: a Job never replaces a failed pod itself, so the failure is Respawn's.
    """

    def replicated(name: str, jobs: int, pods: int) -> dict[str, Any]:
        return {
            "name": name,
            "replicas": jobs,
            "template": {"spec": manifests.job(name, pods=pods, backoffLimit=0)["spec"]},
        }

    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "trainer"},
        "spec": {"replicatedJobs": [replicated("driver", 1, 1), replicated("workers", 2, 2)]},
    }


def ray_cluster_spec(workers: int) -> dict[str, Any]:
    """A Ray cluster of one head and ``workers`` workers in one group."""
    return {
        "headGroupSpec": {
            "rayStartParams": {},
            "template": manifests.pod_template(container="ray-head", image=RAY_IMAGE, restart_policy=None),
        },
        "workerGroupSpecs": [
            {
                "groupName": "workers",
                "replicas": workers,
                "minReplicas": 0,
                "maxReplicas": workers,
                "rayStartParams": {},
                "template": manifests.pod_template(
                    container="ray-worker", image=RAY_IMAGE, restart_policy=None
                ),
            }
        ],
    }


def raycluster() -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "cluster"},
        "spec": ray_cluster_spec(workers=2),
    }


def rayjob() -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "batch"},
        "spec": {"entrypoint": "python -c 'print(1)'", "rayClusterSpec": ray_cluster_spec(workers=1)},
    }


@dataclass(frozen=True)
class Kind:
    id: str
    build: Callable[[], dict[str, Any]]
    # The resources (kubectl names) the kind's controller makes from it, all of which must go
    # with the AppWrapper.
    made: tuple[str, ...]
    pods: int


KINDS = [
    Kind("jobset", jobset, ("jobsets.jobset.x-k8s.io", "jobs.batch", "services"), pods=5),
    Kind("raycluster", raycluster, ("rayclusters.ray.io", "services"), pods=3),
    Kind("rayjob", rayjob, ("rayjobs.ray.io", "rayclusters.ray.io", "jobs.batch", "services"), pods=2),
]


@pytest.fixture(scope="module")
def respawn_services(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """watcher, health and lifecycle, each its own process, shared by this module's tests."""
    logs = tmp_path_factory.mktemp("wrapped-kinds") / "logs"
    with services_on(testbed.kubeconfig, testbed.nats_url, logs) as start:
        for name in ("watcher", "health", "lifecycle"):
            start(name)
        yield


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def names_of(kubeconfig: Path, namespace: str, resource: str) -> list[str]:
    items = sim.get_json(kubeconfig, resource, "-n", namespace)["items"]
    return [str(i["metadata"]["name"]) for i in items]


def everything_in(kubeconfig: Path, namespace: str, kind: Kind) -> dict[str, list[str]]:
    """What is left in the namespace of the wrapped object, of what its controller made, and of pods."""
    left = {r: names_of(kubeconfig, namespace, r) for r in (*kind.made, "pods")}
    return {r: names for r, names in left.items() if names}


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.id)
async def test_wrapped_kind_runs_resets_on_a_pod_failure_and_is_removed_with_its_appwrapper(
    testbed: Endpoints, namespace: str, respawn_services: None, kind: Kind
) -> None:
    """Running means the AppWrapper's phase is Running with every pod of its pod sets Running.

    For a RayJob that is all the testbed can show: its operator submits the job through the Ray
    dashboard on the head pod, and on kwok nothing answers there, so the job itself never runs.
    What runs are the RayJob's RayCluster (head and workers, the pods the AppWrapper counts) and
    its submitter Job's pod; the RayJob's deployment status is Running.
    """
    kc = testbed.kubeconfig
    name = kind.id
    aw = manifests.appwrapper(name, manifests.component(kind.build()), annotations=FAST_RESET)
    expected = sum(ps.count for ps in component_pod_sets(aw["spec"]["components"][0]))
    assert expected == kind.pods  # the pod sets are inferred as upstream infers them
    apply(kc, namespace, aw)

    await wait_phase(kc, namespace, name, "Running", within=60)
    first = await until(
        f"{expected} running pods",
        lambda: running_pods(kc, namespace, name),
        done=lambda pods: len(pods) == expected,
        within=60,
    )
    if kind.id == "jobset":
        # Defaulted by the JobSet controller's admission webhook, which its reconciler relies on.
        stored = sim.get_json(kc, "jobsets.jobset.x-k8s.io", "trainer", "-n", namespace)
        assert stored["spec"]["successPolicy"]["operator"] == "All"
    if kind.id == "rayjob":
        await until(
            "the RayJob to be deployed and its submitter pod running",
            lambda: (
                sim.get_json(kc, "rayjobs.ray.io", "batch", "-n", namespace)
                .get("status", {})
                .get("jobDeploymentStatus")
                == "Running"
                and any(
                    p["status"].get("phase") == "Running"
                    for p in sim.get_json(kc, "pods", "-n", namespace, "-l", "job-name=batch")["items"]
                )
            ),
            within=60,
        )

    # One pod fails: the whole workload is reset, every pod replaced.
    sim.fail_pod(kc, namespace, first[-1]["metadata"]["name"], exit_code=1)
    again = await until(
        f"{expected} new running pods after the reset",
        lambda: running_pods(kc, namespace, name),
        done=lambda pods: len(pods) == expected and not uids(pods) & uids(first),
        within=90,
    )
    assert len(labelled_pods(kc, namespace, name)) == expected  # none of the first attempt's left
    running = await wait_phase(kc, namespace, name, "Running", within=30)
    assert read_appwrapper(running).resetting_count == 1
    assert uids(again).isdisjoint(uids(first))

    # Deleting the AppWrapper removes everything: the wrapped object and all its controller made.
    kubectl(kc, "delete", "appwrapper", name, "-n", namespace, "--wait=false")
    await until("the AppWrapper to be gone", lambda: get_appwrapper(kc, namespace, name) is None, within=60)
    left = await until(
        "nothing left in the namespace",
        lambda: everything_in(kc, namespace, kind),
        done=lambda left: not left,
        within=60,
    )
    assert left == {}
