"""Node quarantine end to end: a node that fails three workloads is avoided by a fourth.

All four services run as separate processes on the testbed. Each of the three failing workloads
has two pods, kept on the bad node and one other node; only the pod on the bad node fails, so
health judges an infrastructure fault that blames the bad node (every pod failing together would
be an application fault that blames none; docs/failures.md). Autopilot counts three, quarantines
the node, and lifecycle keeps the next workload's pods off it.

The nodes are shared by the whole test session: the quarantine is short, and the test waits for
its end, so no later test inherits a quarantined node.

A quarantine past its end, with no autopilot running to publish the release, keeps no pod off.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.modes import Endpoints
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.kubetime import utcnow
from shared.messages import QUARANTINE_RESOURCE, NodeVerdict, ObjectRef, QuarantinedNode, Verdict
from tests.integration.cli import respawn
from tests.integration.conftest import ServiceFactory
from tests.integration.healthfeed import metric
from tests.integration.objects import FAST_RESET, apply, get_appwrapper, on_nodes, running_pods, wait_phase
from tests.integration.observe import Observer
from tests.nats_fixtures import connected_bus
from tests.waiting import until

pytestmark = pytest.mark.testbed

GPU = manifests.GPU
BAD = "kwok-node-1"
GOOD = ("kwok-node-0", "kwok-node-2", "kwok-node-3")
QUARANTINE = {
    "RESPAWN_NODE_QUARANTINE_ENABLED": "true",
    "RESPAWN_NODE_QUARANTINE_THRESHOLD": "3",
    "RESPAWN_NODE_QUARANTINE_WINDOW": "3m",
    "RESPAWN_NODE_QUARANTINE_DURATION": "20s",
    # 4 nodes: one place.
    "RESPAWN_NODE_QUARANTINE_MAX_SHARE": "0.25",
}


async def all_running(kc: Path, namespace: str, name: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = await until(
        f"{count} pods of {name} running",
        lambda: running_pods(kc, namespace, name),
        done=lambda pods: len(pods) == count,
        within=60,
    )
    return found


async def forget_earlier_verdicts(nats_url: str) -> None:
    """The session's streams outlive a test: the autopilot started next would replay the
    infrastructure faults of earlier tests (on the same four nodes) and could quarantine one of
    them first, taking the one place the cap leaves; and a quarantine an earlier test's
    autopilot published (quarantine is on by default, for an hour) is still in force for the
    lifecycle and the autopilot started here. Start from empty streams."""
    async with connected_bus(nats_url) as bus:
        await bus.js.purge_stream(subjects.VERDICTS_STREAM)
        await bus.js.purge_stream(
            subjects.NODE_VERDICTS_STREAM, subject=subjects.node_verdict(QUARANTINE_RESOURCE)
        )


async def quarantine_verdict(nats_url: str, check: Any, within: float) -> NodeVerdict:
    async with Observer(nats_url) as obs:
        return await obs.wait_last(
            subjects.NODE_VERDICTS_STREAM,
            subjects.node_verdict(QUARANTINE_RESOURCE),
            NodeVerdict,
            check,
            within=within,
        )


async def test_a_node_that_fails_three_workloads_is_avoided_by_a_fourth(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    await forget_earlier_verdicts(testbed.nats_url)
    for name in ("watcher", "health"):
        service(name)
    service("autopilot", env=QUARANTINE)
    lifecycle = service("lifecycle")
    # Failed at once (no retry), so their pods go and leave the nodes free for the fourth.
    no_retry = {**FAST_RESET, **manifests.fault_tolerance(retry_limit=0)}
    quarantined = False
    try:
        for i, other in enumerate(GOOD):
            name = f"fails-{i}"
            aw = manifests.job_appwrapper(name, pods=2, gpus=8, annotations=no_retry)
            apply(kc, namespace, on_nodes(aw, (BAD, other)))
            pods = await all_running(kc, namespace, name, 2)
            [on_bad] = [p for p in pods if p["spec"]["nodeName"] == BAD]
            sim.fail_pod(kc, namespace, on_bad["metadata"]["name"], exit_code=1)
            await wait_phase(kc, namespace, name, "Failed", within=60)

        verdict = await quarantine_verdict(testbed.nats_url, lambda v: BAD in v.no_schedule, within=30)
        quarantined = True
        [entry] = [e for e in verdict.quarantine if e.node == BAD]
        assert entry.state == "Quarantined"
        assert entry.failures == 3
        assert entry.workloads == tuple(f"{namespace}/fails-{i}" for i in range(3))
        # `respawn status` shows it, and why.
        env = {**os.environ, "KUBECONFIG": str(kc), "NATS_URL": testbed.nats_url}
        shown = respawn("status", "-n", namespace, "-o", "json", env=env)
        assert shown.returncode == 0, shown.stderr
        [row] = [r for r in json.loads(shown.stdout)["nodeQuarantine"] if r["node"] == BAD]
        assert (row["state"], row["failures"]) == ("Quarantined", 3)
        assert row["workloads"] == list(entry.workloads)
        table = respawn("status", "-n", namespace, env=env).stdout
        assert "Node quarantine:" in table and BAD in table
        # Lifecycle has it before the fourth workload is submitted.
        await until(
            "lifecycle to know the quarantine",
            lambda: metric(lifecycle, "respawn_lifecycle_quarantined_nodes") == 1,
            within=30,
        )
        await until(
            "the failed workloads' pods gone",
            lambda: [p for i in range(3) for p in running_pods(kc, namespace, f"fails-{i}")],
            done=lambda left: not left,
            within=60,
        )

        # Three whole-node pods, free to go anywhere: the three good nodes, never the bad one.
        apply(kc, namespace, manifests.job_appwrapper("fourth", pods=3, gpus=8, annotations=FAST_RESET))
        pods = await all_running(kc, namespace, "fourth", 3)
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(GOOD)
        for pod in pods:
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            fields = [f for t in terms["nodeSelectorTerms"] for f in t.get("matchFields", [])]
            assert {"key": "metadata.name", "operator": "NotIn", "values": [BAD]} in fields
        assert read_appwrapper(get_appwrapper(kc, namespace, "fourth")).resetting_count == 0
    finally:
        # The quarantine ends after its 20 s; later tests find every node usable again.
        if quarantined:
            await quarantine_verdict(testbed.nats_url, lambda v: BAD not in v.no_schedule, within=90)


MARKED = "kwok-node-2"
MARK = "respawn.dev/quarantined"


def marks_on(kc: Path, node: str) -> tuple[str | None, list[dict[str, str]]]:
    """The node's quarantine label value and its quarantine taints."""
    found = sim.get_json(kc, "node", node)
    taints = [t for t in found["spec"].get("taints") or [] if t["key"] == MARK]
    return found["metadata"].get("labels", {}).get(MARK), taints


