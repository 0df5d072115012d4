"""Which pods count for an AppWrapper, end to end: watcher, health and lifecycle as separate
processes on the testbed.

The AppWrapper label alone does not make a pod an AppWrapper's: anyone who may create pods in the
namespace may put it on one. Pods carrying a victim's label but not in its owner tree (no owner,
an unrelated Job's pod, a pod another AppWrapper controls) fail, and the victim is neither judged
unhealthy nor reset, nor are those pods deleted by its reset; a failure of the victim's own pod
still is. A wrapped Deployment's pod (pod → ReplicaSet → Deployment → AppWrapper) counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from respawn.testbed import manifests, sim
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess, spawn_service, stop_all
from shared import subjects
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.appwrapper.model import read_appwrapper
from shared.messages import PodObservation
from tests.integration.objects import (
    FAST_RESET,
    apply,
    deployment_appwrapper,
    get_appwrapper,
    running_pods,
    wait_phase,
)
from tests.integration.observe import Observer
from tests.waiting import holds, until

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def services(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServiceProcess]]:
    """watcher, health and lifecycle, each its own process, shared by this module's tests."""
    logs = tmp_path_factory.mktemp("attribution") / "logs"
    started: dict[str, ServiceProcess] = {}
    try:
        for name in ("watcher", "health", "lifecycle"):
            started[name] = spawn_service(
                name, kubeconfig=testbed.kubeconfig, nats_url=testbed.nats_url, log_dir=logs
            )
        yield started
    finally:
        stop_all(started.values())


