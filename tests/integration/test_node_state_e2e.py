"""A pod that fails because its node is gone is Transient NodeLost, end to end on the testbed.

Watcher, health, lifecycle and autopilot run as separate processes. The workload has two pods,
one on a node of this test's own (so deleting it leaves the session's nodes alone) and one on a
shared node. The test deletes its node, waits for autopilot's node-state verdict to list it, and
then fails the pod that ran there with exit code 1, which alone would be an Unknown failure (a
counted retry): with its node Deleted, the default table's row 0 makes it Transient NodeLost, a
retry that does not count toward retryLimit (docs/failures.md#node-state).

The pod is failed by the test well before the pod garbage collector would act (it removes pods
of a deleted node only after 40 s), so the classification is row 0's and not that of the
collector's ``DeletionByPodGC`` condition (row 2).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl, node_manifest
from respawn.testbed.errors import TestbedError
from respawn.testbed.modes import Endpoints
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.messages import NODE_STATE_RESOURCE, NodeVerdict, Verdict
from tests.integration.conftest import ServiceFactory
from tests.integration.objects import FAST_RESET, apply, get_appwrapper, on_nodes, running_pods
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

# Index 9: far past the session's nodes (kwok-node-0..3).
LOST = "kwok-node-9"
KEPT = "kwok-node-0"


def status(aw: dict[str, Any] | None) -> dict[str, Any]:
    found = (aw or {}).get("status")
    return found if isinstance(found, dict) else {}


async def test_a_pod_whose_node_was_deleted_fails_transient_node_lost(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    kubectl(kc, "apply", "-f", "-", stdin=node_manifest(9))
    try:
        for name in ("watcher", "health", "lifecycle", "autopilot"):
            service(name)
        # Whole-node pods (8 GPUs each), one on each of the two nodes.
        aw = manifests.job_appwrapper("lost", pods=2, gpus=8, annotations=FAST_RESET)
        apply(kc, namespace, on_nodes(aw, (LOST, KEPT)))
        pods = await until(
            "both pods running",
            lambda: running_pods(kc, namespace, "lost"),
            done=lambda found: len(found) == 2,
            within=60,
        )
        [on_lost] = [p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] == LOST]

        kubectl(kc, "delete", "node", LOST, "--wait=false")
        async with Observer(testbed.nats_url) as obs:
            lost = await obs.wait_last(
                subjects.NODE_VERDICTS_STREAM,
                subjects.node_verdict(NODE_STATE_RESOURCE),
                NodeVerdict,
                lambda v: any(e.node == LOST for e in v.lost_nodes),
                within=30,
            )
        [entry] = [e for e in lost.lost_nodes if e.node == LOST]
        assert entry.state == "Deleted"

        # The pod garbage collector removes pods of a deleted node after a while (marking them
        # Failed with DisruptionTarget DeletionByPodGC first): on a slow run it may be first.
        gc_first = False
        try:
            sim.fail_pod(kc, namespace, on_lost, exit_code=1)
        except TestbedError:
            gc_first = True
        again = await until(
            "the workload recreated after an uncounted reset",
            lambda: get_appwrapper(kc, namespace, "lost"),
            done=lambda found: status(found).get("transientRetryCount") == 1,
            within=60,
        )
        assert read_appwrapper(again).resetting_count == 0

        async with Observer(testbed.nats_url) as obs:
            verdicts = await obs.all(
                subjects.VERDICTS_STREAM, subjects.verdict_filter(namespace, "lost"), Verdict
            )
        [verdict] = [v for v in verdicts if v.state == "Unhealthy"]
        assert (verdict.failure_class, verdict.failure_code, verdict.fault_kind) == (
            "Transient",
            "NodeLost",
            "Infrastructure",
        )
        assert verdict.nodes == (LOST,)
        # Row 0 (the node's state) decided, not the exit code (or row 2, the pod GC's condition,
        # when the garbage collector failed the pod before the test did).
        rows = ("row 0", "row 2") if gc_first else ("row 0",)
        assert any(
            f"pod {on_lost} failed with NodeLost: Transient by failure table {row}" in verdict.message
            for row in rows
        ), verdict.message
    finally:
        with contextlib.suppress(Exception):
            kubectl(kc, "delete", "node", LOST, "--ignore-not-found", "--wait=false")
