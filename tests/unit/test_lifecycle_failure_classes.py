"""The retry budget of classified failures, decided by the pure machine (docs/failures.md).

Permanent fails at once; Unknown is a counted retry; Transient resets without counting toward
retryLimit, counted in status.transientRetryCount up to the transient retry limit, then like
any failure. A verdict without a class is applied as before classes existed.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.lifecycle import validation
from services.lifecycle.actions import ExcludeNodes, LifecycleEventType, PublishLifecycleEvent
from services.lifecycle.machine import Plan, reconcile
from services.lifecycle.observed import Observed, ObservedComponent, ObservedNode, Presence
from shared.appwrapper.constants import Phase
from shared.config import NodeExclusionConfig
from shared.failures.annotation import TRANSIENT_RETRY_LIMIT_ANNOTATION
from shared.messages import LifecycleEvent
from tests.unit.test_lifecycle_machine import PARAMS, T0, apply, cond, k8s_events, of, running, verdict

NOW = T0 + PARAMS.failure_grace
NODES = (ObservedNode("n1"), ObservedNode("n2"), ObservedNode("n3"))


def seen() -> Observed:
    return Observed(components=(ObservedComponent(Presence.PRESENT, name="c0"),), pods=(), nodes=NODES)


def classified(failure_class: str, code: str, **kw: Any) -> Any:
    message = f"1 failed pods: p-0; {failure_class} ({code}): pod p-0 failed with {code}"
    return verdict(failure_class=failure_class, failure_code=code, message=message, **kw)


def apply_verdict(aw: dict[str, Any], v: Any, *, transient_limit: int = 10, **kw: Any) -> Plan:
    return reconcile(aw, seen(), v, PARAMS, NOW, transient_limit=transient_limit, **kw)


def published(plan: Plan, event: str) -> LifecycleEvent:
    return next(a.event for a in of(plan, PublishLifecycleEvent) if a.event.event == event)


def test_a_transient_failure_resets_without_counting_and_counts_its_own_retries() -> None:
    aw = running()
    plan = apply_verdict(aw, classified("Transient", "Evicted", fault_kind="Infrastructure"))
    aw = apply(aw, plan)
    assert plan.phase == Phase.RESETTING
    assert aw["status"].get("resettingCount", 0) == 0
    assert aw["status"]["transientRetryCount"] == 1
    started = published(plan, LifecycleEventType.RESET_STARTED)
    assert (started.failure_class, started.failure_code) == ("Transient", "Evicted")
    changed = published(plan, LifecycleEventType.PHASE_CHANGED)
    assert (changed.failure_class, changed.failure_code) == ("Transient", "Evicted")
    assert "Transient (Evicted)" in cond(aw, "Unhealthy")["message"]
    resetting = dict(k8s_events(plan))["Resetting"]
    assert (
        "transient failure: retry 1 of 10 transient retries, not counted toward the retry limit" in resetting
    )


def test_past_the_transient_limit_a_transient_failure_counts_like_any_other() -> None:
    aw = running()
    aw["status"]["transientRetryCount"] = 2
    plan = apply_verdict(aw, classified("Transient", "Evicted"), transient_limit=2)
    aw = apply(aw, plan)
    assert plan.phase == Phase.RESETTING
    assert (aw["status"]["resettingCount"], aw["status"]["transientRetryCount"]) == (1, 2)
    assert "transient retry limit (2) reached" in dict(k8s_events(plan))["Resetting"]


def test_the_annotation_sets_the_workloads_transient_limit() -> None:
    aw = running()
    aw["metadata"]["annotations"] = {TRANSIENT_RETRY_LIMIT_ANNOTATION: "0"}
    aw = apply(aw, apply_verdict(aw, classified("Transient", "Preempted")))
    assert (aw["status"]["resettingCount"], aw["status"].get("transientRetryCount", 0)) == (1, 0)


def test_a_malformed_transient_limit_annotation_is_reported_and_the_default_applies() -> None:
    aw = running()
    aw["metadata"]["annotations"] = {TRANSIENT_RETRY_LIMIT_ANNOTATION: "many"}
    warnings = validation.parameters(aw, PARAMS, 10).warnings
    assert any(TRANSIENT_RETRY_LIMIT_ANNOTATION in w and "using the default 10" in w for w in warnings)
    aw = apply(aw, apply_verdict(aw, classified("Transient", "Preempted")))
    assert aw["status"]["transientRetryCount"] == 1


def test_a_permanent_failure_fails_at_once_with_retries_left() -> None:
    aw = running()
    plan = apply_verdict(aw, classified("Permanent", "BadInput", terminal=True))
    aw = apply(aw, plan)
    assert plan.phase == Phase.FAILED
    assert aw["status"].get("resettingCount", 0) == 0
    failed = published(plan, LifecycleEventType.PHASE_CHANGED)
    assert (failed.phase, failed.failure_class, failed.failure_code) == ("Failed", "Permanent", "BadInput")
    assert "permanent failure: not retried" in dict(k8s_events(plan))["Failed"]


@pytest.mark.parametrize(("count", "phase"), [(0, Phase.RESETTING), (3, Phase.FAILED)])
def test_an_unknown_failure_is_a_counted_retry(count: int, phase: Phase) -> None:
    aw = running()
    aw["status"]["resettingCount"] = count
    plan = apply_verdict(aw, classified("Unknown", "ExitCode:1", count=count))
    aw = apply(aw, plan)
    assert plan.phase == phase
    assert aw["status"]["resettingCount"] == min(count + 1, PARAMS.retry_limit)
    assert "transientRetryCount" not in aw["status"]


def test_a_verdict_without_a_class_is_applied_as_before() -> None:
    aw = running()
    plan = apply_verdict(aw, verdict())
    aw = apply(aw, plan)
    assert aw["status"]["resettingCount"] == 1
    assert "transientRetryCount" not in aw["status"]
    assert cond(aw, "Unhealthy")["message"] == "1 failed pods"
    started = published(plan, LifecycleEventType.RESET_STARTED)
    assert (started.failure_class, started.failure_code) == ("", "")


@pytest.mark.parametrize(("fault_kind", "nodes"), [("Application", ()), ("Infrastructure", ("n1",))])
def test_node_exclusion_uses_the_nodes_the_verdict_blames(fault_kind: str, nodes: tuple[str, ...]) -> None:
    v = classified("Unknown", "ExitCode:1", fault_kind=fault_kind, nodes=nodes)
    plan = apply_verdict(running(), v, node_exclusion=NodeExclusionConfig(enabled=True, max_nodes=8))
    assert [a.nodes for a in of(plan, ExcludeNodes)] == ([nodes] if nodes else [])