def sample(service: ServiceProcess, name: str, **labels: str) -> float:
    """The value of one sample on the service's /metrics (0 when absent)."""
    for family in text_string_to_metric_families(service.metrics()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def pod(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any] | None:
    found = sim.get_json(kubeconfig, "pods", "-n", namespace, "--field-selector", f"metadata.name={name}")
    items: list[dict[str, Any]] = found["items"]
    return items[0] if items else None


def owner_reference(obj: dict[str, Any], api_version: str, kind: str) -> list[dict[str, Any]]:
    meta = obj["metadata"]
    return [
        {
            "apiVersion": api_version,
            "kind": kind,
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
        }
    ]


async def running(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await until(
        f"pod {name} running",
        lambda: pod(kubeconfig, namespace, name),
        done=lambda p: p is not None and p.get("status", {}).get("phase") == "Running",
    )
    return found


def untouched(kubeconfig: Path, namespace: str, names: list[str]) -> bool:
    """Every pod named is still there, Failed, and nobody asked for its deletion."""
    pods = [pod(kubeconfig, namespace, n) for n in names]
    return all(
        p is not None and p["status"].get("phase") == "Failed" and not p["metadata"].get("deletionTimestamp")
        for p in pods
    )


async def test_pods_with_the_label_but_outside_the_owner_tree_neither_reset_nor_get_deleted(
    testbed: Endpoints, namespace: str, services: dict[str, ServiceProcess]
) -> None:
    kc = testbed.kubeconfig
    watcher, lifecycle = services["watcher"], services["lifecycle"]
    victim = "victim"
    apply(kc, namespace, manifests.job_appwrapper(victim, annotations=FAST_RESET))
    await wait_phase(kc, namespace, victim, "Running")
    [own] = await until("the victim's pod running", lambda: running_pods(kc, namespace, victim))
    bystander_aw = manifests.job_appwrapper("bystander", suspend=True)
    apply(kc, namespace, bystander_aw)
    bystander = get_appwrapper(kc, namespace, "bystander")
    assert bystander is not None

    # Three pods claiming to be the victim's: by the label alone; from an unrelated Job (its
    # template labelled); controlled by another AppWrapper.
    label = {APPWRAPPER_LABEL: victim}
    forged = manifests.pod("forged", labels=label)
    unrelated = manifests.job(
        "unrelated", backoffLimit=0, template=manifests.pod_template(labels={**label, "impostor": "job"})
    )
    other = manifests.pod("other-appwrappers", labels=label)
    other["metadata"]["ownerReferences"] = owner_reference(bystander, API_VERSION, KIND)
    for manifest in (forged, unrelated, other):
        apply(kc, namespace, manifest)
    job_pods = await until(
        "the unrelated Job's pod",
        lambda: sim.get_json(kc, "pods", "-n", namespace, "-l", "impostor=job")["items"],
    )
    impostors = ["forged", job_pods[0]["metadata"]["name"], "other-appwrappers"]
    for name in impostors:
        await running(kc, namespace, name)
    before = {
        reason: sample(watcher, "respawn_watcher_pods_unattributed_total", reason=reason)
        for reason in ("no-owner", "foreign-owner", "other-appwrapper")
    }
    for name in impostors:
        sim.fail_pod(kc, namespace, name, exit_code=1)

    # The watcher saw each one fail and published none of them.
    await until(
        "each impostor counted as not attributed",
        lambda: {r: sample(watcher, "respawn_watcher_pods_unattributed_total", reason=r) for r in before},
        done=lambda now: all(now[r] > before[r] for r in before),
    )
    async with Observer(testbed.nats_url) as obs:
        for name in impostors:
            seen = await obs.last(
                subjects.OBSERVATIONS_STREAM,
                subjects.appwrapper_obs(namespace, victim, "pod", name),
                PodObservation,
            )
            assert seen is None or seen.deleted, f"{name} was published as the victim's pod"

    def victim_running_unreset() -> bool:
        status = read_appwrapper(get_appwrapper(kc, namespace, victim))
        return status.phase == "Running" and status.resetting_count == 0

    # FailureGracePeriod is 0: a failed pod counted for the victim would reset it at once.
    await holds("the victim Running and never reset", victim_running_unreset, during=6)

    # Its own pod failing is still detected, and the reset leaves the impostors alone.
    sim.fail_pod(kc, namespace, own["metadata"]["name"], exit_code=1)
    resetting = await wait_phase(kc, namespace, victim, "Resetting", within=20)
    assert read_appwrapper(resetting).resetting_count == 1
    again = await wait_phase(kc, namespace, victim, "Running", within=40)
    assert read_appwrapper(again).resetting_count == 1
    await until("the victim's new pod running", lambda: running_pods(kc, namespace, victim))
    assert untouched(kc, namespace, impostors), "the victim's reset touched a pod that is not its own"
    assert pod(kc, namespace, own["metadata"]["name"]) is None, "the victim's own failed pod was left"
    not_counted = sum(
        sample(lifecycle, "respawn_lifecycle_pods_not_counted_total", reason=r)
        for r in ("no-owner", "foreign-owner", "other-appwrapper")
    )
    assert not_counted > 0, "lifecycle never looked past the impostors' label"


async def test_a_wrapped_deployments_failed_pod_is_attributed_through_its_replicaset_and_reset(
    testbed: Endpoints, namespace: str, services: dict[str, ServiceProcess]
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, deployment_appwrapper("web"))
    await wait_phase(kc, namespace, "web", "Running")
    [first] = await until("the Deployment's pod running", lambda: running_pods(kc, namespace, "web"))
    owners = [o for o in first["metadata"]["ownerReferences"] if o.get("controller")]
    assert [o["kind"] for o in owners] == ["ReplicaSet"]
    deployment_uid = sim.get_json(kc, "deployment", "web", "-n", namespace)["metadata"]["uid"]

    async with Observer(testbed.nats_url) as obs:
        sim.fail_pod(kc, namespace, first["metadata"]["name"], exit_code=1)
        failed = await obs.wait_last(
            subjects.OBSERVATIONS_STREAM,
            subjects.appwrapper_obs(namespace, "web", "pod", first["metadata"]["name"]),
            PodObservation,
            lambda m: m.phase == "Failed",
        )
        assert failed.owner_kind == "ReplicaSet"
    resetting = await wait_phase(kc, namespace, "web", "Resetting", within=20)
    status = read_appwrapper(resetting)
    assert status.resetting_count == 1
    assert status.condition("Unhealthy")["reason"] == "FoundFailedPods"
    again = await wait_phase(kc, namespace, "web", "Running", within=40)
    assert read_appwrapper(again).resetting_count == 1
    assert sim.get_json(kc, "deployment", "web", "-n", namespace)["metadata"]["uid"] != deployment_uid
    await until("the new Deployment's pod running", lambda: running_pods(kc, namespace, "web"))
