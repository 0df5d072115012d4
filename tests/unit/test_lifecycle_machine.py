"""The lifecycle state machine: every phase, transition and error path, with the clock passed in."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.lifecycle.actions import (
    Action,
    CreateComponent,
    CreateOutcome,
    CreateResult,
    DeleteComponent,
    DeletePods,
    EmitEvent,
    LifecycleEventType,
    PublishLifecycleEvent,
)
from services.lifecycle.conditions import find_condition
from services.lifecycle.deletion import DELETION_POLL, staged_deletion
from services.lifecycle.machine import CREATE_RETRY_INTERVAL, FinalizerChange, Plan, reconcile
from services.lifecycle.observed import Observed, ObservedComponent, ObservedPod, Presence
from services.lifecycle.templating import PodTemplateContext
from services.lifecycle.verdicts import VerdictUse
from shared.appwrapper.constants import (
    APPWRAPPER_LABEL,
    CONTROLLER_NAME,
    FINALIZER,
    MSG_KUEUE_FORCED_DELETION,
    MSG_RESET_COMPLETE,
    MSG_RESOURCES_DELETED_FAILED,
    ComponentReason,
    Phase,
)
from shared.faulttolerance import FaultTolerance
from shared.kubetime import parse_kube_time
from shared.messages import ObjectRef, Verdict

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
UID = "uid-1"
PARAMS = FaultTolerance(
    admission_grace=timedelta(seconds=60),
    warmup_grace=timedelta(seconds=300),
    failure_grace=timedelta(seconds=60),
    retry_pause=timedelta(seconds=90),
    retry_limit=3,
    deletion_on_failure_grace=timedelta(0),
    forceful_deletion_grace=timedelta(seconds=600),
    success_ttl=timedelta(days=7),
)


# ------------------------------------------------------------------------------------ fixtures


def job(name: str = "train", parallelism: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
            },
        },
    }


def appwrapper(
    *,
    suspend: bool = False,
    components: Sequence[Mapping[str, Any]] | None = None,
    status: Mapping[str, Any] | None = None,
    finalizers: Sequence[str] = (),
    **spec_extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {
            "name": "aw",
            "namespace": "team",
            "uid": UID,
            "generation": 1,
            "resourceVersion": "1",
            "finalizers": list(finalizers),
        },
        "spec": {
            "suspend": suspend,
            "components": [dict(c) for c in (components or [{"template": job()}])],
            **spec_extra,
        },
    }
    if status is not None:
        body["status"] = copy.deepcopy(dict(status))
    return body


def apply(aw: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """What the service does with a plan's status and finalizer (the API server's view after it)."""
    new = copy.deepcopy(dict(aw))
    if plan.status is not None:
        new["status"] = copy.deepcopy(plan.status)
    finalizers = new["metadata"].setdefault("finalizers", [])
    if plan.finalizer is FinalizerChange.ADD and FINALIZER not in finalizers:
        finalizers.append(FINALIZER)
    if plan.finalizer is FinalizerChange.REMOVE and FINALIZER in finalizers:
        finalizers.remove(FINALIZER)
    new["metadata"]["resourceVersion"] = str(int(new["metadata"]["resourceVersion"]) + 1)
    return new


def of(plan: Plan, kind: type[Action]) -> list[Any]:
    return [a for a in plan.actions if isinstance(a, kind)]


def deletes(plan: Plan, kind: type[DeleteComponent | DeletePods], *, force: bool = False) -> list[Any]:
    """The plan's deletes of components or pods: graceful ones, or forced ones."""
    return [a for a in of(plan, kind) if a.force is force]


def cond(aw_or_status: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    status = aw_or_status.get("status", aw_or_status)
    found = find_condition(status.get("conditions"), ctype)
    assert found is not None, f"no {ctype} condition in {status.get('conditions')}"
    return found


def ltt(aw: Mapping[str, Any], ctype: str) -> datetime:
    when = parse_kube_time(cond(aw, ctype)["lastTransitionTime"])
    assert when is not None
    return when


def comp_cond(aw: Mapping[str, Any], index: int = 0) -> Mapping[str, Any]:
    found = find_condition(aw["status"]["componentStatus"][index].get("conditions"), "ResourcesDeployed")
    assert found is not None
    return found


def lifecycle_events(plan: Plan) -> list[str]:
    return [a.event.event for a in of(plan, PublishLifecycleEvent)]


def k8s_events(plan: Plan) -> list[tuple[str, str]]:
    return [(a.reason, a.message) for a in of(plan, EmitEvent)]


def present(n: int = 1, pods: Sequence[ObservedPod] = ()) -> Observed:
    return Observed(components=tuple(ObservedComponent(Presence.PRESENT) for _ in range(n)), pods=tuple(pods))


def gone(n: int = 1) -> Observed:
    return Observed(components=tuple(ObservedComponent(Presence.ABSENT) for _ in range(n)), pods=())


def outcomes_for(
    plan: Plan, result: CreateResult = CreateResult.CREATED, **kw: Any
) -> dict[int, CreateOutcome]:
    return {
        a.index: CreateOutcome(result=result, name=a.body["metadata"].get("name", ""), **kw)
        for a in of(plan, CreateComponent)
    }


def verdict(
    state: str = "Unhealthy",
    *,
    reason: str = "FoundFailedPods",
    count: int = 0,
    at: datetime = T0 + timedelta(seconds=30),
    attempt: datetime | None = None,
    **kw: Any,
) -> Verdict:
    return Verdict(
        ref=ObjectRef(namespace="team", name="aw", uid=UID),
        state=state,
        reason=reason,
        message=kw.pop("message", "1 failed pods"),
        resetting_count=count,
        decided_at=at,
        attempt_started_at=attempt,
        **kw,
    )


def running(
    now: datetime = T0, *, components: int = 1, params: FaultTolerance = PARAMS, **kw: Any
) -> dict[str, Any]:
    """An AppWrapper driven from submission to Running at ``now``."""
    aw = appwrapper(components=[{"template": job(f"c{i}")} for i in range(components)], **kw)
    plan = reconcile(aw, Observed(), None, params, now)
    aw = apply(aw, plan)
    plan = reconcile(aw, Observed(created=outcomes_for(plan)), None, params, now)
    aw = apply(aw, plan)
    assert aw["status"]["phase"] == Phase.RUNNING
    return aw


# ------------------------------------------------------------------- Empty and Suspended


def test_new_appwrapper_becomes_suspended_with_component_status_and_creates_nothing_while_suspended() -> None:
    aw = appwrapper(suspend=True)
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    assert plan.phase == Phase.SUSPENDED
    assert plan.status is not None
    assert plan.status["componentStatus"] == [
        {
            "name": "train",
            "kind": "Job",
            "apiVersion": "batch/v1",
            "podSets": [
                {
                    "replicas": 2,
                    "path": "template.spec.template",
                    "annotations": {
                        "workload.codeflare.dev.appwrapper/tas-pod-index-label": (
                            "batch.kubernetes.io/job-completion-index"
                        )
                    },
                }
            ],
        }
    ]
    assert plan.finalizer is None
    assert not of(plan, CreateComponent)
    assert lifecycle_events(plan) == [LifecycleEventType.PHASE_CHANGED]

    again = reconcile(apply(aw, plan), Observed(), None, PARAMS, T0 + timedelta(hours=1))
    assert again.empty, "a suspended AppWrapper is left alone"


def test_declared_pod_sets_are_recorded_for_kinds_that_cannot_be_inferred() -> None:
    custom = {
        "apiVersion": "example.com/v1",
        "kind": "Trainer",
        "metadata": {"name": "t"},
        "spec": {"worker": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}},
    }
    aw = appwrapper(
        suspend=True,
        components=[
            {"template": custom, "podSets": [{"path": "template.spec.worker.template", "replicas": 4}]}
        ],
    )
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    assert plan.status is not None
    assert plan.status["componentStatus"][0]["podSets"] == [
        {"path": "template.spec.worker.template", "replicas": 4}
    ]


