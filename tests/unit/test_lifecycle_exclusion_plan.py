"""Node exclusion is part of the reset's plan: which nodes to record, decided by the pure machine.

No server and no clock: the nodes are part of what was observed, ``now`` is an argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.lifecycle.actions import EmitEvent, ExcludeNodes, LifecycleEventType, PublishLifecycleEvent
from services.lifecycle.machine import Plan, reconcile
from services.lifecycle.observed import Observed, ObservedComponent, ObservedNode, Presence
from services.lifecycle.placement.exclusion import EXCLUDED_NODES_ANNOTATION, NODE_EXCLUSION_ANNOTATION
from shared.config import NodeExclusionConfig
from tests.unit.test_lifecycle_machine import PARAMS, T0, job, of, running, verdict

ON = NodeExclusionConfig(enabled=True, max_nodes=8)
NOW = T0 + PARAMS.failure_grace
NODES = (ObservedNode("n1"), ObservedNode("n2"), ObservedNode("n3"))


def seen(nodes: tuple[ObservedNode, ...] | None = NODES) -> Observed:
    return Observed(components=(ObservedComponent(Presence.PRESENT, name="c0"),), pods=(), nodes=nodes)


def reset(
    aw: dict[str, Any],
    observed: Observed | None = None,
    *,
    exclusion: NodeExclusionConfig | None = ON,
    **verdict_fields: Any,
) -> Plan:
    fields = {"nodes": ("n1",), **verdict_fields}
    return reconcile(
        aw, seen() if observed is None else observed, verdict(**fields), PARAMS, NOW, node_exclusion=exclusion
    )


def excluded(plan: Plan) -> list[tuple[str, ...]]:
    return [a.nodes for a in of(plan, ExcludeNodes)]


def nodes_excluded_events(plan: Plan) -> list[str]:
    return [e.message for e in of(plan, EmitEvent) if e.reason == "NodesExcluded"]


def annotated(aw: dict[str, Any], **annotations: str) -> dict[str, Any]:
    aw["metadata"]["annotations"] = annotations
    return aw


def _gpu_running(template: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    aw = running()
    aw["spec"]["components"][0]["template"] = template
    return annotated(aw, **annotations)


def gpu_node(name: str, gpus: int = 8, **kw: Any) -> ObservedNode:
    return ObservedNode(name, allocatable={"nvidia.com/gpu": str(gpus)}, **kw)


def test_a_reset_after_failed_pods_records_their_nodes_in_the_same_plan() -> None:
    plan = reset(running())
    assert plan.status is not None and plan.status["resettingCount"] == 1
    assert excluded(plan) == [("n1",)]
    assert nodes_excluded_events(plan) == ["excluding node(s) n1 where pods failed"]
    # Recorded as part of the reset it belongs to, after the reset is announced.
    kinds = [
        a.event.event if isinstance(a, PublishLifecycleEvent) else type(a).__name__
        for a in plan.actions
        if isinstance(a, PublishLifecycleEvent | ExcludeNodes)
    ]
    assert kinds == [LifecycleEventType.PHASE_CHANGED, LifecycleEventType.RESET_STARTED, "ExcludeNodes"]


def test_the_first_pass_of_an_unhealthy_verdict_records_them_from_the_nodes_alone() -> None:
    # The urgent first pass reads neither components nor pods; the nodes come from a cache.
    plan = reset(running(), Observed(nodes=NODES))
    assert excluded(plan) == [("n1",)]


def test_a_node_that_fails_again_moves_to_the_newest_end() -> None:
    aw = annotated(running(), **{EXCLUDED_NODES_ANNOTATION: "n1,n2"})
    assert excluded(reset(aw)) == [("n2", "n1")]
    four = seen((*NODES, ObservedNode("n4")))
    assert excluded(reset(aw, four, nodes=("n3",))) == [("n1", "n2", "n3")]


def test_nothing_is_recorded_when_the_annotation_already_says_it() -> None:
    aw = annotated(running(), **{EXCLUDED_NODES_ANNOTATION: "n1"})
    plan = reset(aw)
    assert plan.status is not None, "the reset itself happens"
    assert not excluded(plan) and not nodes_excluded_events(plan)


def test_no_exclusion_without_a_reset_after_failed_pods() -> None:
    # An Autopilot migration: anti-affinity already keeps pods off flagged nodes.
    assert not excluded(reset(running(), reason="AutopilotNoExecute", counts_toward_retry=False))
    # The retry limit is reached: the AppWrapper fails, nothing is recreated.
    last = dataclasses.replace(PARAMS, retry_limit=0)
    plan = reconcile(running(), seen(), verdict(nodes=("n1",)), last, NOW, node_exclusion=ON)
    assert plan.phase == "Failed" and not excluded(plan)
    # Pods that never ran on a node.
    assert not excluded(reset(running(), nodes=()))


def test_no_exclusion_when_it_is_off_opted_out_or_the_nodes_are_unknown() -> None:
    assert not excluded(reset(running(), exclusion=None))
    assert not excluded(reset(running(), exclusion=NodeExclusionConfig(enabled=False)))
    assert not excluded(reset(annotated(running(), **{NODE_EXCLUSION_ANNOTATION: "false"})))
    plan = reset(running(), seen(nodes=None))
    assert plan.status is not None and not excluded(plan), "the reset does not wait for the nodes"


def test_the_list_is_bounded_oldest_first() -> None:
    aw = annotated(running(), **{EXCLUDED_NODES_ANNOTATION: "n2,n3"})
    plan = reset(aw, exclusion=NodeExclusionConfig(max_nodes=2))
    assert excluded(plan) == [("n3", "n1")]
    assert "no longer excluding n2: at most 2 nodes are excluded" in nodes_excluded_events(plan)[0]


def test_exclusion_never_leaves_a_workload_with_too_few_nodes() -> None:
    # Two pods of 8 GPUs need two 8-GPU nodes: with n0 and n1 excluded only n2 would be left.
    aw = _gpu_running(_gpu_job(pods=2, gpus=8), {EXCLUDED_NODES_ANNOTATION: "n0"})
    nodes = (gpu_node("n0"), gpu_node("n1"), gpu_node("n2"))
    plan = reset(aw, seen(nodes))
    assert excluded(plan) == [("n1",)]
    assert "no longer excluding n0: otherwise no node would be left" in nodes_excluded_events(plan)[0]


def test_only_nodes_that_accept_pods_count_as_room() -> None:
    aw = _gpu_running(_gpu_job(pods=2, gpus=8), {})
    ready = (gpu_node("n1"), gpu_node("n2"), gpu_node("n3"))
    assert excluded(reset(aw, seen(ready))) == [("n1",)]
    # n3 cordoned or not Ready: excluding n1 would leave one node for two pods, so it is not.
    for n3 in (gpu_node("n3", unschedulable=True), gpu_node("n3", ready=False)):
        plan = reset(aw, seen((gpu_node("n1"), gpu_node("n2"), n3)))
        assert plan.status is not None and not excluded(plan)


def _gpu_job(*, pods: int, gpus: int) -> dict[str, Any]:
    template = job("c0", parallelism=pods)
    template["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return template
