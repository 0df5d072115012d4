"""Attempt identity: status.attempt, and the label and environment every pod of an attempt carries."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from services.lifecycle.actions import CreateComponent
from services.lifecycle.attempts import attempt_hook, attempt_of
from services.lifecycle.machine import reconcile
from services.lifecycle.observed import Observed
from services.lifecycle.templating import PodTemplateContext
from shared.appwrapper.constants import Phase
from tests.unit.test_lifecycle_machine import (
    PARAMS,
    T0,
    UID,
    apply,
    appwrapper,
    gone,
    job,
    of,
    present,
    running,
    verdict,
)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def reset_and_recreate(aw: dict[str, Any], **verdict_kw: Any) -> tuple[dict[str, Any], list[CreateComponent]]:
    """Drive a Running AppWrapper through one reset to the creates of the next attempt."""
    count = aw["status"].get("resettingCount", 0)
    at = T0 + timedelta(seconds=30)
    plan = reconcile(aw, present(), verdict(count=count, at=at, **verdict_kw), PARAMS, at)
    aw = apply(aw, plan)
    assert aw["status"]["phase"] == Phase.RESETTING
    later = at + PARAMS.retry_pause + timedelta(seconds=5)
    plan = reconcile(aw, gone(), None, PARAMS, later)
    aw = apply(aw, plan)
    plan = reconcile(aw, gone(), None, PARAMS, later + timedelta(seconds=5))
    aw = apply(aw, plan)
    creates = of(plan, CreateComponent)
    assert creates, f"no creates in phase {aw['status']['phase']}"
    return aw, creates


def test_the_first_attempt_is_1_and_its_pods_carry_label_and_environment() -> None:
    template = job()
    pod_spec = template["spec"]["template"]["spec"]
    pod_spec["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    aw = appwrapper(components=[{"template": template}])
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    (create,) = of(plan, CreateComponent)
    pod = create.body["spec"]["template"]
    assert pod["metadata"]["labels"]["respawn.dev/attempt"] == "1"
    for container in (*pod["spec"]["initContainers"], *pod["spec"]["containers"]):
        assert env_of(container) == {"RESPAWN_ATTEMPT": "1", "RESPAWN_ATTEMPT_ID": f"{UID}-1"}


def test_a_reset_writes_the_next_attempt_with_the_resetting_status_and_its_pods_carry_it() -> None:
    aw = running()
    aw, creates = reset_and_recreate(aw)
    assert aw["status"]["attempt"] == 2
    pod = creates[0].body["spec"]["template"]
    assert pod["metadata"]["labels"]["respawn.dev/attempt"] == "2"
    assert env_of(pod["spec"]["containers"][0]) == {"RESPAWN_ATTEMPT": "2", "RESPAWN_ATTEMPT_ID": f"{UID}-2"}


def test_a_reset_that_does_not_count_still_begins_a_new_attempt() -> None:
    aw = running()
    aw, creates = reset_and_recreate(aw, reason="AutopilotNoExecute", counts_toward_retry=False)
    assert aw["status"].get("resettingCount", 0) == 0
    assert aw["status"]["attempt"] == 2
    assert creates[0].body["spec"]["template"]["metadata"]["labels"]["respawn.dev/attempt"] == "2"


@pytest.mark.parametrize(
    ("failure_class", "counted", "transient"),
    [("Unknown", 1, 0), ("Transient", 0, 1)],
)
def test_a_classified_failure_begins_a_new_attempt_whatever_its_class(
    failure_class: str, counted: int, transient: int
) -> None:
    aw = running()
    aw, creates = reset_and_recreate(aw, failure_class=failure_class, failure_code="ExitCode:1")
    assert aw["status"]["attempt"] == 2
    assert aw["status"].get("resettingCount", 0) == counted
    assert aw["status"].get("transientRetryCount", 0) == transient
    assert creates[0].body["spec"]["template"]["metadata"]["labels"]["respawn.dev/attempt"] == "2"


def test_the_resetting_status_write_carries_the_attempt() -> None:
    aw = running()
    at = T0 + timedelta(seconds=30)
    plan = reconcile(aw, present(), verdict(at=at), PARAMS, at)
    assert plan.status is not None
    assert plan.status["phase"] == Phase.RESETTING
    assert plan.status["attempt"] == 2
    assert plan.status["resettingCount"] == 1


def test_without_status_attempt_the_attempt_is_derived_from_the_resetting_count() -> None:
    assert attempt_of({}) == 1
    assert attempt_of({"resettingCount": 2}) == 3
    assert attempt_of({"resettingCount": 2, "attempt": 5}) == 5
    assert attempt_of({"attempt": "x", "resettingCount": 1}) == 2
    aw = running()
    aw["status"]["resettingCount"] = 2
    aw["status"].pop("attempt", None)
    aw, _ = reset_and_recreate(aw)
    assert aw["status"]["attempt"] == 4


def test_a_users_own_variable_of_the_same_name_is_kept() -> None:
    hook = attempt_hook("u", 3, {0: 0, 1: 2})
    template = {
        "spec": {
            "containers": [
                {"name": "a", "env": [{"name": "RESPAWN_ATTEMPT", "value": "mine"}]},
                {"name": "b"},
            ]
        }
    }
    out = hook(
        PodTemplateContext(appwrapper={}, component_index=1, pod_set_index=1, path="template"), template
    )
    assert out["spec"]["containers"][0]["env"] == [
        {"name": "RESPAWN_ATTEMPT", "value": "mine"},
        {"name": "RESPAWN_ATTEMPT_ID", "value": "u-3"},
    ]
    assert env_of(out["spec"]["containers"][1]) == {"RESPAWN_ATTEMPT": "3", "RESPAWN_ATTEMPT_ID": "u-3"}
    # Pod sets are numbered across components: component 1's second pod set is pod set 3.
    assert out["metadata"]["labels"] == {"respawn.dev/attempt": "3", "respawn.dev/pod-set": "3"}


def test_pod_sets_of_later_components_are_numbered_after_those_of_earlier_ones() -> None:
    aw = appwrapper(components=[{"template": job("a")}, {"template": job("b")}])
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    labels = [
        c.body["spec"]["template"]["metadata"]["labels"]["respawn.dev/pod-set"]
        for c in of(plan, CreateComponent)
    ]
    assert labels == ["0", "1"]


# ------------------------------------------------------------------------------- stopping


def stopped(aw: dict[str, Any], value: str = "true") -> dict[str, Any]:
    aw["metadata"].setdefault("annotations", {})["respawn.dev/stop"] = value
    return aw


def test_stop_fails_a_running_workload_with_reason_stopped_and_deletes_without_retry() -> None:
    from services.lifecycle.actions import DeleteComponent, PublishLifecycleEvent

    aw = stopped(running())
    at = T0 + timedelta(seconds=10)
    plan = reconcile(aw, present(), None, PARAMS, at)
    assert plan.phase == Phase.FAILED
    (changed,) = [a.event for a in of(plan, PublishLifecycleEvent) if a.event.event == "PhaseChanged"]
    assert changed.reason == "Stopped"
    assert of(plan, DeleteComponent), "the components are deleted at once"
    aw = apply(aw, plan)
    assert aw["status"].get("resettingCount", 0) == 0
    plan = reconcile(aw, gone(), None, PARAMS, at + timedelta(seconds=1))
    aw = apply(aw, plan)
    assert aw["status"]["phase"] == Phase.FAILED
    deployed = next(c for c in aw["status"]["conditions"] if c["type"] == "ResourcesDeployed")
    quota = next(c for c in aw["status"]["conditions"] if c["type"] == "QuotaReserved")
    assert deployed["status"] == "False" and quota["status"] == "False"
    assert not of(plan, CreateComponent)


def test_stop_skips_the_deletion_on_failure_pause() -> None:
    from dataclasses import replace

    from services.lifecycle.actions import DeleteComponent

    params = replace(PARAMS, deletion_on_failure_grace=timedelta(hours=1))
    aw = stopped(running(params=params))
    plan = reconcile(aw, present(), None, params, T0 + timedelta(seconds=10))
    assert plan.phase == Phase.FAILED
    assert of(plan, DeleteComponent)


def test_stop_of_a_resetting_workload_ends_it_failed_instead_of_retrying() -> None:
    aw = running()
    at = T0 + timedelta(seconds=30)
    aw = apply(aw, reconcile(aw, present(), verdict(at=at), PARAMS, at))
    assert aw["status"]["phase"] == Phase.RESETTING
    aw = stopped(aw)
    later = at + PARAMS.retry_pause + timedelta(seconds=5)
    plan = reconcile(aw, gone(), None, PARAMS, later)
    aw = apply(aw, plan)
    assert aw["status"]["phase"] == Phase.FAILED
    plan = reconcile(aw, gone(), None, PARAMS, later + timedelta(seconds=5))
    assert not of(plan, CreateComponent)


def test_stop_of_a_suspended_workload_fails_it_without_creating_anything() -> None:
    aw = stopped(appwrapper(suspend=True))
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    assert plan.phase == Phase.FAILED
    assert not of(plan, CreateComponent)


def test_stop_false_or_another_value_changes_nothing() -> None:
    for value in ("false", "yes", "True"):
        aw = stopped(running(), value)
        plan = reconcile(aw, present(), None, PARAMS, T0 + timedelta(seconds=10))
        assert plan.phase == Phase.RUNNING, value


def test_stop_of_a_succeeded_workload_deletes_its_resources_before_the_ttl() -> None:
    from services.lifecycle.actions import DeleteComponent

    aw = running()
    at = T0 + timedelta(seconds=30)
    aw = apply(aw, reconcile(aw, present(), verdict("Succeeded", reason="Succeeded", at=at), PARAMS, at))
    assert aw["status"]["phase"] == Phase.SUCCEEDED
    assert not of(reconcile(aw, present(), None, PARAMS, at + timedelta(seconds=1)), DeleteComponent)
    plan = reconcile(stopped(aw), present(), None, PARAMS, at + timedelta(seconds=1))
    assert plan.phase == Phase.SUCCEEDED
    assert of(plan, DeleteComponent)


# ---------------------------------------------------------------------- completion policy


def test_success_by_completion_policy_deletes_the_pods_still_running_at_once() -> None:
    from services.lifecycle.actions import DeleteComponent
    from services.lifecycle.observed import ObservedPod

    aw = running()
    aw["metadata"]["annotations"] = {"respawn.dev/completion-policy": '{"0": {"minSucceeded": 1}}'}
    at = T0 + timedelta(seconds=30)
    pods = [ObservedPod("launcher", "Succeeded"), ObservedPod("server", "Running")]
    said = "1 pods of pod set 0 succeeded (minSucceeded 1 by the completion policy)"
    plan = reconcile(
        aw, present(pods=pods), verdict("Succeeded", reason="Succeeded", at=at, message=said), PARAMS, at
    )
    assert plan.phase == Phase.SUCCEEDED
    assert plan.status is not None
    quota = next(c for c in plan.status["conditions"] if c["type"] == "QuotaReserved")
    assert quota["message"] == said
    assert of(plan, DeleteComponent), "the servers are not left running until the time to live"
    aw = apply(aw, plan)
    # Later passes see the pods terminating, and the deletion goes on to the end.
    terminating = [
        ObservedPod("launcher", "Succeeded", terminating=True),
        ObservedPod("server", "Running", terminating=True),
    ]
    plan = reconcile(aw, present(pods=terminating), None, PARAMS, at + timedelta(seconds=2))
    assert plan.requeue_at is not None and plan.requeue_at < at + timedelta(minutes=1)
    aw = apply(aw, plan)
    aw = apply(aw, reconcile(aw, gone(), None, PARAMS, at + timedelta(seconds=3)))
    deployed = next(c for c in aw["status"]["conditions"] if c["type"] == "ResourcesDeployed")
    assert deployed["status"] == "False"


def test_without_a_policy_a_succeeded_workload_keeps_its_resources_for_the_ttl() -> None:
    from services.lifecycle.actions import DeleteComponent
    from services.lifecycle.observed import ObservedPod

    aw = running()
    at = T0 + timedelta(seconds=30)
    pods = [ObservedPod("a", "Succeeded"), ObservedPod("b", "Running")]
    plan = reconcile(aw, present(pods=pods), verdict("Succeeded", reason="Succeeded", at=at), PARAMS, at)
    assert plan.phase == Phase.SUCCEEDED
    assert not of(plan, DeleteComponent)