def test_unsuspending_adds_finalizer_sets_conditions_and_creates_every_component() -> None:
    aw = appwrapper(suspend=True, components=[{"template": job("a")}, {"template": job("b")}])
    aw = apply(aw, reconcile(aw, Observed(), None, PARAMS, T0))
    aw["spec"]["suspend"] = False
    now = T0 + timedelta(minutes=3)
    plan = reconcile(aw, Observed(), None, PARAMS, now)

    assert plan.finalizer is FinalizerChange.ADD
    assert plan.phase == Phase.RESUMING
    new = apply(aw, plan)
    for ctype, status in (
        ("QuotaReserved", "True"),
        ("ResourcesDeployed", "True"),
        ("PodsReady", "False"),
        ("Unhealthy", "False"),
    ):
        c = cond(new, ctype)
        assert (c["status"], c["reason"], c["message"]) == (status, "Resuming", "Suspend is false")
        assert c["lastTransitionTime"] == "2025-03-01T12:03:00Z"
        assert c["observedGeneration"] == 1
    creates = of(plan, CreateComponent)
    assert [c.index for c in creates] == [0, 1]
    assert [c.body["metadata"]["name"] for c in creates] == ["a", "b"]
    # Recorded before the create calls, so a crash right after them still knows what may exist.
    assert [comp_cond(new, i)["status"] for i in (0, 1)] == ["Unknown", "Unknown"]
    assert comp_cond(new)["reason"] == ComponentReason.CREATION_INITIATED


def test_created_components_carry_label_owner_and_pod_set_infos() -> None:
    component = {
        "template": job(),
        "podSetInfos": [
            {
                "labels": {"kueue.x-k8s.io/podset": "main"},
                "annotations": {"a": "1"},
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "schedulingGates": [{"name": "kueue.x-k8s.io/topology"}],
            }
        ],
    }
    aw = appwrapper(components=[component])
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    (create,) = of(plan, CreateComponent)
    body = create.body
    assert body["metadata"]["namespace"] == "team"
    assert body["metadata"]["labels"] == {APPWRAPPER_LABEL: "aw"}
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "workload.codeflare.dev/v1beta2",
            "kind": "AppWrapper",
            "name": "aw",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    pod = body["spec"]["template"]
    assert pod["metadata"]["labels"] == {
        APPWRAPPER_LABEL: "aw",
        "kueue.x-k8s.io/podset": "main",
        "respawn.dev/attempt": "1",
        "respawn.dev/pod-set": "0",
    }
    assert pod["metadata"]["annotations"] == {"a": "1"}
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert pod["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]


def test_pod_template_hooks_see_every_pod_template_and_their_changes_are_created() -> None:
    seen: list[tuple[int, int, str]] = []

    def avoid_bad_nodes(context: PodTemplateContext, template: dict[str, Any]) -> dict[str, Any]:
        seen.append((context.component_index, context.pod_set_index, context.path))
        assert context.now == T0  # the reconcile's clock, for hooks whose answer depends on time
        template["spec"]["affinity"] = {"nodeAffinity": {"marker": context.appwrapper["metadata"]["name"]}}
        return template

    aw = appwrapper(components=[{"template": job("a")}, {"template": job("b")}])
    plan = reconcile(aw, Observed(), None, PARAMS, T0, hooks=[avoid_bad_nodes])
    assert seen == [(0, 0, "template.spec.template"), (1, 0, "template.spec.template")]
    for create in of(plan, CreateComponent):
        assert create.body["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": {"marker": "aw"}}


def test_a_hook_that_rejects_a_template_fails_the_appwrapper() -> None:
    def reject(context: PodTemplateContext, template: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("no node can host this pod")

    plan = reconcile(appwrapper(), Observed(), None, PARAMS, T0, hooks=[reject])
    assert plan.phase == Phase.FAILED
    assert plan.status is not None
    assert "no node can host this pod" in cond(plan.status, "Unhealthy")["message"]
    assert not of(plan, CreateComponent)


# ------------------------------------------------------------------------------- Resuming


def test_successful_creates_make_the_appwrapper_running() -> None:
    aw = appwrapper()
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    aw = apply(aw, plan)
    plan = reconcile(aw, Observed(created=outcomes_for(plan)), None, PARAMS, T0 + timedelta(seconds=1))
    aw = apply(aw, plan)
    assert plan.phase == Phase.RUNNING
    assert comp_cond(aw)["status"] == "True"
    assert comp_cond(aw)["reason"] == ComponentReason.CREATED_SUCCESSFULLY
    assert not of(plan, CreateComponent)
    assert ("Running", "All 1 components created") in k8s_events(plan)


def test_generated_names_are_recorded_from_the_create_outcome() -> None:
    template = job()
    template["metadata"] = {"generateName": "train-"}
    aw = appwrapper(components=[{"template": template}])
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    aw = apply(aw, plan)
    outcome = CreateOutcome(result=CreateResult.CREATED, name="train-x7k2p")
    aw = apply(aw, reconcile(aw, Observed(created={0: outcome}), None, PARAMS, T0))
    assert aw["status"]["componentStatus"][0]["name"] == "train-x7k2p"


def test_already_exists_and_ours_counts_as_created() -> None:
    aw = appwrapper()
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    aw = apply(aw, plan)
    plan = reconcile(aw, Observed(created=outcomes_for(plan, CreateResult.ALREADY_EXISTS)), None, PARAMS, T0)
    assert plan.phase == Phase.RUNNING


def test_already_exists_but_owned_by_something_else_is_terminal() -> None:
    aw = appwrapper()
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    aw = apply(aw, plan)
    outcomes = outcomes_for(plan, CreateResult.ALREADY_EXISTS, controlled_by_us=False)
    plan = reconcile(aw, Observed(created=outcomes), None, PARAMS, T0)
    aw = apply(aw, plan)
    assert plan.phase == Phase.FAILED
    assert aw["status"].get("resettingCount", 0) == 0
    unhealthy = cond(aw, "Unhealthy")
    assert (unhealthy["status"], unhealthy["reason"]) == ("True", "CreateFailed")
    assert unhealthy["message"] == (
        "error creating components: resource Job train exists, but is not controlled by appwrapper"
    )
    assert ("Unhealthy", f"CreateFailed: {unhealthy['message']}") in k8s_events(plan)


def test_invalid_and_unknown_kind_create_errors_fail_at_once() -> None:
    for result in (CreateResult.INVALID, CreateResult.NO_MATCH):
        aw = appwrapper()
        plan = reconcile(aw, Observed(), None, PARAMS, T0)
        aw = apply(aw, plan)
        outcomes = outcomes_for(
            plan, result, message="spec.template.spec.containers[0].image: Required value"
        )
        plan = reconcile(aw, Observed(created=outcomes), None, PARAMS, T0)
        aw = apply(aw, plan)
        assert plan.phase == Phase.FAILED, result
        assert comp_cond(aw)["reason"] == ComponentReason.CREATION_ERRORED
        assert "Required value" in cond(aw, "Unhealthy")["message"]
        # A failed create might still have taken effect, so quota is kept until the service
        # has confirmed that nothing exists.
        assert cond(aw, "QuotaReserved")["status"] == "True"
        aw = apply(aw, reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(seconds=1)))
        assert cond(aw, "QuotaReserved")["status"] == "False"
        assert cond(aw, "ResourcesDeployed")["status"] == "False"


def test_retryable_create_errors_are_retried_until_the_admission_grace_period_then_reset() -> None:
    aw = appwrapper()
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    aw = apply(aw, plan)
    error = {0: CreateOutcome(result=CreateResult.ERROR, message="etcdserver: request timed out")}

    plan = reconcile(aw, Observed(created=error), None, PARAMS, T0 + timedelta(seconds=1))
    aw = apply(aw, plan)
    assert plan.phase == Phase.RESUMING
    assert plan.requeue_at == T0 + timedelta(seconds=1) + CREATE_RETRY_INTERVAL
    assert not of(plan, CreateComponent), "never retried in the plan that records the error"
    assert comp_cond(aw)["reason"] == ComponentReason.CREATION_ERRORED

    retry = reconcile(aw, Observed(), None, PARAMS, T0 + timedelta(seconds=2))
    assert [c.index for c in of(retry, CreateComponent)] == [0]
    assert retry.status is None, "a retry does not rewrite the status"

    late = T0 + PARAMS.admission_grace
    plan = reconcile(aw, Observed(created=error), None, PARAMS, late)
    aw = apply(aw, plan)
    assert plan.phase == Phase.RESETTING
    assert aw["status"]["resettingCount"] == 1
    assert cond(aw, "Unhealthy")["reason"] == "CreateFailed"


def test_a_component_found_created_after_a_lost_outcome_is_not_created_again() -> None:
    aw = appwrapper()
    aw = apply(aw, reconcile(aw, Observed(), None, PARAMS, T0))
    plan = reconcile(aw, present(1), None, PARAMS, T0 + timedelta(seconds=5))
    assert plan.phase == Phase.RUNNING
    assert not of(plan, CreateComponent)


def generated(**kw: Any) -> dict[str, Any]:
    """An AppWrapper whose one component is created under a generated name."""
    template = job()
    template["metadata"] = {"generateName": "train-"}
    return appwrapper(components=[{"template": template}], **kw)


def test_a_create_record_left_by_an_earlier_attempt_does_not_hold_up_the_next_one() -> None:
    # The create of a generated-name component is issued, and the AppWrapper is suspended before
    # its outcome is recorded: the component keeps its CreationInitiated record and no name.
    params = dataclasses.replace(PARAMS, admission_grace=timedelta(0))
    aw = generated()
    aw = apply(aw, reconcile(aw, Observed(), None, params, T0))
    assert comp_cond(aw)["reason"] == ComponentReason.CREATION_INITIATED
    aw["spec"]["suspend"] = True
    found = Observed(components=(ObservedComponent(Presence.PRESENT, True, "train-x7k2p", "u1"),), pods=())
    plan = reconcile(aw, found, None, params, T0 + timedelta(seconds=1))
    aw = apply(aw, plan)
    assert plan.phase == Phase.SUSPENDING
    assert [d.name for d in of(plan, DeleteComponent)] == ["train-x7k2p"]
    # Looked for by the annotation of the attempt it was created in: gone.
    plan = reconcile(aw, gone(1), None, params, T0 + timedelta(seconds=2))
    aw = apply(aw, plan)
    assert plan.phase == Phase.SUSPENDED
    assert aw["status"]["componentStatus"][0]["name"] == ""

    # Admitted again: the record describes the earlier attempt, whose resources are gone, so the
    # new attempt creates the component at once (no admission grace to wait in, no reset).
    aw["spec"]["suspend"] = False
    plan = reconcile(aw, Observed(), None, params, T0 + timedelta(seconds=3))
    aw = apply(aw, plan)
    assert plan.phase == Phase.RESUMING
    assert [c.index for c in of(plan, CreateComponent)] == [0]
    assert aw["status"].get("resettingCount", 0) == 0
    assert comp_cond(aw)["reason"] == ComponentReason.CREATION_INITIATED
    assert comp_cond(aw)["lastTransitionTime"] == "2025-03-01T12:00:03Z", "recorded for this attempt"


def test_one_create_error_without_admission_grace_costs_one_retry_not_all_of_them() -> None:
    params = dataclasses.replace(PARAMS, admission_grace=timedelta(0), retry_pause=timedelta(0))
    aw = generated()
    aw = apply(aw, reconcile(aw, Observed(), None, params, T0))
    error = {0: CreateOutcome(result=CreateResult.ERROR, message="etcdserver: request timed out")}
    plan = reconcile(aw, Observed(created=error), None, params, T0)
    aw = apply(aw, plan)
    assert plan.phase == Phase.RESETTING
    assert aw["status"]["resettingCount"] == 1
    assert comp_cond(aw)["reason"] == ComponentReason.CREATION_ERRORED
    aw = apply(aw, reconcile(aw, gone(1), None, params, T0 + timedelta(seconds=1)))
    plan = reconcile(aw, gone(1), None, params, T0 + params.recreate_delay + timedelta(seconds=1))
    aw = apply(aw, plan)
    assert plan.phase == Phase.RESUMING, "the next attempt creates, it does not reset again"
    assert [c.index for c in of(plan, CreateComponent)] == [0]
    assert aw["status"]["resettingCount"] == 1


def test_conflicting_pod_set_info_is_a_terminal_error_naming_component_path_and_key() -> None:
    template = job()
    template["spec"]["template"]["metadata"] = {"labels": {"team": "a"}}
    aw = appwrapper(components=[{"template": template, "podSetInfos": [{"labels": {"team": "b"}}]}])
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    assert plan.phase == Phase.FAILED
    assert plan.status is not None
    message = cond(plan.status, "Unhealthy")["message"]
    assert "component 0" in message and "template.spec.template" in message and "'team'" in message
    assert not of(plan, CreateComponent)


def test_a_component_observed_absent_just_before_its_create_is_not_reported_missing() -> None:
    aw = appwrapper()
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    aw = apply(aw, plan)
    stale = Observed(components=(ObservedComponent(Presence.ABSENT),), pods=(), created=outcomes_for(plan))
    assert reconcile(aw, stale, None, PARAMS, T0).phase == Phase.RUNNING


def test_a_finalizer_removed_by_hand_is_added_back_while_resources_may_exist() -> None:
    aw = running()
    aw["metadata"]["finalizers"] = []
    assert reconcile(aw, present(1), None, PARAMS, T0).finalizer is FinalizerChange.ADD


def test_suspend_while_resuming_goes_to_suspending() -> None:
    aw = appwrapper()
    aw = apply(aw, reconcile(aw, Observed(), None, PARAMS, T0))
    aw["spec"]["suspend"] = True
    plan = reconcile(
        aw, Observed(components=(ObservedComponent(Presence.PRESENT),), pods=()), None, PARAMS, T0
    )
    assert ("Suspending", "Externally suspended while in the Resuming phase") in k8s_events(plan)
    assert plan.phase == Phase.SUSPENDING
    assert [a.force for a in of(plan, DeleteComponent)] == [False]


# -------------------------------------------------------------------------------- Running


def test_pods_ready_follows_the_observed_pods() -> None:
    aw = running()
    pods = [ObservedPod("p0", "Running"), ObservedPod("p1", "Pending")]
    plan = reconcile(aw, present(1, pods), None, PARAMS, T0)
    assert plan.status is None, "PodsReady is False already; clearing it again changes nothing"

    pods = [ObservedPod("p0", "Running"), ObservedPod("p1", "Running")]
    aw = apply(aw, reconcile(aw, present(1, pods), None, PARAMS, T0 + timedelta(seconds=30)))
    ready = cond(aw, "PodsReady")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "True",
        "SufficientPodsReady",
        "2 pods running; 0 pods succeeded",
    )

    # A running pod being deleted does not count.
    pods = [ObservedPod("p0", "Running"), ObservedPod("p1", "Running", terminating=True)]
    aw = apply(aw, reconcile(aw, present(1, pods), None, PARAMS, T0 + timedelta(seconds=60)))
    ready = cond(aw, "PodsReady")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "InsufficientPodsReady",
        "0 pods pending; 1 pods running; 0 pods succeeded",
    )


