"""Autopilot end to end: anti-affinity at creation, migration off an EVICT node, node exclusion on retry.

All four services run as separate processes. Nodes are shared by the whole test session, so every
label set here is removed in a ``finally``, and the test waits until autopilot has published the
cleared node verdict, so no later test inherits an unhealthy node.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from shared import subjects
from shared.messages import LifecycleEvent, NodeVerdict
from tests.integration.conftest import ServiceFactory
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

GPU = "nvidia.com/gpu"
HEALTH_LABEL = "autopilot.ibm.com/gpuhealth"
EXCLUDED = "respawn.dev/excluded-nodes"


def appwrapper(name: str, *, gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    fast = {
        "workload.codeflare.dev.appwrapper/failureGracePeriodDuration": "0s",
        "workload.codeflare.dev.appwrapper/retryPausePeriodDuration": "1s",
    }
    return manifests.job_appwrapper(name, gpus=gpus, annotations={**fast, **(annotations or {})})


def get(kc: Path, *args: str) -> Any:
    return sim.get_json(kc, *args)


async def poll(check: Callable[[], Any], *, within: float = 60, what: str) -> Any:
    return await until(what, check, within=within)


def running_pods(kc: Path, namespace: str, aw: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(
        kc, "pods", "-n", namespace, "-l", f"workload.codeflare.dev/appwrapper={aw}"
    )["items"]
    return [
        p
        for p in items
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def status(kc: Path, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = get(kc, "appwrapper", name, "-n", namespace).get("status", {})
    return result


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
    kubectl(kc, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(appwrapper("gpu", gpus=1)))
    kubectl(kc, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(appwrapper("cpu", gpus=0)))
    gpu_pod = (await poll(lambda: running_pods(kc, namespace, "gpu"), what="the GPU pod running"))[0]
    cpu_pod = (await poll(lambda: running_pods(kc, namespace, "cpu"), what="the CPU pod running"))[0]
    terms = gpu_pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = [e for t in terms["nodeSelectorTerms"] for e in t.get("matchExpressions", [])]
    assert {"key": HEALTH_LABEL, "operator": "NotIn", "values": ["TESTING", "EVICT"]} in expressions
    assert "affinity" not in cpu_pod["spec"], "a pod that uses no GPU is left alone"


async def test_evict_label_migrates_without_counting_and_new_pods_avoid_the_node(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, all_services: None, node_labels: list[str]
) -> None:
    kc = testbed.kubeconfig
    # 8 GPUs: the pod fills a whole node, so "avoids the node" is about placement, not luck.
    kubectl(kc, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(appwrapper("mig", gpus=8)))
    pod = (await poll(lambda: running_pods(kc, namespace, "mig"), what="the pod running"))[0]
    node = pod["spec"]["nodeName"]
    await poll(lambda: status(kc, namespace, "mig").get("phase") == "Running", what="AppWrapper Running")
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
        new = (
            await poll(
                lambda: [
                    p
                    for p in running_pods(kc, namespace, "mig")
                    if p["metadata"]["uid"] != pod["metadata"]["uid"]
                ],
                what="the recreated pod running",
            )
        )[0]
        assert new["spec"]["nodeName"] != node
        final = await poll(
            lambda: (s := status(kc, namespace, "mig")).get("phase") == "Running" and s, what="Running again"
        )
        assert final.get("resettingCount", 0) == 0, "an Autopilot migration does not count as a retry"
        unhealthy = next(c for c in final["conditions"] if c["type"] == "Unhealthy")
        assert unhealthy["status"] == "False"
    finally:
        sim.label_node(kc, node, HEALTH_LABEL, None)
        await wait_node_cleared(testbed.nats_url, [node])


async def test_failed_pod_node_is_excluded_on_retry(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, all_services: None
) -> None:
    kc = testbed.kubeconfig
    kubectl(kc, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(appwrapper("ex", gpus=8)))
    kubectl(
        kc,
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=json.dumps(appwrapper("optout", gpus=0, annotations={"respawn.dev/node-exclusion": "false"})),
    )
    pod = (await poll(lambda: running_pods(kc, namespace, "ex"), what="the pod running"))[0]
    optout_pod = (await poll(lambda: running_pods(kc, namespace, "optout"), what="the opt-out pod running"))[
        0
    ]
    await poll(lambda: status(kc, namespace, "ex").get("phase") == "Running", what="Running")
    await poll(lambda: status(kc, namespace, "optout").get("phase") == "Running", what="Running")
    sim.fail_pod(kc, namespace, pod["metadata"]["name"], exit_code=1)
    sim.fail_pod(kc, namespace, optout_pod["metadata"]["name"], exit_code=1)
    await poll(lambda: status(kc, namespace, "ex").get("resettingCount") == 1, what="one reset")
    annotations = get(kc, "appwrapper", "ex", "-n", namespace)["metadata"]["annotations"]
    assert annotations[EXCLUDED] == pod["spec"]["nodeName"]
    new = (
        await poll(
            lambda: [
                p for p in running_pods(kc, namespace, "ex") if p["metadata"]["uid"] != pod["metadata"]["uid"]
            ],
            what="the recreated pod running",
        )
    )[0]
    assert new["spec"]["nodeName"] != pod["spec"]["nodeName"]
    fields = [
        f
        for t in new["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        for f in t.get("matchFields", [])
    ]
    assert {"key": "metadata.name", "operator": "NotIn", "values": [pod["spec"]["nodeName"]]} in fields
    events = get(kc, "events", "-n", namespace, "--field-selector", "involvedObject.name=ex")["items"]
    assert any(e["reason"] == "NodesExcluded" for e in events)

    await poll(lambda: status(kc, namespace, "optout").get("resettingCount") == 1, what="opt-out reset")
    assert EXCLUDED not in get(kc, "appwrapper", "optout", "-n", namespace)["metadata"].get("annotations", {})
