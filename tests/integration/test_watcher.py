"""watcher, as a separate process on the testbed: Kubernetes state → observations on NATS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from shared import subjects
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.bus import TTL_HEADER
from shared.bus.headers import ttl_value
from shared.config import OperatorConfig
from shared.messages import AppWrapperObservation, ComponentObservation, NodeObservation, PodObservation
from tests.integration.conftest import ServiceFactory
from tests.integration.objects import apply
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

OBS = subjects.OBSERVATIONS_STREAM


def labelled_job(kubeconfig: Path, namespace: str, name: str, aw: str, **annotations: str) -> dict[str, Any]:
    """A Job of the AppWrapper ``aw`` as lifecycle would create it: labelled (its pods too) and
    controlled by the AppWrapper, so that its pods' owner chain leads there."""
    labels = {APPWRAPPER_LABEL: aw}
    template = manifests.pod_template(labels=labels, annotations=annotations, container="c")
    job = manifests.job(name, labels=labels, backoffLimit=0, template=template)
    uid = sim.get_json(kubeconfig, "appwrapper", aw, "-n", namespace)["metadata"]["uid"]
    job["metadata"]["ownerReferences"] = [
        {"apiVersion": API_VERSION, "kind": KIND, "name": aw, "uid": uid, "controller": True}
    ]
    return job


def submit_with_job(kubeconfig: Path, namespace: str, aw: str, job: str, **annotations: str) -> None:
    """A suspended AppWrapper ``aw`` (lifecycle does not run here) and its Job ``job``
    (:func:`labelled_job`), standing in for what lifecycle would create."""
    apply(kubeconfig, namespace, manifests.job_appwrapper(aw, suspend=True))
    apply(kubeconfig, namespace, labelled_job(kubeconfig, namespace, job, aw, **annotations))


async def first_pod(kubeconfig: Path, namespace: str, within: float = 30) -> str:
    pods = await until(
        f"a pod in {namespace}",
        lambda: sim.get_json(kubeconfig, "pods", "-n", namespace)["items"],
        within=within,
    )
    return str(pods[0]["metadata"]["name"])