def test_success_verdict_makes_the_appwrapper_succeeded_and_releases_quota() -> None:
    aw = running()
    pods = [ObservedPod("p0", "Succeeded"), ObservedPod("p1", "Succeeded")]
    plan = reconcile(
        aw, present(1, pods), verdict("Succeeded", reason="Succeeded"), PARAMS, T0 + timedelta(minutes=5)
    )
    aw = apply(aw, plan)
    assert plan.phase == Phase.SUCCEEDED
    assert plan.verdict_use is VerdictUse.APPLIED
    quota = cond(aw, "QuotaReserved")
    assert (quota["status"], quota["reason"]) == ("False", "Succeeded")
    assert quota["message"] == "2 pods succeeded and no running, pending, or failed pods"
    assert cond(aw, "ResourcesDeployed")["status"] == "True"
    assert not of(plan, DeleteComponent)


def test_unhealthy_verdict_resets_and_starts_deletion_in_the_same_plan() -> None:
    aw = running()
    first = T0 + timedelta(minutes=2)
    v = verdict(at=first + PARAMS.failure_grace, first_unhealthy_at=first, nodes=("node-3",))
    plan = reconcile(aw, present(1), v, PARAMS, first + PARAMS.failure_grace)
    aw = apply(aw, plan)

    assert plan.phase == Phase.RESETTING
    assert plan.verdict_use is VerdictUse.APPLIED
    assert aw["status"]["resettingCount"] == 1
    unhealthy = cond(aw, "Unhealthy")
    assert (unhealthy["status"], unhealthy["reason"], unhealthy["message"]) == (
        "True",
        "FoundFailedPods",
        "1 failed pods",
    )
    assert ltt(aw, "Unhealthy") == first, "marked unhealthy when first seen, as upstream"
    assert cond(aw, "QuotaReserved")["status"] == "True"
    assert cond(aw, "ResourcesDeployed")["status"] == "True"
    assert cond(aw, "DeletingResources")["status"] == "True"
    assert [(d.kind, d.name, d.namespace) for d in deletes(plan, DeleteComponent)] == [("Job", "c0", "team")]
    assert lifecycle_events(plan) == [LifecycleEventType.PHASE_CHANGED, LifecycleEventType.RESET_STARTED]
    started = of(plan, PublishLifecycleEvent)[1].event
    assert (started.resetting_count, started.reason, started.nodes) == (1, "FoundFailedPods", ("node-3",))
    assert ("Unhealthy", "FoundFailedPods: 1 failed pods") in k8s_events(plan)


