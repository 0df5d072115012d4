"""Consistency mode of staged deletion: a pod on a node that does not answer is never deleted
with grace period 0; the deletion waits for the node to answer or to be deleted."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from services.lifecycle.actions import DeletePods
from services.lifecycle.deletion import staged_deletion, unreachable_pods
from services.lifecycle.machine import reconcile
from services.lifecycle.observed import Observed, ObservedComponent, ObservedNode, ObservedPod, Presence
from shared.appwrapper.constants import Phase
from tests.unit.test_lifecycle_machine import PARAMS, T0, apply, gone, running, verdict

GRACE = timedelta(minutes=10)
NODES = (ObservedNode("good", ready=True), ObservedNode("lost", ready=False))
PODS = (
    ObservedPod("a", "Running", terminating=True, node="good"),
    ObservedPod("b", "Running", terminating=True, node="lost"),
)


def deleting_status() -> dict[str, Any]:
    """A status whose deletion began at T0 with no component left."""
    step = staged_deletion({}, namespace="ns", observed=Observed(pods=PODS), forceful_grace=GRACE, now=T0)
    return {"conditions": [c for c in step.conditions if c["type"] == "DeletingResources"]}


def forced(observed: Observed, *, consistency: bool) -> list[str]:
    step = staged_deletion(
        deleting_status(),
        namespace="ns",
        observed=observed,
        forceful_grace=GRACE,
        now=T0 + GRACE + timedelta(seconds=1),
        consistency=consistency,
    )
    return [n for a in step.actions if isinstance(a, DeletePods) and a.force for n in a.names]


def test_by_default_every_pod_left_is_force_deleted_after_the_grace_period() -> None:
    assert forced(Observed(pods=PODS, nodes=NODES), consistency=False) == ["a", "b"]


def test_in_consistency_mode_a_pod_on_a_node_that_is_not_ready_is_not_force_deleted() -> None:
    assert forced(Observed(pods=PODS, nodes=NODES), consistency=True) == ["a"]


def test_once_the_node_answers_or_is_deleted_its_pod_may_be_forced() -> None:
    answered = (ObservedNode("good"), ObservedNode("lost", ready=True))
    assert forced(Observed(pods=PODS, nodes=answered), consistency=True) == ["a", "b"]
    deleted = (ObservedNode("good"),)
    assert forced(Observed(pods=PODS, nodes=deleted), consistency=True) == ["a", "b"]


def test_with_the_nodes_unknown_no_bound_pod_is_forced_but_an_unscheduled_one_is() -> None:
    pods = (*PODS, ObservedPod("c", "Pending", terminating=True))
    assert unreachable_pods(pods, None) == frozenset({"a", "b"})
    assert forced(Observed(pods=pods, nodes=None), consistency=True) == ["c"]


def test_the_deletion_is_not_complete_while_the_held_pod_exists() -> None:
    step = staged_deletion(
        deleting_status(),
        namespace="ns",
        observed=Observed(pods=PODS[1:], nodes=NODES),
        forceful_grace=GRACE,
        now=T0 + GRACE + timedelta(seconds=1),
        consistency=True,
    )
    assert not step.complete
    assert "1 pods on unreachable nodes wait for their node (consistency mode)" in step.summary


def test_the_next_attempt_waits_for_the_held_pod() -> None:
    params = dataclasses.replace(PARAMS, consistency_mode=True, forceful_deletion_grace=timedelta(seconds=60))
    aw = running(params=params)
    at = T0 + timedelta(seconds=30)
    aw = apply(
        aw,
        reconcile(
            aw, Observed(components=(ObservedComponent(Presence.PRESENT),)), verdict(at=at), params, at
        ),
    )
    assert aw["status"]["phase"] == Phase.RESETTING
    stuck = Observed(components=(ObservedComponent(Presence.ABSENT),), pods=PODS[1:], nodes=NODES)
    later = at + timedelta(minutes=10)
    for _ in range(3):
        plan = reconcile(aw, stuck, None, params, later)
        aw = apply(aw, plan)
        assert not [a for a in plan.actions if isinstance(a, DeletePods) and a.force]
        later += timedelta(minutes=5)
    assert aw["status"]["phase"] == Phase.RESETTING
    # The node was deleted: the garbage collector removed the pod, and the reset goes on.
    aw = apply(aw, reconcile(aw, gone(), None, params, later))
    plan = reconcile(aw, gone(), None, params, later + params.retry_pause + timedelta(seconds=5))
    assert plan.phase in (Phase.RESUMING, Phase.RUNNING)
