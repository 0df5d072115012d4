"""Autopilot end to end: anti-affinity at creation, migration off an EVICT node, node exclusion on retry.

All four services run as separate processes. Nodes are shared by the whole test session, so every
label set here is removed in a ``finally``, and the test waits until autopilot has published the
cleared node verdict, so no later test inherits an unhealthy node.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.modes import Endpoints
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.messages import LifecycleEvent, NodeVerdict
from tests.integration.conftest import ServiceFactory
from tests.integration.objects import (
    FAST_RESET,
    apply,
    events_when,
    get_appwrapper,
    running_pods,
    wait_phase,
)
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

GPU = manifests.GPU
HEALTH_LABEL = "autopilot.ibm.com/gpuhealth"
EXCLUDED = "respawn.dev/excluded-nodes"


def appwrapper(name: str, *, gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return manifests.job_appwrapper(name, gpus=gpus, annotations={**FAST_RESET, **(annotations or {})})


def get(kc: Path, *args: str) -> Any:
    return sim.get_json(kc, *args)


async def recreated(kc: Path, namespace: str, name: str, old: dict[str, Any]) -> dict[str, Any]:
    """A running pod of the AppWrapper ``name`` other than ``old``."""
    others = await until(
        "the recreated pod running",
        lambda: [
            p for p in running_pods(kc, namespace, name) if p["metadata"]["uid"] != old["metadata"]["uid"]
        ],
        within=60,
    )
    return others[0]


async def running(kc: Path, namespace: str, name: str) -> dict[str, Any]:
    """The AppWrapper once it is Running."""
    return await wait_phase(kc, namespace, name, "Running", within=60)


@pytest.fixture
def all_services(service: ServiceFactory) -> None:
    for name in ("watcher", "autopilot", "health", "lifecycle"):
        service(name)


@pytest.fixture
def node_labels(testbed: Endpoints) -> Iterator[list[str]]:
    """Nodes whose health label a test set; cleared afterwards, and the clearing observed."""
    touched: list[str] = []
    yield touched
    for node in touched:
        sim.label_node(testbed.kubeconfig, node, HEALTH_LABEL, None)


async def wait_node_cleared(nats_url: str, nodes: list[str]) -> None:
    async with Observer(nats_url) as obs:
        await obs.wait_last(
            subjects.NODE_VERDICTS_STREAM,
            subjects.node_verdict(GPU),
            NodeVerdict,
            lambda v: not set(nodes) & set(v.no_execute + v.no_schedule + v.prefer_no_schedule),
        )


async def test_gpu_pods_get_anti_affinity_and_others_do_not(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, all_services: None
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, appwrapper("gpu", gpus=1))
    apply(kc, namespace, appwrapper("cpu", gpus=0))
    gpu_pod = (await until("the GPU pod running", lambda: running_pods(kc, namespace, "gpu"), within=60))[0]
    cpu_pod = (await until("the CPU pod running", lambda: running_pods(kc, namespace, "cpu"), within=60))[0]
    terms = gpu_pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = [e for t in terms["nodeSelectorTerms"] for e in t.get("matchExpressions", [])]
    assert {"key": HEALTH_LABEL, "operator": "NotIn", "values": ["TESTING", "EVICT"]} in expressions
    assert "affinity" not in cpu_pod["spec"], "a pod that uses no GPU is left alone"


async def test_evict_label_migrates_without_counting_and_new_pods_avoid_the_node(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, all_services: None, node_labels: list[str]
) -> None:
    kc = testbed.kubeconfig
    # 8 GPUs: the pod fills a whole node, so "avoids the node" is about placement, not luck.
    apply(kc, namespace, appwrapper("mig", gpus=8))
    pod = (await until("the pod running", lambda: running_pods(kc, namespace, "mig"), within=60))[0]
    node = pod["spec"]["nodeName"]
    await running(kc, namespace, "mig")
    node_labels.append(node)
    try:
        sim.label_node(kc, node, HEALTH_LABEL, "EVICT")
        async with Observer(testbed.nats_url) as obs:
            event = await obs.wait_last(
                subjects.LIFECYCLE_STREAM,
                subjects.lifecycle_event(namespace, "mig"),
                LifecycleEvent,
                lambda e: e.event == "ResetStarted",
                within=60,
            )
        assert event.reason == "AutopilotNoExecute"
        assert node in event.nodes
        new = await recreated(kc, namespace, "mig", pod)
        assert new["spec"]["nodeName"] != node
        final = read_appwrapper(await running(kc, namespace, "mig"))
        assert final.resetting_count == 0, "an Autopilot migration does not count as a retry"
        assert final.condition("Unhealthy")["status"] == "False"
    finally:
        sim.label_node(kc, node, HEALTH_LABEL, None)
        await wait_node_cleared(testbed.nats_url, [node])


async def test_failed_pod_node_is_excluded_on_retry(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, all_services: None
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, appwrapper("ex", gpus=8))
    opted_out = {"respawn.dev/node-exclusion": "false"}
    apply(kc, namespace, appwrapper("optout", gpus=0, annotations=opted_out))
    pod = (await until("the pod running", lambda: running_pods(kc, namespace, "ex"), within=60))[0]
    optout_pod = (
        await until("the opt-out pod running", lambda: running_pods(kc, namespace, "optout"), within=60)
    )[0]
    await running(kc, namespace, "ex")
    await running(kc, namespace, "optout")
    # An eviction is the infrastructure's doing: its node is blamed. (A lone pod that fails with
    # an error of its own is the application's fault, which blames no node: docs/failures.md.)
    sim.evict_pod(kc, namespace, pod["metadata"]["name"])
    sim.evict_pod(kc, namespace, optout_pod["metadata"]["name"])
    await until(
        "one (transient) reset",
        lambda: get_appwrapper(kc, namespace, "ex"),
        done=lambda aw: (aw or {}).get("status", {}).get("transientRetryCount") == 1,
        within=60,
    )
    # The exclusion is patched in the same pass as the reset's status write, just after it (a
    # metadata patch first would void the status write's resourceVersion precondition).
    recorded = await until(
        "the failed pod's node recorded as excluded",
        lambda: get(kc, "appwrapper", "ex", "-n", namespace)["metadata"].get("annotations", {}),
        done=lambda annotations: EXCLUDED in annotations,
        within=30,
    )
    assert recorded[EXCLUDED] == pod["spec"]["nodeName"]
    new = await recreated(kc, namespace, "ex", pod)
    assert new["spec"]["nodeName"] != pod["spec"]["nodeName"]
    fields = [
        f
        for t in new["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        for f in t.get("matchFields", [])
    ]
    assert {"key": "metadata.name", "operator": "NotIn", "values": [pod["spec"]["nodeName"]]} in fields
    await events_when(
        kc, namespace, "ex", "NodesExcluded", lambda es: any(e["reason"] == "NodesExcluded" for e in es)
    )

    await until(
        "opt-out reset",
        lambda: get_appwrapper(kc, namespace, "optout"),
        done=lambda aw: (aw or {}).get("status", {}).get("transientRetryCount") == 1,
        within=60,
    )
    assert EXCLUDED not in get(kc, "appwrapper", "optout", "-n", namespace)["metadata"].get("annotations", {})