def test_the_same_verdict_applied_twice_resets_once() -> None:
    """Two instances (or a redelivery) acting on one verdict: the loser recomputes from fresh state."""
    aw = running()
    v = verdict(at=T0 + timedelta(minutes=1))
    now = T0 + timedelta(minutes=1)
    first = reconcile(aw, present(1), v, PARAMS, now)
    second = reconcile(aw, present(1), v, PARAMS, now)
    assert first == second, "same inputs, same plan: both instances race for the same status write"
    # The first write wins; the second instance's write conflicts and it recomputes:
    aw = apply(aw, first)
    recomputed = reconcile(aw, present(1), v, PARAMS, now + timedelta(milliseconds=5))
    assert aw["status"]["resettingCount"] == 1
    assert recomputed.verdict_use is VerdictUse.SETTLED
    assert recomputed.status is None or recomputed.status.get("resettingCount") == 1
    assert LifecycleEventType.RESET_STARTED not in lifecycle_events(recomputed)


def test_a_redelivered_verdict_after_the_reset_completed_does_nothing() -> None:
    aw = running()
    v = verdict(at=T0 + timedelta(minutes=1))
    aw = apply(aw, reconcile(aw, present(1), v, PARAMS, T0 + timedelta(minutes=1)))
    aw = apply(aw, reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(minutes=2)))
    aw = apply(aw, reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(minutes=4)))
    assert aw["status"]["phase"] == Phase.RESUMING
    plan = reconcile(aw, present(1), v, PARAMS, T0 + timedelta(minutes=4))
    aw = apply(aw, plan)
    assert aw["status"]["phase"] == Phase.RUNNING
    assert plan.verdict_use is VerdictUse.SETTLED
    assert aw["status"]["resettingCount"] == 1


def test_autopilot_migration_resets_without_counting_and_is_not_applied_twice() -> None:
    aw = running(status=None)
    attempt = ltt(aw, "ResourcesDeployed")
    v = verdict(
        reason="AutopilotNoExecute",
        counts_toward_retry=False,
        nodes=("n1",),
        attempt=attempt,
        at=T0 + timedelta(minutes=1),
        message="Workload contains pods using NoExecute resources on Nodes: [n1]",
    )
    plan = reconcile(aw, present(1), v, PARAMS, T0 + timedelta(minutes=1))
    aw = apply(aw, plan)
    assert plan.phase == Phase.RESETTING
    assert aw["status"].get("resettingCount", 0) == 0
    assert "not counted toward the retry limit" in dict(k8s_events(plan))["Resetting"]
    # Reset completes; the workload is recreated and Running again with the same count.
    aw = apply(aw, reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(minutes=3)))
    resume = T0 + timedelta(minutes=3) + PARAMS.recreate_delay
    plan = reconcile(aw, Observed(), None, PARAMS, resume)
    aw = apply(aw, plan)
    aw = apply(aw, reconcile(aw, Observed(created=outcomes_for(plan)), None, PARAMS, resume))
    assert aw["status"]["phase"] == Phase.RUNNING
    # The migration verdict comes again (redelivery, or a slow second instance): old attempt.
    plan = reconcile(aw, present(1), v, PARAMS, T0 + timedelta(minutes=4))
    assert plan.phase == Phase.RUNNING
    assert plan.verdict_use is VerdictUse.SETTLED


def test_autopilot_migration_at_the_retry_limit_fails() -> None:
    aw = running()
    aw["status"]["resettingCount"] = 3
    v = verdict(reason="AutopilotNoExecute", counts_toward_retry=False, count=3)
    plan = reconcile(aw, present(1), v, PARAMS, T0)
    assert plan.phase == Phase.FAILED
    assert plan.status is not None and plan.status["resettingCount"] == 3


def test_retry_limit_reached_fails_without_incrementing() -> None:
    params = FaultTolerance(retry_limit=2)
    aw = running(params=params)
    aw["status"]["resettingCount"] = 2
    plan = reconcile(aw, present(1), verdict(count=2), params, T0)
    aw = apply(aw, plan)
    assert plan.phase == Phase.FAILED
    assert aw["status"]["resettingCount"] == 2
    assert ("Failed", "FoundFailedPods: 1 failed pods; the retry limit of 2 is reached") in k8s_events(plan)
    assert ("Warning", "Failed") in [(e.type, e.reason) for e in of(plan, EmitEvent)]


def test_retry_limit_zero_fails_on_the_first_unhealthy_verdict() -> None:
    params = FaultTolerance(retry_limit=0)
    aw = running(params=params)
    plan = reconcile(aw, present(1), verdict(), params, T0)
    assert plan.phase == Phase.FAILED


def test_terminal_failure_fails_even_with_retries_left() -> None:
    aw = running()
    plan = reconcile(aw, present(1), verdict(terminal=True), PARAMS, T0)
    assert plan.phase == Phase.FAILED
    assert plan.status is not None and plan.status.get("resettingCount", 0) == 0


def test_a_deleted_component_fails_the_appwrapper_directly() -> None:
    for presence in (Presence.ABSENT, Presence.DELETING):
        aw = running(components=2)
        observed = Observed(
            components=(ObservedComponent(Presence.PRESENT), ObservedComponent(presence)), pods=()
        )
        plan = reconcile(aw, observed, None, PARAMS, T0)
        aw = apply(aw, plan)
        assert plan.phase == Phase.FAILED, presence
        unhealthy = cond(aw, "Unhealthy")
        assert (unhealthy["reason"], unhealthy["message"]) == (
            "MissingComponent",
            "Only found 1 deployed components, but was expecting 2",
        )
        assert aw["status"].get("resettingCount", 0) == 0


def test_an_unobserved_component_is_never_reported_missing() -> None:
    aw = running()
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    assert plan.phase == Phase.RUNNING


def test_missing_component_verdict_fails_directly_even_when_not_marked_terminal() -> None:
    aw = running()
    plan = reconcile(aw, present(1), verdict(reason="MissingComponent", terminal=False), PARAMS, T0)
    assert plan.phase == Phase.FAILED


def test_healthy_verdict_clears_unhealthy() -> None:
    aw = running()
    aw["status"]["conditions"] = [c for c in aw["status"]["conditions"] if c["type"] != "Unhealthy"] + [
        {
            "type": "Unhealthy",
            "status": "True",
            "reason": "FoundFailedPods",
            "message": "",
            "lastTransitionTime": "2025-03-01T11:00:00Z",
        }
    ]
    plan = reconcile(aw, present(1), verdict("Healthy", reason=""), PARAMS, T0)
    assert plan.verdict_use is VerdictUse.APPLIED
    assert plan.status is not None
    assert (cond(plan.status, "Unhealthy")["status"], cond(plan.status, "Unhealthy")["reason"]) == (
        "False",
        "FoundNoFailedPods",
    )


def test_verdicts_for_another_incarnation_or_an_older_count_are_settled() -> None:
    aw = running()
    aw["status"]["resettingCount"] = 1
    other = Verdict(
        ref=ObjectRef(namespace="team", name="aw", uid="other"),
        state="Unhealthy",
        decided_at=T0,
        resetting_count=1,
    )
    assert reconcile(aw, present(1), other, PARAMS, T0).verdict_use is VerdictUse.SETTLED
    older = verdict(count=0)
    plan = reconcile(aw, present(1), older, PARAMS, T0)
    assert plan.verdict_use is VerdictUse.SETTLED and plan.phase == Phase.RUNNING


def test_a_verdict_newer_than_the_status_in_hand_is_held() -> None:
    aw = running()
    plan = reconcile(aw, present(1), verdict(count=1), PARAMS, T0)
    assert plan.verdict_use is VerdictUse.HELD
    assert plan.phase == Phase.RUNNING
    attempt = ltt(aw, "ResourcesDeployed")
    plan = reconcile(aw, present(1), verdict(attempt=attempt + timedelta(minutes=1)), PARAMS, T0)
    assert plan.verdict_use is VerdictUse.HELD