async def test_watcher_publishes_appwrappers_components_pods_nodes_and_tombstones(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    watcher = service("watcher")
    # The Job stands in for what lifecycle would create: labelled with, and controlled by, aw1.
    submit_with_job(kc, namespace, "aw1", "aw1-job", **{sim.FAIL_AFTER: "1s", sim.EXIT_CODE: "3"})
    async with Observer(testbed.nats_url) as obs:
        aw = await obs.wait_last(
            OBS,
            subjects.appwrapper_obs(namespace, "aw1", "appwrapper", "aw1"),
            AppWrapperObservation,
            lambda m: True,
        )
        assert aw.body["spec"]["suspend"] is True and aw.ref.uid

        pod_name = await first_pod(kc, namespace)
        pod = await obs.wait_last(
            OBS,
            subjects.appwrapper_obs(namespace, "aw1", "pod", pod_name),
            PodObservation,
            lambda m: m.phase == "Failed",
        )
        assert pod.node_name.startswith("kwok-node-")
        assert [c.exit_code for c in pod.containers if c.state == "terminated"] == [3]
        assert pod.containers[0].finished_at is not None

        job = await obs.wait_last(
            OBS,
            subjects.appwrapper_obs(namespace, "aw1", "component", "Job.aw1-job"),
            ComponentObservation,
            lambda m: m.failed,
        )
        assert job.kind == "Job" and "BackoffLimitExceeded" in job.status_message

        node = await obs.wait_last(OBS, subjects.node_obs("kwok-node-0"), NodeObservation, lambda m: m.ready)
        assert node.labels["type"] == "kwok"

        kubectl(kc, "delete", "job", "aw1-job", "-n", namespace, "--wait=false")
        await obs.wait_last(
            OBS,
            subjects.appwrapper_obs(namespace, "aw1", "component", "Job.aw1-job"),
            ComponentObservation,
            lambda m: m.deleted,
        )
    assert "respawn_watcher_observations_published_total" in watcher.metrics()


async def test_restarted_watcher_resumes_without_losing_a_transition(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    watcher = service("watcher")
    submit_with_job(kc, namespace, "aw2", "j")
    async with Observer(testbed.nats_url) as obs:
        pod_name = await first_pod(kc, namespace)
        subject = subjects.appwrapper_obs(namespace, "aw2", "pod", pod_name)
        await obs.wait_last(OBS, subject, PodObservation, lambda m: m.phase == "Running")
        # Kill the watcher hard, change the world while it is down, start a new one.
        watcher.kill()
        sim.fail_pod(kc, namespace, pod_name, exit_code=9)
        service("watcher", instance="2")
        failed = await obs.wait_last(OBS, subject, PodObservation, lambda m: m.phase == "Failed")
        assert [c.exit_code for c in failed.containers] == [9]


async def test_deletes_made_while_the_watcher_was_down_get_tombstones_when_it_starts(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    # The known objects are in memory only: a new watcher's list cannot report what vanished
    # before it, so it compares its list with the stored observations (docs/messages.md,
    # "Tombstones"). Without that, health would keep the last Running state for ever.
    kc = testbed.kubeconfig
    watcher = service("watcher")
    submit_with_job(kc, namespace, "aw3", "aw3-job")
    aw_subject = subjects.appwrapper_obs(namespace, "aw3", "appwrapper", "aw3")
    async with Observer(testbed.nats_url) as obs:
        await obs.wait_last(OBS, aw_subject, AppWrapperObservation, lambda m: not m.deleted)
        pod_name = await first_pod(kc, namespace)
        pod_subject = subjects.appwrapper_obs(namespace, "aw3", "pod", pod_name)
        await obs.wait_last(OBS, pod_subject, PodObservation, lambda m: not m.deleted)

        watcher.kill()
        kubectl(kc, "delete", "appwrapper", "aw3", "-n", namespace, "--wait=true")
        # The garbage collector may be deleting the pod already (its Job is the AppWrapper's):
        # gone is what counts, by whichever hand.
        kubectl(kc, "delete", "pod", pod_name, "-n", namespace, "--grace-period=0", "--force", check=False)
        await until(
            "the pod gone",
            lambda: kubectl(kc, "get", "pod", pod_name, "-n", namespace, check=False).returncode != 0,
        )
        # Still the last states: nobody was watching.
        before = await obs.last(OBS, aw_subject, AppWrapperObservation)
        assert before is not None and not before.deleted

        service("watcher", instance="2")
        aw = await obs.wait_last(OBS, aw_subject, AppWrapperObservation, lambda m: m.deleted)
        assert aw.ref.name == "aw3"
        pod = await obs.wait_last(OBS, pod_subject, PodObservation, lambda m: m.deleted)
        assert pod.appwrapper == "aw3"
        stored = await obs.nc.jetstream().get_last_msg(OBS, aw_subject)
        # The services run with the default configuration here.
        assert stored.headers[TTL_HEADER] == ttl_value(OperatorConfig().nats.tombstone_ttl.total_seconds())


async def test_a_component_that_left_its_appwrappers_control_while_no_watcher_ran_gets_a_tombstone(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    # The new watcher's list finds the object, but no longer as a component: its stored state
    # (a component health still counts) must not stand.
    kc = testbed.kubeconfig
    watcher = service("watcher")
    submit_with_job(kc, namespace, "aw6", "aw6-job")
    subject = subjects.appwrapper_obs(namespace, "aw6", "component", "Job.aw6-job")
    async with Observer(testbed.nats_url) as obs:
        await obs.wait_last(OBS, subject, ComponentObservation, lambda m: not m.deleted)
        watcher.kill()
        remove = '[{"op": "remove", "path": "/metadata/ownerReferences"}]'
        kubectl(kc, "patch", "job", "aw6-job", "-n", namespace, "--type=json", "-p", remove)
        before = await obs.last(OBS, subject, ComponentObservation)
        assert before is not None and not before.deleted

        service("watcher", instance="2")
        gone = await obs.wait_last(OBS, subject, ComponentObservation, lambda m: m.deleted)
        assert gone.ref.name == "aw6-job"


async def test_a_pod_that_leaves_its_appwrappers_owner_tree_is_replaced_by_a_tombstone(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    watcher = service("watcher")
    apply(kc, namespace, manifests.job_appwrapper("aw4", suspend=True))
    uid = sim.get_json(kc, "appwrapper", "aw4", "-n", namespace)["metadata"]["uid"]
    # A pod that is a component of aw4 itself: attributed without any lookup.
    pod = manifests.pod("p", labels={APPWRAPPER_LABEL: "aw4"})
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": API_VERSION, "kind": KIND, "name": "aw4", "uid": uid, "controller": True}
    ]
    apply(kc, namespace, pod)
    subject = subjects.appwrapper_obs(namespace, "aw4", "pod", "p")
    async with Observer(testbed.nats_url) as obs:
        await obs.wait_last(OBS, subject, PodObservation, lambda m: not m.deleted)
        # Its owner reference removed, only the label says it is aw4's: that no longer counts.
        remove = '[{"op": "remove", "path": "/metadata/ownerReferences"}]'
        kubectl(kc, "patch", "pod", "p", "-n", namespace, "--type=json", "-p", remove)
        gone = await obs.wait_last(OBS, subject, PodObservation, lambda m: m.deleted)
        assert gone.ref.name == "p"
    assert 'respawn_watcher_pods_unattributed_total{reason="no-owner"}' in watcher.metrics()


async def test_when_an_appwrapper_wraps_a_pod_the_pods_of_a_wrapped_job_are_observed_as_pods_only(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    """An AppWrapper that wraps a Pod makes the watcher watch every labelled pod as a possible
    component. Only those its AppWrapper controls are components: a wrapped Job's pods are
    published as pods, and a component whose controller goes away gets a tombstone."""
    kc = testbed.kubeconfig
    service("watcher")
    wrapped = manifests.appwrapper("bare", manifests.component(manifests.pod("bare-pod")), suspend=True)
    apply(kc, namespace, wrapped)
    bare_uid = sim.get_json(kc, "appwrapper", "bare", "-n", namespace)["metadata"]["uid"]
    bare_pod = manifests.pod("bare-pod", labels={APPWRAPPER_LABEL: "bare"})
    bare_pod["metadata"]["ownerReferences"] = [
        {"apiVersion": API_VERSION, "kind": KIND, "name": "bare", "uid": bare_uid, "controller": True}
    ]
    component = subjects.appwrapper_obs(namespace, "bare", "component", "Pod.bare-pod")
    async with Observer(testbed.nats_url) as obs:
        apply(kc, namespace, bare_pod)
        await obs.wait_last(OBS, component, ComponentObservation, lambda m: not m.deleted)

        submit_with_job(kc, namespace, "aw", "aw-job")
        [job_pod] = await until(
            "the Job's pod",
            lambda: [
                p["metadata"]["name"]
                for p in sim.get_json(kc, "pods", "-n", namespace)["items"]
                if p["metadata"]["labels"].get(APPWRAPPER_LABEL) == "aw"
            ],
        )
        running = subjects.appwrapper_obs(namespace, "aw", "pod", job_pod)
        await obs.wait_last(OBS, running, PodObservation, lambda m: m.phase == "Running")

        # The component leaves its AppWrapper's control: its last state is replaced by a
        # tombstone. The component watch delivers this after the Job's pod's events, so by then
        # it has seen that pod too.
        remove = '[{"op": "remove", "path": "/metadata/ownerReferences"}]'
        kubectl(kc, "patch", "pod", "bare-pod", "-n", namespace, "--type=json", "-p", remove)
        await obs.wait_last(OBS, component, ComponentObservation, lambda m: m.deleted)
        info = await obs.nc.jetstream().stream_info(
            OBS, subjects_filter=subjects.appwrapper_obs_filter(namespace, "aw")
        )
        components = sorted(s for s in info.state.subjects or {} if ".component." in s)
        assert components == [subjects.appwrapper_obs(namespace, "aw", "component", "Job.aw-job")]
