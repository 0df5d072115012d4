"""A pod that fails and is deleted while the watcher still reads its owners is judged all the same.

The watcher publishes a pod only once its controller chain is known to lead to the AppWrapper its
label names; until then the pod is held. A wrapped Deployment's pod points at a ReplicaSet, which
the watcher reads by a GET. Here the API server (through the fault proxy) answers those GETs with
503, so the pod stays held while the test fails it and deletes it, as a controller that replaces
failed pods at once does. Once the GETs are answered again, the pod's failure must still reach
health and reset the AppWrapper once: its tombstone alone would leave the failure unseen.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from respawn.testbed import sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.messages import PodObservation
from tests.integration.conftest import ServiceFactory
from tests.integration.faultproxy import FaultProxy
from tests.integration.healthfeed import metric
from tests.integration.objects import apply, deployment_appwrapper, labelled_pods, wait_phase
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

REPLICASET_GETS = ("replicasets", "get")


async def test_a_pod_that_fails_and_is_deleted_while_its_owners_are_read_still_resets_its_appwrapper(
    testbed: Endpoints,
    appwrapper_crd: Path,
    namespace: str,
    scripted: FaultProxy,
    service: ServiceFactory,
    tmp_path: Path,
) -> None:
    kc = testbed.kubeconfig
    scripted.policy.refuse(*REPLICASET_GETS)
    watcher = service("watcher", env={"KUBECONFIG": str(scripted.kubeconfig(tmp_path, client="watcher"))})
    service("health")
    service("lifecycle")

    apply(kc, namespace, deployment_appwrapper("web"))
    [first] = await until("the Deployment's pod", lambda: labelled_pods(kc, namespace, "web"), within=60)
    name = first["metadata"]["name"]
    await until(
        "the watcher to hold the pod while it cannot read its ReplicaSet",
        lambda: metric(watcher, "respawn_watcher_pods_held"),
        done=lambda held: held >= 1,
    )
    # The pod is held as soon as its owner is found unknown, before the GET for it is answered:
    # wait for that GET's refusal rather than expect it already counted.
    await until(
        "the watcher's GET of the ReplicaSet refused",
        lambda: scripted.tally.counts()[("watcher", *REPLICASET_GETS, "503")],
        done=lambda refused: refused >= 1,
    )

    sim.fail_pod(kc, namespace, name, exit_code=1)
    kubectl(kc, "delete", "pod", name, "-n", namespace, "--grace-period=0", "--force", "--wait=false")
    await until(
        "the failed pod to be gone",
        lambda: [p for p in labelled_pods(kc, namespace, "web") if p["metadata"]["name"] == name],
        done=lambda left: not left,
    )
    subject = subjects.appwrapper_obs(namespace, "web", "pod", name)
    async with Observer(testbed.nats_url) as obs:
        # Still held: nothing of it is published, not even its tombstone.
        assert await obs.last(subjects.OBSERVATIONS_STREAM, subject, PodObservation) is None
    assert read_appwrapper(await wait_phase(kc, namespace, "web", "Running", within=60)).resetting_count == 0

    scripted.policy.forward(*REPLICASET_GETS)
    resetting = await wait_phase(kc, namespace, "web", "Resetting", within=40)
    status = read_appwrapper(resetting)
    assert status.resetting_count == 1
    assert status.condition("Unhealthy")["reason"] == "FoundFailedPods"
    again = await wait_phase(kc, namespace, "web", "Running", within=60)
    assert read_appwrapper(again).resetting_count == 1