def test_a_verdict_arriving_while_components_are_being_created_is_held_then_applied() -> None:
    aw = appwrapper()
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    aw = apply(aw, plan)
    v = verdict(at=T0 + timedelta(seconds=1), attempt=ltt(aw, "ResourcesDeployed"))
    held = reconcile(aw, Observed(), v, PARAMS, T0 + timedelta(seconds=1))
    assert held.verdict_use is VerdictUse.HELD
    applied = reconcile(aw, Observed(created=outcomes_for(plan)), v, PARAMS, T0 + timedelta(seconds=1))
    assert applied.phase == Phase.RESETTING
    assert applied.verdict_use is VerdictUse.APPLIED


def test_suspend_while_running_goes_through_suspending_to_suspended_keeping_the_count() -> None:
    aw = running()
    aw["status"]["resettingCount"] = 1
    aw["spec"]["suspend"] = True
    plan = reconcile(aw, present(1), None, PARAMS, T0)
    aw = apply(aw, plan)
    assert plan.phase == Phase.SUSPENDING
    assert ("Suspending", "Externally suspended while in the Running phase") in k8s_events(plan)
    assert cond(aw, "QuotaReserved")["status"] == "True"
    assert cond(aw, "ResourcesDeployed")["status"] == "True"

    plan = reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(seconds=10))
    aw = apply(aw, plan)
    assert plan.phase == Phase.SUSPENDED
    for ctype in ("QuotaReserved", "ResourcesDeployed"):
        assert (cond(aw, ctype)["status"], cond(aw, ctype)["reason"]) == ("False", "Suspended")
    assert aw["status"]["resettingCount"] == 1
    assert comp_cond(aw)["reason"] == ComponentReason.DELETED

    # Suspending runs to completion even if suspend is lifted half way; then it resumes at once.
    aw["spec"]["suspend"] = False
    plan = reconcile(aw, Observed(), None, PARAMS, T0 + timedelta(seconds=20))
    assert plan.phase == Phase.RESUMING
    assert [c.index for c in of(plan, CreateComponent)] == [0]


# ------------------------------------------------------------------------------ Resetting


def resetting(now: datetime = T0, params: FaultTolerance = PARAMS) -> dict[str, Any]:
    aw = running(now, params=params)
    v = verdict(at=now, first_unhealthy_at=now, attempt=ltt(aw, "ResourcesDeployed"))
    return apply(aw, reconcile(aw, present(1), v, params, now))


def test_leftover_pods_are_deleted_gracefully_once_no_component_is_left() -> None:
    aw = resetting()
    pods = (ObservedPod("p0", "Running", terminating=True), ObservedPod("p1", "Running"))
    now = T0 + timedelta(seconds=1)

    # A component still being deleted could recreate its pods: they are left to it.
    deleting = Observed(components=(ObservedComponent(Presence.DELETING, name="c0"),), pods=pods)
    assert not deletes(reconcile(aw, deleting, None, PARAMS, now), DeletePods)

    # Once it is gone, the pods not yet terminating are deleted, with their own grace period.
    gone = Observed(components=(ObservedComponent(Presence.ABSENT, name="c0"),), pods=pods)
    plan = reconcile(aw, gone, None, PARAMS, now)
    assert deletes(plan, DeletePods) == [DeletePods(namespace="team", names=("p1",))]
    assert not deletes(plan, DeletePods, force=True), "not forceful before the grace period"
    assert plan.phase == Phase.RESETTING, "still waiting for the pods to go"

    # Only terminating pods left: nothing more to delete, just wait.
    terminating = Observed(components=(ObservedComponent(Presence.ABSENT, name="c0"),), pods=pods[:1])
    assert not deletes(reconcile(aw, terminating, None, PARAMS, now), DeletePods)


def test_staged_deletion_leaves_an_object_owned_by_someone_else_alone() -> None:
    status = {
        "conditions": [],
        "componentStatus": [
            {
                "name": "j",
                "kind": "Job",
                "apiVersion": "batch/v1",
                "conditions": [{"type": "ResourcesDeployed", "status": "True", "reason": "Created"}],
            }
        ],
    }
    foreign = Observed(
        components=(ObservedComponent(presence=Presence.PRESENT, controlled_by_us=False, name="j"),), pods=()
    )
    for when in (T0, T0 + timedelta(hours=1)):  # before and after the forceful deadline
        step = staged_deletion(
            status, namespace="ns", observed=foreign, forceful_grace=timedelta(minutes=1), now=when
        )
        assert not [a for a in step.actions if isinstance(a, DeleteComponent)]


def test_staged_deletion_escalates_to_grace_zero_pods_first_then_components() -> None:
    aw = resetting()
    stuck = [ObservedPod("p0", "Running", terminating=True), ObservedPod("p1", "Running")]
    deleting = Observed(components=(ObservedComponent(Presence.DELETING),), pods=tuple(stuck))

    plan = reconcile(aw, deleting, None, PARAMS, T0 + timedelta(minutes=5))
    assert plan.status is None
    assert not plan.actions, "a component already being deleted is not deleted again"
    assert plan.requeue_at == T0 + timedelta(minutes=5) + DELETION_POLL

    forceful_at = T0 + PARAMS.forceful_deletion_grace
    plan = reconcile(aw, deleting, None, PARAMS, forceful_at)
    aw = apply(aw, plan)
    assert deletes(plan, DeletePods, force=True) == [
        DeletePods(namespace="team", names=("p0", "p1"), force=True)
    ]
    assert not deletes(plan, DeleteComponent, force=True), "pods first"
    assert lifecycle_events(plan) == [LifecycleEventType.DELETION_FORCEFUL]
    assert [e.reason for e in of(plan, EmitEvent) if e.type == "Warning"] == ["ForcefulDeletion"]
    assert cond(aw, "DeletingResources")["message"].startswith("Forceful deletion")
    assert ltt(aw, "DeletingResources") == T0, "escalating does not restart the clock"
    assert cond(aw, "ResourcesDeployed")["status"] == "True"

    again = reconcile(aw, deleting, None, PARAMS, forceful_at + timedelta(seconds=5))
    assert deletes(again, DeletePods, force=True)
    assert not lifecycle_events(again) and again.status is None, "escalation is announced once"

    no_pods = Observed(components=(ObservedComponent(Presence.DELETING, name="c0"),), pods=())
    plan = reconcile(aw, no_pods, None, PARAMS, forceful_at + timedelta(seconds=10))
    assert deletes(plan, DeleteComponent, force=True) == [
        DeleteComponent(index=0, api_version="batch/v1", kind="Job", namespace="team", name="c0", force=True)
    ]
    assert cond(aw, "ResourcesDeployed")["status"] == "True"


def test_resources_deployed_turns_false_only_when_nothing_is_left() -> None:
    aw = resetting()
    now = T0 + timedelta(seconds=30)
    # Components gone but a pod is still terminating.
    plan = reconcile(
        aw,
        Observed(
            components=(ObservedComponent(Presence.ABSENT),), pods=(ObservedPod("p0", "Running", True),)
        ),
        None,
        PARAMS,
        now,
    )
    aw1 = apply(aw, plan)
    assert cond(aw1, "ResourcesDeployed")["status"] == "True"
    # Pods not listed: completion cannot be declared.
    plan = reconcile(
        aw, Observed(components=(ObservedComponent(Presence.ABSENT),), pods=None), None, PARAMS, now
    )
    assert cond(apply(aw, plan), "ResourcesDeployed")["status"] == "True"
    # Everything gone.
    plan = reconcile(aw, gone(1), None, PARAMS, now)
    aw = apply(aw, plan)
    deployed = cond(aw, "ResourcesDeployed")
    assert (deployed["status"], deployed["reason"], deployed["message"]) == (
        "False",
        "Resetting",
        "Resources deleted for resetting AppWrapper",
    )
    assert (cond(aw, "DeletingResources")["status"], cond(aw, "DeletingResources")["reason"]) == (
        "False",
        "DeletionComplete",
    )
    assert cond(aw, "QuotaReserved")["status"] == "True", "quota is held through a reset"
    assert plan.requeue_at == T0 + PARAMS.retry_pause