async def test_a_quarantined_node_is_labelled_and_tainted_until_its_quarantine_ends(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    await forget_earlier_verdicts(testbed.nats_url)
    service("watcher")  # the nodes, their labels and taints
    service(
        "autopilot",
        env={
            **QUARANTINE,
            "RESPAWN_NODE_QUARANTINE_DURATION": "5s",
            "RESPAWN_NODE_QUARANTINE_NODE_LABEL": MARK,
            "RESPAWN_NODE_QUARANTINE_NODE_TAINT": MARK,
        },
    )
    # Verdicts as health publishes them: three workloads' infrastructure faults on the node.
    async with connected_bus(testbed.nats_url) as bus:
        for i in range(3):
            name = f"marks-{i}"
            verdict = Verdict(
                ref=ObjectRef(namespace=namespace, name=name, uid=f"uid-{namespace}-{name}"),
                state="Unhealthy",
                reason="FoundFailedPods",
                nodes=(MARKED,),
                decided_at=utcnow(),
                failure_class="Unknown",
                failure_code="ExitCode:1",
                fault_kind="Infrastructure",
            )
            await bus.publish(subjects.verdict(namespace, name), verdict, msg_id=None)
    try:
        _, taints = await until(
            "the node labelled and tainted",
            lambda: marks_on(kc, MARKED),
            done=lambda marks: marks[0] == "true" and len(marks[1]) == 1,
            within=30,
        )
        assert taints == [{"key": MARK, "value": "true", "effect": "NoSchedule"}]
    finally:
        # Removed when the quarantine ends, 5 s later: later tests find the node as it was.
        await until(
            "the marks removed",
            lambda: marks_on(kc, MARKED),
            done=lambda marks: marks == (None, []),
            within=60,
        )


async def test_a_quarantine_past_its_end_keeps_no_pod_off_while_no_autopilot_runs(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    """The last quarantine verdict says the bad node is quarantined, but its end has passed and
    no autopilot runs to publish the release: a new workload may use the node."""
    kc = testbed.kubeconfig
    await forget_earlier_verdicts(testbed.nats_url)
    now = utcnow()
    ended = QuarantinedNode(
        node=BAD,
        state="Quarantined",
        failures=3,
        workloads=("a/one", "a/three", "a/two"),
        since=now - timedelta(minutes=2),
        until=now - timedelta(seconds=1),
    )
    stale = NodeVerdict(
        resource=QUARANTINE_RESOURCE,
        no_schedule=(BAD,),
        decided_at=now - timedelta(minutes=2),
        quarantine=(ended,),
    )
    async with connected_bus(testbed.nats_url) as bus:
        await bus.publish(subjects.node_verdict(QUARANTINE_RESOURCE), stale, msg_id=None)
    try:
        for name in ("watcher", "health"):
            service(name)
        lifecycle = service("lifecycle")
        # It has the verdict (its set still names the node) before the workload is submitted.
        await until(
            "lifecycle to read the quarantine verdict",
            lambda: metric(lifecycle, "respawn_lifecycle_quarantined_nodes") == 1,
            within=30,
        )
        apply(
            kc,
            namespace,
            on_nodes(manifests.job_appwrapper("after", pods=1, gpus=8, annotations=FAST_RESET), (BAD,)),
        )
        [pod] = await all_running(kc, namespace, "after", 1)
        assert pod["spec"]["nodeName"] == BAD
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        fields = [f for t in terms["nodeSelectorTerms"] for f in t.get("matchFields", [])]
        assert {"key": "metadata.name", "operator": "NotIn", "values": [BAD]} not in fields
    finally:
        await forget_earlier_verdicts(testbed.nats_url)