def test_retry_pause_is_measured_from_when_the_workload_was_marked_unhealthy() -> None:
    aw = resetting()
    # Deletion finished after the pause had already run out: resume at once.
    late = T0 + PARAMS.retry_pause + timedelta(seconds=30)
    aw = apply(aw, reconcile(aw, gone(1), None, PARAMS, late))
    # ... once the recreate delay has passed since the deletion completed.
    late += PARAMS.recreate_delay
    plan = reconcile(aw, Observed(), None, PARAMS, late)
    new = apply(aw, plan)
    assert plan.phase == Phase.RESUMING
    deployed = cond(new, "ResourcesDeployed")
    assert (deployed["status"], deployed["reason"], deployed["message"]) == (
        "True",
        "Resuming",
        MSG_RESET_COMPLETE,
    )
    assert ltt(new, "ResourcesDeployed") == late
    assert cond(new, "Unhealthy")["status"] == "False"
    assert cond(new, "QuotaReserved")["status"] == "True"
    assert LifecycleEventType.RESET_FINISHED in lifecycle_events(plan)
    assert [c.index for c in of(plan, CreateComponent)] == [0]
    assert plan.finalizer is None, "the finalizer is already there"


def test_components_are_not_recreated_sooner_than_the_recreate_delay_after_deletion() -> None:
    """Even with no retry pause left, the old attempt's namesakes stay gone for a moment, so
    controllers working from a lagging cache see the deletion before the new object appears."""
    params = dataclasses.replace(PARAMS, retry_pause=timedelta(0), recreate_delay=timedelta(seconds=3))
    aw = resetting(T0, params)
    done = T0 + timedelta(seconds=5)
    plan = reconcile(aw, gone(1), None, params, done)
    aw = apply(aw, plan)
    assert plan.phase == Phase.RESETTING
    assert cond(aw, "ResourcesDeployed")["status"] == "False"
    assert plan.requeue_at == done + timedelta(seconds=3)
    assert not of(plan, CreateComponent)
    plan = reconcile(aw, Observed(), None, params, done + timedelta(seconds=2, milliseconds=999))
    assert plan.phase == Phase.RESETTING and not of(plan, CreateComponent)
    assert plan.requeue_at == done + timedelta(seconds=3)
    plan = reconcile(aw, Observed(), None, params, done + timedelta(seconds=3))
    assert plan.phase == Phase.RESUMING
    assert [c.index for c in of(plan, CreateComponent)] == [0]
    # A delay of 0 recreates in the pass that finds everything gone, as upstream would.
    params = dataclasses.replace(params, recreate_delay=timedelta(0))
    plan = reconcile(resetting(T0, params), gone(1), None, params, done)
    assert plan.phase == Phase.RESUMING


def test_the_pause_survives_a_restart_because_it_is_read_from_the_status() -> None:
    aw = resetting()
    aw = apply(aw, reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(seconds=10)))
    # A brand new instance (no memory) looks at it at various times.
    for offset, phase in ((30, Phase.RESETTING), (89, Phase.RESETTING), (90, Phase.RESUMING)):
        plan = reconcile(copy.deepcopy(aw), Observed(), None, PARAMS, T0 + timedelta(seconds=offset))
        assert plan.phase == phase, offset
        if phase == Phase.RESETTING:
            assert plan.requeue_at == T0 + PARAMS.retry_pause


def test_suspend_during_reset_goes_to_suspending() -> None:
    aw = resetting()
    aw["spec"]["suspend"] = True
    plan = reconcile(aw, present(1), None, PARAMS, T0 + timedelta(seconds=3))
    assert plan.phase == Phase.SUSPENDING
    assert ("Suspending", "Externally suspended while in the Resetting phase") in k8s_events(plan)


def test_a_full_cycle_recreates_and_counts_one_reset() -> None:
    aw = resetting()
    aw = apply(aw, reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(seconds=20)))
    plan = reconcile(aw, Observed(), None, PARAMS, T0 + PARAMS.retry_pause)
    aw = apply(aw, plan)
    aw = apply(aw, reconcile(aw, Observed(created=outcomes_for(plan)), None, PARAMS, T0 + PARAMS.retry_pause))
    assert aw["status"]["phase"] == Phase.RUNNING
    assert aw["status"]["resettingCount"] == 1
    assert comp_cond(aw)["status"] == "True"


def test_an_always_failing_workload_ends_failed_with_count_equal_to_the_limit() -> None:
    params = FaultTolerance(
        retry_limit=2, retry_pause=timedelta(0), forceful_deletion_grace=timedelta(seconds=1)
    )
    now = T0
    aw = running(now, params=params)
    for _ in range(10):
        if aw["status"]["phase"] == Phase.FAILED:
            break
        now += timedelta(seconds=10)
        count = aw["status"].get("resettingCount", 0)
        aw = apply(aw, reconcile(aw, present(1), verdict(count=count, at=now), params, now))
        while aw["status"]["phase"] == Phase.RESETTING:
            now += timedelta(seconds=1)
            plan = reconcile(aw, gone(1), None, params, now)
            aw = apply(aw, plan)
        if aw["status"]["phase"] == Phase.RESUMING:
            aw = apply(aw, reconcile(aw, Observed(created=outcomes_for(plan)), None, params, now))
    assert aw["status"]["phase"] == Phase.FAILED
    assert aw["status"]["resettingCount"] == 2
    aw = apply(aw, reconcile(aw, gone(1), None, params, now + timedelta(seconds=1)))
    assert cond(aw, "ResourcesDeployed")["status"] == "False"
    assert cond(aw, "QuotaReserved")["status"] == "False"


# --------------------------------------------------------------------------------- Failed


def failed(params: FaultTolerance, now: datetime = T0) -> dict[str, Any]:
    aw = running(now, params=params)
    v = verdict(terminal=True, at=now, attempt=ltt(aw, "ResourcesDeployed"))
    return apply(aw, reconcile(aw, present(1), v, params, now))


def test_failed_deletes_resources_then_releases_quota() -> None:
    aw = failed(PARAMS)
    assert cond(aw, "DeletingResources")["status"] == "True", "deletion starts in the same plan"
    plan = reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(seconds=5))
    aw = apply(aw, plan)
    assert plan.phase == Phase.FAILED
    deployed = cond(aw, "ResourcesDeployed")
    assert (deployed["status"], deployed["reason"], deployed["message"]) == (
        "False",
        "Failed",
        MSG_RESOURCES_DELETED_FAILED,
    )
    quota = cond(aw, "QuotaReserved")
    assert (quota["status"], quota["reason"], quota["message"]) == (
        "False",
        "Failed",
        "No resources deployed",
    )
    assert plan.requeue_at is None
    assert reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(hours=1)).empty


def test_deletion_on_failure_grace_keeps_resources_and_quota_until_it_expires() -> None:
    params = FaultTolerance(deletion_on_failure_grace=timedelta(minutes=10))
    aw = failed(params)
    paused = cond(aw, "DeletingResources")
    assert (paused["status"], paused["reason"]) == ("False", "DeletionPaused")
    assert (
        paused["message"]
        == "workload.codeflare.dev.appwrapper/deletionOnFailureGracePeriodDuration has value 10m0s"
    )
    plan = reconcile(aw, present(1), None, params, T0 + timedelta(minutes=9))
    assert plan.empty is False and not plan.actions and plan.status is None
    assert plan.requeue_at == T0 + timedelta(minutes=10)
    assert cond(aw, "QuotaReserved")["status"] == "True"

    plan = reconcile(aw, present(1), None, params, T0 + timedelta(minutes=10))
    assert deletes(plan, DeleteComponent)
    aw = apply(aw, plan)
    aw = apply(aw, reconcile(aw, gone(1), None, params, T0 + timedelta(minutes=11)))
    assert cond(aw, "ResourcesDeployed")["message"] == MSG_RESOURCES_DELETED_FAILED
    assert cond(aw, "QuotaReserved")["status"] == "False"


def test_suspend_cuts_the_deletion_on_failure_grace_short() -> None:
    params = FaultTolerance(deletion_on_failure_grace=timedelta(hours=1))
    aw = failed(params)
    aw["spec"]["suspend"] = True
    plan = reconcile(aw, present(1), None, params, T0 + timedelta(minutes=1))
    assert deletes(plan, DeleteComponent)
    aw = apply(aw, plan)
    aw = apply(aw, reconcile(aw, gone(1), None, params, T0 + timedelta(minutes=2)))
    assert cond(aw, "ResourcesDeployed")["message"] == MSG_KUEUE_FORCED_DELETION


def test_deletion_on_failure_window_starts_when_failed_even_after_an_earlier_reset() -> None:
    params = FaultTolerance(deletion_on_failure_grace=timedelta(minutes=10), retry_pause=timedelta(0))
    aw = resetting(T0, params)
    aw = apply(aw, reconcile(aw, gone(1), None, params, T0 + timedelta(seconds=10)))
    resume = T0 + timedelta(seconds=10) + params.recreate_delay
    plan = reconcile(aw, Observed(), None, params, resume)
    aw = apply(aw, plan)
    aw = apply(aw, reconcile(aw, Observed(created=outcomes_for(plan)), None, params, resume))
    assert cond(aw, "DeletingResources")["reason"] == "DeletionComplete"
    fail_at = T0 + timedelta(hours=2)
    aw = apply(aw, reconcile(aw, present(1), verdict(count=1, terminal=True, at=fail_at), params, fail_at))
    assert aw["status"]["phase"] == Phase.FAILED
    assert ltt(aw, "DeletingResources") == fail_at
    plan = reconcile(aw, present(1), None, params, fail_at + timedelta(minutes=5))
    assert not plan.actions and plan.requeue_at == fail_at + timedelta(minutes=10)


# ------------------------------------------------------------------------------ Succeeded


def test_resources_of_a_succeeded_workload_are_removed_after_the_success_ttl() -> None:
    params = FaultTolerance(success_ttl=timedelta(minutes=30))
    aw = running(T0, params=params)
    done = T0 + timedelta(hours=3)
    aw = apply(aw, reconcile(aw, present(1), verdict("Succeeded", reason="Succeeded", at=done), params, done))
    plan = reconcile(aw, present(1), None, params, done + timedelta(minutes=29))
    assert not plan.actions and plan.requeue_at == done + timedelta(minutes=30), "TTL runs from success"
    plan = reconcile(aw, present(1), None, params, done + timedelta(minutes=30))
    assert deletes(plan, DeleteComponent)
    aw = apply(aw, plan)
    aw = apply(aw, reconcile(aw, gone(1), None, params, done + timedelta(minutes=31)))
    deployed = cond(aw, "ResourcesDeployed")
    assert (deployed["status"], deployed["reason"], deployed["message"]) == (
        "False",
        "Succeeded",
        "Time to live after success of 30m0s expired",
    )
    assert aw["status"]["phase"] == Phase.SUCCEEDED


# ---------------------------------------------------------------------------- Terminating


def test_deleting_the_appwrapper_deletes_everything_then_removes_the_finalizer() -> None:
    aw = resetting()
    aw["metadata"]["deletionTimestamp"] = "2025-03-01T12:00:05Z"
    plan = reconcile(aw, present(1), None, PARAMS, T0 + timedelta(seconds=5))
    aw = apply(aw, plan)
    assert plan.phase == Phase.TERMINATING
    assert plan.finalizer is None
    assert deletes(plan, DeleteComponent)

    plan = reconcile(aw, gone(1), None, PARAMS, T0 + timedelta(seconds=10))
    aw = apply(aw, plan)
    assert plan.finalizer is FinalizerChange.REMOVE
    for ctype in ("ResourcesDeployed", "QuotaReserved"):
        assert (cond(aw, ctype)["status"], cond(aw, ctype)["reason"]) == ("False", "Terminating")
    assert FINALIZER not in aw["metadata"]["finalizers"]


def test_a_deleted_appwrapper_without_our_finalizer_is_left_alone() -> None:
    aw = appwrapper(suspend=True)
    aw["metadata"]["deletionTimestamp"] = "2025-03-01T12:00:05Z"
    assert reconcile(aw, Observed(), None, PARAMS, T0).empty


def test_a_suspended_appwrapper_with_finalizer_is_released_at_once_on_deletion() -> None:
    aw = running()
    aw["spec"]["suspend"] = True
    aw = apply(aw, reconcile(aw, gone(1), None, PARAMS, T0))
    assert aw["status"]["phase"] == Phase.SUSPENDED
    aw["metadata"]["deletionTimestamp"] = "2025-03-01T12:00:05Z"
    plan = reconcile(aw, Observed(), None, PARAMS, T0)
    assert plan.finalizer is FinalizerChange.REMOVE
    assert not plan.actions


# ---------------------------------------------------------------------------- managedBy


def test_an_appwrapper_managed_by_another_controller_gets_no_plan() -> None:
    aw = appwrapper(managedBy="kueue.x-k8s.io/multikueue")
    plan = reconcile(aw, Observed(), verdict(), PARAMS, T0)
    assert plan.empty
    assert plan.verdict_use is VerdictUse.SETTLED
    ours = appwrapper(managedBy=CONTROLLER_NAME)
    assert reconcile(ours, Observed(), None, PARAMS, T0).phase == Phase.RESUMING


# ------------------------------------------------------------------------ property tests

PHASES = [p.value for p in Phase]
CTYPES = ["QuotaReserved", "ResourcesDeployed", "PodsReady", "Unhealthy", "DeletingResources"]


@st.composite
def conditions(draw: st.DrawFn, types: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for ctype in types:
        if draw(st.booleans()):
            offset = draw(st.integers(min_value=-10_000, max_value=100))
            out.append(
                {
                    "type": ctype,
                    "status": draw(st.sampled_from(["True", "False", "Unknown"])),
                    "reason": draw(
                        st.sampled_from(
                            [
                                "Resuming",
                                "DeletionComplete",
                                "ComponentCreationInitiated",
                                "CompononetDeleted",
                                "X",
                            ]
                        )
                    ),
                    "message": draw(st.sampled_from(["", "Forceful deletion (grace period 0): x", "m"])),
                    "lastTransitionTime": (T0 + timedelta(seconds=offset)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            )
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, Any], Observed, Verdict | None, FaultTolerance, datetime]:
    n = draw(st.integers(min_value=1, max_value=3))
    components = [{"template": job(f"c{i}")} for i in range(n)]
    status: dict[str, Any] = {
        "phase": draw(st.sampled_from(PHASES)),
        "conditions": draw(conditions(CTYPES)),
    }
    if draw(st.booleans()):
        status["resettingCount"] = draw(st.integers(min_value=0, max_value=5))
    if draw(st.booleans()):
        status["componentStatus"] = [
            {
                "name": f"c{i}" if draw(st.booleans()) else "",
                "kind": "Job",
                "apiVersion": "batch/v1",
                "podSets": [{"path": "template.spec.template", "replicas": 2}],
                "conditions": draw(conditions(["ResourcesDeployed"])),
            }
            for i in range(draw(st.integers(min_value=0, max_value=n)))
        ]
    aw = appwrapper(
        suspend=draw(st.booleans()),
        components=components,
        status=status,
        finalizers=[FINALIZER] if draw(st.booleans()) else [],
    )
    if draw(st.integers(min_value=0, max_value=5)) == 0:
        aw["metadata"]["deletionTimestamp"] = "2025-03-01T11:00:00Z"
    presences = st.sampled_from(list(Presence))
    observed = Observed(
        components=tuple(
            ObservedComponent(draw(presences), draw(st.booleans()), draw(st.sampled_from(["", "x"])))
            for _ in range(draw(st.integers(min_value=0, max_value=n)))
        ),
        pods=draw(
            st.none()
            | st.lists(
                st.builds(
                    ObservedPod,
                    name=st.sampled_from(["p0", "p1", "p2"]),
                    phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
                    terminating=st.booleans(),
                ),
                max_size=3,
            ).map(tuple)
        ),
        created=draw(
            st.dictionaries(
                st.integers(min_value=0, max_value=n),
                st.builds(
                    CreateOutcome,
                    result=st.sampled_from(list(CreateResult)),
                    name=st.sampled_from(["", "g"]),
                    controlled_by_us=st.booleans(),
                ),
                max_size=n,
            )
        ),
    )
    v = None
    if draw(st.booleans()):
        v = verdict(
            draw(st.sampled_from(["Healthy", "Unhealthy", "Succeeded", "Deleted"])),
            reason=draw(st.sampled_from(["FoundFailedPods", "AutopilotNoExecute", "MissingComponent", ""])),
            count=draw(st.integers(min_value=0, max_value=5)),
            at=T0 + timedelta(seconds=draw(st.integers(min_value=-20_000, max_value=100))),
            terminal=draw(st.booleans()),
            counts_toward_retry=draw(st.booleans()),
        )
    params = FaultTolerance(
        retry_limit=draw(st.integers(min_value=0, max_value=4)),
        retry_pause=timedelta(seconds=draw(st.integers(min_value=0, max_value=200))),
        forceful_deletion_grace=timedelta(seconds=draw(st.integers(min_value=0, max_value=200))),
        deletion_on_failure_grace=timedelta(seconds=draw(st.sampled_from([0, 60]))),
        admission_grace=timedelta(seconds=draw(st.integers(min_value=0, max_value=100))),
    )
    now = T0 + timedelta(
        seconds=draw(st.integers(min_value=0, max_value=500)), microseconds=draw(st.integers(0, 999_999))
    )
    return aw, observed, v, params, now


def count_of(aw: Mapping[str, Any]) -> int:
    return int(aw.get("status", {}).get("resettingCount", 0))


def cluster_after(observed: Observed, plan: Plan, n: int) -> Observed:
    """A tiny cluster: what the service would observe after carrying out ``plan``."""
    comps = list(observed.components) + [ObservedComponent()] * (n - len(observed.components))
    pods = list(observed.pods or ())
    created: dict[int, CreateOutcome] = {}
    for action in plan.actions:
        if isinstance(action, CreateComponent):
            name = action.body["metadata"].get("name", "")
            comps[action.index] = ObservedComponent(Presence.PRESENT, True, name)
            created[action.index] = CreateOutcome(CreateResult.CREATED, name=name)
        elif isinstance(action, DeleteComponent):
            comps[action.index] = ObservedComponent(Presence.ABSENT)
        elif isinstance(action, DeletePods) and action.force:
            pods = [p for p in pods if p.name not in action.names]
    if all(c.presence is Presence.ABSENT for c in comps):
        pods = []  # the components' controllers cascaded the deletion
    return Observed(tuple(comps), tuple(pods), created)


# Admitted again with the create record an earlier attempt left on a component whose name was
# never learned, and no admission grace: the record must not make each attempt reset in turn.
LEFTOVER_CREATE_RECORD = (
    appwrapper(
        components=[{"template": job("c0")}],
        status={
            "phase": "Suspended",
            "conditions": [],
            "componentStatus": [
                {
                    "name": "",
                    "kind": "Job",
                    "apiVersion": "batch/v1",
                    "podSets": [{"path": "template.spec.template", "replicas": 2}],
                    "conditions": [
                        {
                            "type": "ResourcesDeployed",
                            "status": "Unknown",
                            "reason": "Resuming",
                            "message": "",
                            "lastTransitionTime": "2025-03-01T12:00:00Z",
                        }
                    ],
                }
            ],
        },
    ),
    Observed(components=(), pods=None, created={}, nodes=None),
    verdict("Healthy", reason="FoundFailedPods", count=0, at=T0, terminal=False, counts_toward_retry=False),
    FaultTolerance(
        admission_grace=timedelta(0),
        retry_pause=timedelta(0),
        retry_limit=2,
        deletion_on_failure_grace=timedelta(0),
        forceful_deletion_grace=timedelta(0),
    ),
    T0,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=8))
@example(LEFTOVER_CREATE_RECORD, [0, 2])
def test_reconcile_never_raises_never_exceeds_the_limit_and_counts_a_verdict_once(
    scenario: tuple[dict[str, Any], Observed, Verdict | None, FaultTolerance, datetime], later: list[int]
) -> None:
    aw, observed, v, params, now = scenario
    n = len(aw["spec"]["components"])
    start = count_of(aw)
    for delay in [0, *later]:
        now = now + timedelta(seconds=delay)
        before = count_of(aw)
        plan = reconcile(aw, observed, v, params, now)
        if plan.status is None:
            assert not [a for a in plan.actions if isinstance(a, EmitEvent | PublishLifecycleEvent)], (
                "announcements only travel with a status change"
            )
        aw = apply(aw, plan)
        after = count_of(aw)
        assert after <= max(before, params.retry_limit), "resettingCount never passes the retry limit"
        assert after - before in (0, 1)
        if after > before:
            assert v is not None or plan.phase == Phase.RESETTING
        observed = cluster_after(observed, plan, n)
    verdict_resets = count_of(aw) - start
    assert verdict_resets <= 1 or v is None, "one verdict, at most one counted reset"


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_reconcile_is_deterministic_and_leaves_its_input_untouched(
    scenario: tuple[dict[str, Any], Observed, Verdict | None, FaultTolerance, datetime],
) -> None:
    aw, observed, v, params, now = scenario
    frozen = copy.deepcopy(aw)
    first = reconcile(aw, observed, v, params, now)
    assert aw == frozen
    assert reconcile(aw, observed, v, params, now) == first


@settings(max_examples=300, deadline=None)
@given(
    reason=st.sampled_from(
        ["FoundFailedPods", "AutopilotNoExecute", "FailedComponent", "InsufficientPodsReady"]
    ),
    counts=st.booleans(),
    with_attempt=st.booleans(),
    start_count=st.integers(min_value=0, max_value=3),
    limit=st.integers(min_value=0, max_value=4),
    pause=st.integers(min_value=0, max_value=120),
    forceful=st.integers(min_value=0, max_value=120),
    delays=st.lists(st.integers(min_value=0, max_value=90), min_size=4, max_size=16),
)
def test_one_verdict_delivered_over_and_over_resets_at_most_once(
    reason: str,
    counts: bool,
    with_attempt: bool,
    start_count: int,
    limit: int,
    pause: int,
    forceful: int,
    delays: list[int],
) -> None:
    """Redelivery through whole reset cycles: the verdict is offered to every reconcile."""
    params = FaultTolerance(
        retry_limit=limit,
        retry_pause=timedelta(seconds=pause),
        forceful_deletion_grace=timedelta(seconds=forceful),
    )
    aw = running(params=params)
    aw["status"]["resettingCount"] = start_count
    v = verdict(
        reason=reason,
        count=start_count,
        counts_toward_retry=counts,
        attempt=ltt(aw, "ResourcesDeployed") if with_attempt else None,
        at=T0,
    )
    observed = present(1)
    now = T0
    resets = 0
    for delay in delays:
        now += timedelta(seconds=delay)
        plan = reconcile(aw, observed, v, params, now)
        resets += LifecycleEventType.RESET_STARTED in lifecycle_events(plan)
        aw = apply(aw, plan)
        observed = cluster_after(observed, plan, 1)
    assert resets <= 1
    assert count_of(aw) <= max(start_count, limit)
    assert count_of(aw) == start_count + (1 if resets and counts else 0)


def test_the_pod_caches_unconfirmed_none_never_completes_a_deletion() -> None:
    """A workload starting or running may take its pods from the pod cache's "none so far"
    without a LIST; a deletion that then begins (in that pass or a later one) must not take it
    for "none left", which lets a reset recreate the components and releases quota."""
    aw = resetting()
    now = T0 + timedelta(seconds=30)
    unconfirmed = Observed(components=(ObservedComponent(Presence.ABSENT),), pods=(), pods_confirmed=False)
    plan = reconcile(aw, unconfirmed, None, PARAMS, now)
    assert cond(apply(aw, plan), "ResourcesDeployed")["status"] == "True", "still deleting"
    assert plan.phase == Phase.RESETTING
    # Past the forceful deadline it does not escalate on it either (forcing needs the names).
    late = reconcile(aw, unconfirmed, None, PARAMS, T0 + PARAMS.forceful_deletion_grace)
    assert not deletes(late, DeletePods, force=True)
    assert late.phase == Phase.RESETTING
    # The same "none" confirmed (a LIST's) completes it.
    confirmed = Observed(components=(ObservedComponent(Presence.ABSENT),), pods=())
    done = apply(aw, reconcile(aw, confirmed, None, PARAMS, now))
    assert cond(done, "ResourcesDeployed")["status"] == "False"


def test_a_running_workload_counts_the_unconfirmed_none_for_pods_ready_only() -> None:
    aw = running()
    now = T0 + timedelta(seconds=1)
    two = [ObservedPod("p0", "Running"), ObservedPod("p1", "Running")]
    ready = apply(aw, reconcile(aw, present(1, two), None, PARAMS, now))
    assert cond(ready, "PodsReady")["status"] == "True"
    # The pods went away (as the cache saw it): PodsReady falls, and nothing else happens.
    unconfirmed = Observed(components=(ObservedComponent(Presence.PRESENT),), pods=(), pods_confirmed=False)
    plan = reconcile(ready, unconfirmed, None, PARAMS, now + timedelta(seconds=1))
    assert plan.phase == Phase.RUNNING
    assert not [a for a in plan.actions if isinstance(a, DeleteComponent | DeletePods)]
    assert cond(apply(ready, plan), "PodsReady")["status"] == "False"
