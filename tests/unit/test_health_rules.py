"""Health rules, one behaviour per test, with the clock passed in."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from respawn.testbed import manifests
from services.health.rules import (
    FAILED_POD_SETTLE,
    REASON_APPWRAPPER_DELETED,
    Decision,
    evaluate,
    verdict_msg_id,
)
from services.health.state import (
    AppWrapperHealth,
    FailureSettings,
    Observation,
    apply,
    failure_facts,
    forget_departed,
    gone,
    node_changes,
    remember_published,
    touched_by,
)
from shared.appwrapper.constants import CONTROLLER_NAME
from shared.appwrapper.params import (
    ADMISSION_GRACE_PERIOD_ANNOTATION,
    FAILURE_GRACE_PERIOD_ANNOTATION,
    RETRYABLE_EXIT_CODES_ANNOTATION,
    TERMINAL_EXIT_CODES_ANNOTATION,
    WARMUP_GRACE_PERIOD_ANNOTATION,
)
from shared.failures.annotation import FAILURE_PATTERNS_ANNOTATION
from shared.failures.patterns import FailurePattern
from shared.faulttolerance import FaultTolerance
from shared.kubetime import format_kube_time
from shared.messages import (
    AppWrapperObservation,
    ComponentObservation,
    ContainerState,
    NodeVerdict,
    ObjectRef,
    PodConditionState,
    PodObservation,
    Verdict,
)

# --------------------------------------------------------------------------- builders

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NS = "team-a"
AW = "train"
UID = "aw-uid-1"
GPU = "nvidia.com/gpu"
MIN = timedelta(minutes=1)
SEC = timedelta(seconds=1)


def aw_body(
    *,
    phase: str = "Running",
    deployed_at: datetime | None = T0,
    resetting_count: int = 0,
    annotations: dict[str, str] | None = None,
    replicas: Any = 2,
    suspend: bool = False,
    components: Sequence[tuple[str, str]] = (("Job", "train-job"),),
    deletion_timestamp: datetime | None = None,
    managed_by: str | None = None,
    uid: str = UID,
) -> dict[str, Any]:
    body = manifests.appwrapper(
        AW, namespace=NS, annotations=annotations or {}, suspend=suspend, managedBy=managed_by
    )
    body["metadata"]["uid"] = uid
    if deletion_timestamp is not None:
        body["metadata"]["deletionTimestamp"] = format_kube_time(deletion_timestamp)
    conditions = []
    if deployed_at is not None:
        conditions.append(
            manifests.condition(
                "ResourcesDeployed", reason="Resuming", message="Suspend is false", at=deployed_at
            )
        )
    component_status = [
        {
            "name": name,
            "kind": kind,
            "apiVersion": "batch/v1",
            # Replicas are split over the components so the total is ``replicas``.
            "podSets": [{"replicas": replicas if i == 0 else 0, "path": "template.spec.template"}],
        }
        for i, (kind, name) in enumerate(components)
    ]
    body["status"] = {
        "phase": phase,
        "resettingCount": resetting_count,
        "conditions": conditions,
        "componentStatus": component_status,
    }
    return body


def aw_obs(*, observed_at: datetime = T0, deleted: bool = False, **body: Any) -> AppWrapperObservation:
    uid = body.get("uid", UID)
    return AppWrapperObservation(
        ref=ObjectRef(namespace=NS, name=AW, uid=uid),
        deleted=deleted,
        observed_at=observed_at,
        body=aw_body(**body),
    )


def container(
    name: str = "main",
    *,
    exit_code: int | None = None,
    finished_at: datetime | None = None,
    init: bool = False,
) -> ContainerState:
    terminated = exit_code is not None or finished_at is not None
    return ContainerState(
        name=name,
        init=init,
        state="terminated" if terminated else "running",
        exit_code=exit_code,
        finished_at=finished_at,
    )


def pod(
    name: str,
    phase: str = "Running",
    *,
    created_at: datetime | None = T0 + SEC,
    observed_at: datetime | None = None,
    node: str = "node-1",
    resources: Iterable[str] = (),
    containers: Iterable[ContainerState] = (),
    uid: str | None = None,
    deletion_requested: bool = False,
    deleted: bool = False,
    appwrapper: str = AW,
) -> PodObservation:
    return PodObservation(
        ref=ObjectRef(namespace=NS, name=name, uid=uid or f"{name}-uid"),
        appwrapper=appwrapper,
        deleted=deleted,
        observed_at=observed_at or (created_at or T0) + SEC,
        created_at=created_at,
        deletion_requested=deletion_requested,
        phase=phase,
        node_name=node,
        containers=tuple(containers),
        resources=tuple(resources),
    )


def failed_pod(
    name: str, *, finished_at: datetime | None = None, exit_code: int = 1, **kwargs: Any
) -> PodObservation:
    return pod(name, "Failed", containers=[container(exit_code=exit_code, finished_at=finished_at)], **kwargs)


def component(
    name: str = "train-job",
    kind: str = "Job",
    *,
    failed: bool = False,
    deleted: bool = False,
    deletion_requested: bool = False,
    created_at: datetime | None = T0 + SEC,
    observed_at: datetime | None = None,
    uid: str = "job-uid-1",
    status_message: str = "",
) -> ComponentObservation:
    return ComponentObservation(
        ref=ObjectRef(namespace=NS, name=name, uid=uid),
        appwrapper=AW,
        api_version="batch/v1",
        kind=kind,
        deleted=deleted,
        deletion_requested=deletion_requested,
        failed=failed,
        status_message=status_message,
        observed_at=observed_at or (created_at or T0) + SEC,
        created_at=created_at,
    )


def node_verdict(
    nodes: Iterable[str] = ("node-1",), *, decided_at: datetime = T0, resource: str = GPU
) -> NodeVerdict:
    return NodeVerdict(resource=resource, no_execute=tuple(nodes), decided_at=decided_at)


def fold(observations: Iterable[Observation], state: AppWrapperHealth | None = None) -> AppWrapperHealth:
    state = state or AppWrapperHealth(namespace=NS, name=AW, defaults=FaultTolerance())
    for obs in observations:
        state = apply(state, obs)
    return state


def running(*names: str, **kwargs: Any) -> list[PodObservation]:
    return [pod(n, "Running", **kwargs) for n in names]


def decide(observations: Iterable[Observation], now: datetime) -> Decision:
    return evaluate(fold(observations), now)


def verdict_of(observations: Iterable[Observation], now: datetime) -> Verdict:
    decision = decide(observations, now)
    assert decision.verdict is not None
    return decision.verdict


# ------------------------------------------------------------------------ when to judge


def test_nothing_is_decided_before_the_appwrapper_is_seen() -> None:
    decision = decide(running("p0", "p1"), T0 + MIN)
    assert decision.verdict is None
    assert decision.next_deadline is None


def test_a_healthy_running_appwrapper_gets_one_healthy_verdict() -> None:
    state = fold([aw_obs(), *running("p0", "p1")])
    first = evaluate(state, T0 + MIN)
    assert first.verdict is not None
    v = first.verdict
    assert (v.state, v.reason, v.seq, v.terminal) == ("Healthy", "", 1, False)
    assert v.ref == ObjectRef(namespace=NS, name=AW, uid=UID)
    assert v.attempt_started_at == T0
    assert v.decided_at == T0 + MIN
    assert first.next_deadline is None
    again = evaluate(first.state, T0 + 10 * MIN)
    assert again.verdict is None


@pytest.mark.parametrize(
    "phase", ["", "Suspended", "Resuming", "Resetting", "Suspending", "Succeeded", "Failed"]
)
def test_only_running_appwrappers_are_judged(phase: str) -> None:
    decision = decide([aw_obs(phase=phase), failed_pod("p0", finished_at=T0)], T0 + 10 * MIN)
    assert decision.verdict is None
    assert decision.next_deadline is None


@pytest.mark.parametrize(
    "body",
    [
        {"suspend": True},
        {"deletion_timestamp": T0 + MIN},
        {"managed_by": "kueue.x-k8s.io/multikueue"},
    ],
    ids=["suspended-by-kueue", "being-deleted", "managed-elsewhere"],
)
def test_running_appwrappers_that_are_leaving_or_not_ours_are_not_judged(body: dict[str, Any]) -> None:
    decision = decide([aw_obs(**body), failed_pod("p0", finished_at=T0)], T0 + 10 * MIN)
    assert decision.verdict is None


def test_managed_by_this_controller_is_judged() -> None:
    v = verdict_of([aw_obs(managed_by=CONTROLLER_NAME), *running("p0", "p1")], T0 + MIN)
    assert v.state == "Healthy"


# -------------------------------------------------------------------------- failed pods


def test_failed_pod_is_unhealthy_only_after_failure_grace_from_its_finish_time() -> None:
    failed_at = T0 + 2 * MIN
    state = fold(
        [aw_obs(), pod("p0"), failed_pod("p1", finished_at=failed_at, observed_at=failed_at + 20 * SEC)]
    )

    during = evaluate(state, failed_at + 30 * SEC)
    assert during.verdict is not None
    v = during.verdict
    assert (v.state, v.reason) == ("Healthy", "FoundFailedPods")
    assert v.first_unhealthy_at == failed_at
    assert v.deadline == failed_at + MIN
    assert v.nodes == ("node-1",)
    assert during.next_deadline == failed_at + MIN

    assert evaluate(during.state, failed_at + MIN - timedelta(microseconds=1)).verdict is None
    after = evaluate(during.state, failed_at + MIN)
    assert after.verdict is not None
    u = after.verdict
    assert (u.state, u.reason, u.terminal, u.counts_toward_retry) == (
        "Unhealthy",
        "FoundFailedPods",
        False,
        True,
    )
    assert u.first_unhealthy_at == failed_at
    assert u.deadline == failed_at + MIN
    assert u.message.startswith("1 failed pods: p1")
    assert u.seq == 2
    assert after.next_deadline is None


def test_a_failed_pod_deleted_before_the_rules_run_is_still_judged_once() -> None:
    """Its controller deleted it within milliseconds (KubeRay replaces a failed worker so): the
    failure and the tombstone are folded in together, and the failure is still judged."""
    no_grace = {FAILURE_GRACE_PERIOD_ANNOTATION: "0s"}
    state = fold(
        [
            aw_obs(annotations=no_grace),
            pod("p0"),
            failed_pod("p1", finished_at=T0 + MIN),
            pod("p1", "Failed", deletion_requested=True),
            pod("p1", deleted=True),
        ]
    )
    assert "p1" not in state.pods
    decision = evaluate(state, T0 + MIN)
    assert decision.verdict is not None
    assert (decision.verdict.state, decision.verdict.reason) == ("Unhealthy", "FoundFailedPods")
    assert decision.verdict.message.startswith("1 failed pods: p1")

    judged = forget_departed(decision.state, state)
    assert judged.departed == {}
    assert not gone(judged)


def test_a_departed_failure_is_judged_by_one_evaluation_only() -> None:
    """Within the failure grace period the pod is gone by the deadline: as upstream, the
    AppWrapper is not reset for a failed pod that no longer exists then."""
    state = fold([aw_obs(), pod("p0"), failed_pod("p1", finished_at=T0 + MIN), pod("p1", deleted=True)])
    during = evaluate(state, T0 + MIN + SEC)
    assert during.verdict is not None
    assert (during.verdict.state, during.verdict.reason) == ("Healthy", "FoundFailedPods")
    replaced = fold([pod("p2", created_at=T0 + MIN + SEC)], forget_departed(during.state, state))
    after = evaluate(replaced, T0 + 2 * MIN)
    assert after.verdict is not None
    assert (after.verdict.state, after.verdict.reason) == ("Healthy", "")


def test_only_the_departed_pods_an_evaluation_saw_are_forgotten() -> None:
    judged = fold([aw_obs(), failed_pod("p1", finished_at=T0), pod("p1", deleted=True)])
    later = fold([failed_pod("p2", finished_at=T0), pod("p2", deleted=True)], judged)
    assert set(forget_departed(later, judged).departed) == {"p2-uid"}


@pytest.mark.parametrize("phase", ["Running", "Pending", "Succeeded"])
def test_only_a_failed_pod_departs_with_its_tombstone(phase: str) -> None:
    state = fold([aw_obs(), pod("p0", phase), pod("p0", deleted=True)])
    assert state.departed == {}
    assert state.pods == {}


def test_the_tombstone_of_an_earlier_pod_of_that_name_does_not_depart_the_current_one() -> None:
    state = fold([aw_obs(), failed_pod("p0", uid="new"), pod("p0", uid="old", deleted=True)])
    assert state.departed == {}
    assert state.pods["p0"].uid == "new"


def test_departed_failures_alone_keep_an_appwrapper_known() -> None:
    state = fold([failed_pod("p1", finished_at=T0), pod("p1", deleted=True)])
    assert not gone(state)
    assert gone(forget_departed(state, state))


def test_without_a_finish_time_the_first_failed_observation_starts_the_clock() -> None:
    first_seen = T0 + 2 * MIN
    state = fold(
        [
            aw_obs(),
            pod("p0"),
            pod("p1", "Failed", observed_at=first_seen),
            # A later observation of the same failed pod does not restart the clock.
            pod("p1", "Failed", observed_at=first_seen + 40 * SEC),
        ]
    )
    decision = evaluate(state, first_seen + MIN)
    assert decision.verdict is not None
    assert decision.verdict.state == "Unhealthy"
    assert decision.verdict.first_unhealthy_at == first_seen


def test_a_restarted_instance_computes_the_same_failure_deadline() -> None:
    failed_at = T0 + 2 * MIN
    history = [aw_obs(), pod("p0"), pod("p1"), failed_pod("p1", finished_at=failed_at, observed_at=failed_at)]
    # The restarted instance sees only the latest observation of each object, much later.
    latest = [
        aw_obs(observed_at=T0 + 5 * MIN),
        pod("p0"),
        failed_pod("p1", finished_at=failed_at, observed_at=T0 + 5 * MIN),
    ]
    a = evaluate(fold(history), failed_at + 10 * SEC)
    b = evaluate(fold(latest), failed_at + 10 * SEC)
    assert a.next_deadline == b.next_deadline == failed_at + MIN


def test_the_earliest_failure_starts_the_clock_and_only_its_node_is_blamed() -> None:
    v = verdict_of(
        [
            aw_obs(),
            failed_pod("p0", finished_at=T0 + 3 * MIN, node="node-b"),
            failed_pod("p1", finished_at=T0 + 2 * MIN, node="node-a"),
        ],
        T0 + 150 * SEC,
    )
    assert v.first_unhealthy_at == T0 + 2 * MIN
    assert v.deadline == T0 + 3 * MIN
    # A minute apart: the later failure followed the first, its node is not to blame.
    assert v.fault_kind == "Infrastructure"
    assert v.nodes == ("node-a",)


@pytest.mark.parametrize(
    ("annotation", "deadline", "warned"),
    [
        ("0s", T0 + 2 * MIN, False),
        ("10s", T0 + 2 * MIN + 10 * SEC, False),
        ("-1m", T0 + 2 * MIN, True),
        ("2d", T0 + 3 * MIN, True),
    ],
)
def test_failure_grace_annotation(annotation: str, deadline: datetime, warned: bool) -> None:
    obs = [
        aw_obs(annotations={FAILURE_GRACE_PERIOD_ANNOTATION: annotation}),
        failed_pod("p0", finished_at=T0 + 2 * MIN),
    ]
    v = verdict_of(obs, T0 + 2 * MIN)
    assert v.deadline == deadline
    assert v.state == ("Unhealthy" if deadline == T0 + 2 * MIN else "Healthy")
    if warned:
        assert len(v.warnings) == 1
        assert FAILURE_GRACE_PERIOD_ANNOTATION in v.warnings[0]
        assert repr(annotation) in v.warnings[0]
    else:
        assert v.warnings == ()


@pytest.mark.parametrize(
    ("annotations", "exit_code", "init", "terminal"),
    [
        ({}, 42, False, False),
        ({TERMINAL_EXIT_CODES_ANNOTATION: "42"}, 42, False, True),
        ({TERMINAL_EXIT_CODES_ANNOTATION: "42"}, 1, False, False),
        ({TERMINAL_EXIT_CODES_ANNOTATION: "3,abc,42"}, 42, False, True),
        ({RETRYABLE_EXIT_CODES_ANNOTATION: "1,2"}, 1, False, False),
        ({RETRYABLE_EXIT_CODES_ANNOTATION: "1,2"}, 3, False, True),
        ({TERMINAL_EXIT_CODES_ANNOTATION: "2", RETRYABLE_EXIT_CODES_ANNOTATION: "1,2"}, 2, False, True),
        # Upstream looks at app containers only.
        ({TERMINAL_EXIT_CODES_ANNOTATION: "42"}, 42, True, False),
    ],
)
def test_terminal_exit_codes(annotations: dict[str, str], exit_code: int, init: bool, terminal: bool) -> None:
    failed = pod(
        "p0",
        "Failed",
        containers=[
            container("setup", exit_code=exit_code if init else 0, finished_at=T0 + MIN, init=True),
            container("main", exit_code=1 if init else exit_code, finished_at=T0 + MIN),
        ],
    )
    v = verdict_of(
        [aw_obs(annotations={FAILURE_GRACE_PERIOD_ANNOTATION: "0s", **annotations}), failed], T0 + MIN
    )
    assert v.state == "Unhealthy"
    assert v.terminal is terminal
    assert (v.failure_class == "Permanent") is terminal
    assert ("; Permanent (" in v.message) is terminal


def test_failed_pods_with_unparseable_exit_code_annotation_warn() -> None:
    v = verdict_of(
        [aw_obs(annotations={TERMINAL_EXIT_CODES_ANNOTATION: "x"}), *running("p0", "p1")], T0 + MIN
    )
    assert v.state == "Healthy"
    assert any(TERMINAL_EXIT_CODES_ANNOTATION in w and "'x'" in w for w in v.warnings)


def test_more_failed_pods_on_the_same_node_do_not_republish() -> None:
    state = fold([aw_obs(), failed_pod("p0", finished_at=T0 + MIN), pod("p1")])
    first = evaluate(state, T0 + 90 * SEC)
    assert first.verdict is not None
    later = apply(first.state, failed_pod("p1", finished_at=T0 + 80 * SEC))
    assert evaluate(later, T0 + 100 * SEC).verdict is None


# ------------------------------------------------------------------- admission / warmup


def test_admission_grace_then_failure_grace_when_pods_are_missing() -> None:
    state = fold([aw_obs(), pod("p0", "Pending")])  # 1 of 2 expected pods exists
    before = evaluate(state, T0 + 59 * SEC)
    assert before.verdict is not None
    assert (before.verdict.state, before.verdict.reason) == ("Healthy", "")
    assert before.next_deadline == T0 + MIN

    detected = evaluate(before.state, T0 + MIN)
    assert detected.verdict is not None
    v = detected.verdict
    assert (v.state, v.reason) == ("Healthy", "InsufficientPodsReady")
    assert v.first_unhealthy_at == T0 + MIN
    assert v.deadline == T0 + 2 * MIN
    assert v.message.startswith("1 pods pending; 0 pods running; 0 pods succeeded")
    assert "admission grace period 1m0s" in v.message
    assert detected.next_deadline == T0 + 2 * MIN

    unhealthy = evaluate(detected.state, T0 + 2 * MIN)
    assert unhealthy.verdict is not None
    assert (unhealthy.verdict.state, unhealthy.verdict.reason) == ("Unhealthy", "InsufficientPodsReady")
    assert unhealthy.verdict.terminal is False


def test_warmup_grace_applies_once_all_pods_exist() -> None:
    state = fold([aw_obs(), pod("p0", "Pending"), pod("p1", "Running")])
    d = evaluate(state, T0 + 2 * MIN)
    assert d.verdict is not None and d.verdict.reason == ""
    assert d.next_deadline == T0 + 5 * MIN
    v = verdict_of([aw_obs(), pod("p0", "Pending"), pod("p1", "Running")], T0 + 6 * MIN)
    assert (v.state, v.reason, v.first_unhealthy_at) == ("Unhealthy", "InsufficientPodsReady", T0 + 5 * MIN)
    assert "warmup grace period 5m0s" in v.message


def test_grace_period_annotations_move_the_readiness_deadlines() -> None:
    annotations = {
        ADMISSION_GRACE_PERIOD_ANNOTATION: "10s",
        WARMUP_GRACE_PERIOD_ANNOTATION: "30s",
        FAILURE_GRACE_PERIOD_ANNOTATION: "5s",
    }
    missing = decide([aw_obs(annotations=annotations), pod("p0", "Pending")], T0)
    assert missing.next_deadline == T0 + 10 * SEC
    not_running = decide([aw_obs(annotations=annotations), pod("p0", "Pending"), pod("p1", "Pending")], T0)
    assert not_running.next_deadline == T0 + 30 * SEC
    v = verdict_of(
        [aw_obs(annotations=annotations), pod("p0", "Pending"), pod("p1", "Pending")], T0 + 35 * SEC
    )
    assert v.state == "Unhealthy"


def test_pods_becoming_ready_clear_a_readiness_suspicion() -> None:
    state = fold([aw_obs(), pod("p0", "Pending")])
    suspect = evaluate(state, T0 + 70 * SEC)
    assert suspect.verdict is not None and suspect.verdict.reason == "InsufficientPodsReady"
    ready = fold(running("p0", "p1"), suspect.state)
    cleared = evaluate(ready, T0 + 80 * SEC)
    assert cleared.verdict is not None
    assert (cleared.verdict.state, cleared.verdict.reason, cleared.verdict.seq) == ("Healthy", "", 2)
    assert cleared.next_deadline is None


def test_running_pods_being_deleted_do_not_count_as_ready() -> None:
    obs = [aw_obs(), pod("p0"), pod("p1", deletion_requested=True)]
    v = verdict_of(obs, T0 + 10 * MIN)
    assert (v.state, v.reason) == ("Unhealthy", "InsufficientPodsReady")


def test_unknown_expected_pod_count_skips_pod_count_rules_and_warns() -> None:
    v = verdict_of([aw_obs(replicas="two")], T0 + 30 * MIN)
    assert (v.state, v.reason) == ("Healthy", "")
    assert any("expected pod count" in w for w in v.warnings)


# ------------------------------------------------------------------------------ success


@pytest.mark.parametrize(
    ("pods", "state"),
    [
        ([pod("p0", "Succeeded"), pod("p1", "Succeeded")], "Succeeded"),
        ([pod("p0", "Succeeded"), pod("p1", "Succeeded"), pod("p2", "Succeeded")], "Succeeded"),
        ([pod("p0", "Succeeded"), pod("p1", "Running")], "Healthy"),
        ([pod("p0", "Succeeded"), pod("p1", "Pending")], "Healthy"),
        ([pod("p0", "Succeeded")], "Healthy"),
        ([pod("p0", "Succeeded"), pod("p1", "Succeeded"), failed_pod("p2", finished_at=T0)], "Unhealthy"),
    ],
)
def test_success_needs_all_expected_pods_succeeded_and_nothing_else(
    pods: list[PodObservation], state: str
) -> None:
    v = verdict_of([aw_obs(), *pods], T0 + MIN)
    assert v.state == state
    if state == "Succeeded":
        assert v.reason == "Succeeded"
        assert v.message == f"{len(pods)} pods succeeded and no running, pending, or failed pods"


# ---------------------------------------------------------------------------- autopilot


def test_running_pod_using_a_no_execute_resource_is_unhealthy_without_grace_or_retry() -> None:
    obs = [aw_obs(), *running("p0", "p1", resources=[GPU]), node_verdict(["node-1"], decided_at=T0 + MIN)]
    v = verdict_of(obs, T0 + MIN)
    assert (v.state, v.reason, v.counts_toward_retry, v.terminal) == (
        "Unhealthy",
        "AutopilotNoExecute",
        False,
        False,
    )
    assert v.nodes == ("node-1",)
    assert v.message == "Workload contains pods using NoExecute resources on Nodes: node-1"
    assert v.first_unhealthy_at == T0 + MIN


@pytest.mark.parametrize(
    "pods",
    [
        running("p0", "p1"),  # pods do not use the resource
        running("p0", "p1", resources=["example.com/fpga"]),
        running("p0", "p1", resources=[GPU], node="node-2"),
        [pod("p0", "Pending", resources=[GPU]), pod("p1", "Pending", resources=[GPU])],
        running("p0", "p1", resources=[GPU], deletion_requested=True),
    ],
    ids=["no-resource", "other-resource", "other-node", "pending", "terminating"],
)
def test_no_execute_concerns_only_running_pods_using_the_resource_on_that_node(
    pods: list[PodObservation],
) -> None:
    v = verdict_of([aw_obs(), *pods, node_verdict(["node-1"])], T0 + MIN)
    assert v.reason != "AutopilotNoExecute"


def test_a_late_older_node_verdict_does_not_override_a_newer_one() -> None:
    obs = [
        aw_obs(),
        *running("p0", "p1", resources=[GPU]),
        node_verdict([], decided_at=T0 + 2 * MIN),
        node_verdict(["node-1"], decided_at=T0 + MIN),
    ]
    assert verdict_of(obs, T0 + 3 * MIN).state == "Healthy"


def test_failed_pods_in_grace_take_precedence_over_no_execute_as_upstream() -> None:
    obs = [
        aw_obs(),
        pod("p0", resources=[GPU]),
        failed_pod("p1", finished_at=T0 + MIN),
        node_verdict(["node-1"]),
    ]
    v = verdict_of(obs, T0 + 90 * SEC)
    assert (v.state, v.reason) == ("Healthy", "FoundFailedPods")


# --------------------------------------------------------------------------- components


def test_failed_job_with_a_failed_pod_is_unhealthy_at_once_and_classified() -> None:
    obs = [
        aw_obs(annotations={TERMINAL_EXIT_CODES_ANNOTATION: "42"}),
        component(failed=True, status_message="BackoffLimitExceeded", observed_at=T0 + MIN),
        failed_pod("p0", finished_at=T0 + MIN, exit_code=42),
    ]
    v = verdict_of(obs, T0 + MIN)
    assert (v.state, v.reason, v.terminal) == ("Unhealthy", "FailedComponent", True)
    assert (v.failure_class, v.failure_code) == ("Permanent", "ExitCode:42")
    assert v.message.startswith("Found 1 failed components: Job/train-job (BackoffLimitExceeded)")
    assert v.first_unhealthy_at == T0 + MIN


def test_failed_job_without_a_failed_pod_in_sight_waits_for_one_then_is_unhealthy_unclassified() -> None:
    obs = [
        aw_obs(annotations={TERMINAL_EXIT_CODES_ANNOTATION: "42"}),
        component(failed=True, status_message="BackoffLimitExceeded", observed_at=T0 + MIN),
        *running("p0", "p1"),
    ]
    waiting = verdict_of(obs, T0 + MIN + SEC)
    assert (waiting.state, waiting.reason) == ("Healthy", "FailedComponent")
    assert waiting.deadline == T0 + MIN + FAILED_POD_SETTLE
    v = verdict_of(obs, T0 + MIN + FAILED_POD_SETTLE)
    assert (v.state, v.reason, v.terminal) == ("Unhealthy", "FailedComponent", False)
    assert (v.failure_class, v.failure_code) == ("", "")
    assert v.message.startswith("Found 1 failed components: Job/train-job (BackoffLimitExceeded)")
    assert v.first_unhealthy_at == T0 + MIN


def test_a_failed_pod_seen_after_its_failed_job_still_classifies_the_failure() -> None:
    """The Job's failure and its pod's come through different watches, in either order."""
    obs = [
        aw_obs(),
        component(failed=True, status_message="BackoffLimitExceeded", observed_at=T0 + MIN),
    ]
    assert verdict_of(obs, T0 + MIN).state == "Healthy"
    obs.append(failed_pod("p0", finished_at=T0 + MIN, exit_code=137))
    v = verdict_of(obs, T0 + MIN + SEC)
    assert (v.state, v.reason) == ("Unhealthy", "FailedComponent")
    assert (v.failure_class, v.failure_code) == ("Transient", "Signal:SIGKILL")


@pytest.mark.parametrize(
    "change",
    [
        {"deleted": True},
        {"deletion_requested": True},
    ],
    ids=["tombstone", "deletion-timestamp"],
)
def test_externally_deleted_component_is_terminal_at_once(change: dict[str, bool]) -> None:
    obs = [aw_obs(), *running("p0", "p1"), component(), component(observed_at=T0 + 2 * MIN, **change)]
    v = verdict_of(obs, T0 + 2 * MIN)
    assert (v.state, v.reason, v.terminal) == ("Unhealthy", "MissingComponent", True)
    assert v.message.startswith("Only found 0 deployed components, but was expecting 1")
    assert "Job/train-job" in v.message
    assert v.first_unhealthy_at == T0 + 2 * MIN


def test_missing_component_takes_precedence_over_everything_else() -> None:
    obs = [aw_obs(), failed_pod("p0", finished_at=T0), component(failed=True), component(deleted=True)]
    assert verdict_of(obs, T0 + MIN).reason == "MissingComponent"


@pytest.mark.parametrize(
    "obs",
    [
        # Deleted by the previous reset: created before this attempt was deployed.
        component(deleted=True, created_at=T0 - 5 * MIN),
        component(failed=True, created_at=T0 - 5 * MIN),
        # Not one of the AppWrapper's recorded components.
        component("other", deleted=True),
        # The tombstone of an earlier object with the same name does not remove the new one.
    ],
    ids=["previous-attempt-tombstone", "previous-attempt-failed", "unrecorded"],
)
def test_component_events_that_are_not_about_this_attempt_are_ignored(obs: ComponentObservation) -> None:
    assert verdict_of([aw_obs(), *running("p0", "p1"), obs], T0 + MIN).state == "Healthy"


def test_a_tombstone_for_an_older_component_uid_is_ignored() -> None:
    obs = [aw_obs(), *running("p0", "p1"), component(uid="new"), component(uid="old", deleted=True)]
    assert verdict_of(obs, T0 + MIN).state == "Healthy"


# ------------------------------------------------------------------------------ attempts


def test_pods_of_a_previous_attempt_do_not_count() -> None:
    old_failure = failed_pod("old", created_at=T0 - 10 * MIN, finished_at=T0 - 5 * MIN)
    v = verdict_of([aw_obs(), old_failure, *running("p0", "p1")], T0 + MIN)
    assert (v.state, v.reason) == ("Healthy", "")


def failed_without_grace() -> Decision:
    """The verdict on p1 failing at T0+1m with no failure grace period: Unhealthy at once."""
    state = fold(
        [
            aw_obs(annotations={FAILURE_GRACE_PERIOD_ANNOTATION: "0s"}),
            pod("p0"),
            failed_pod("p1", finished_at=T0 + MIN),
        ]
    )
    decided = evaluate(state, T0 + MIN)
    assert decided.verdict is not None and decided.verdict.state == "Unhealthy"
    return decided


def test_after_an_unhealthy_verdict_the_attempt_is_settled() -> None:
    decided = failed_without_grace()
    # Lifecycle starts the reset: components and pods go away, maybe seen before the phase change.
    state = fold(
        [component(deleted=True, observed_at=T0 + 2 * MIN), pod("p0", deleted=True), pod("p1", deleted=True)],
        decided.state,
    )
    assert evaluate(state, T0 + 2 * MIN).verdict is None
    state = apply(state, aw_obs(phase="Resetting", resetting_count=1))
    assert evaluate(state, T0 + 3 * MIN).verdict is None


def test_a_new_attempt_gets_a_new_verdict_and_the_old_failure_is_forgotten() -> None:
    first = failed_without_grace()
    redeployed = T0 + 5 * MIN
    state = fold(
        [
            aw_obs(
                phase="Running",
                resetting_count=1,
                deployed_at=redeployed,
                annotations={FAILURE_GRACE_PERIOD_ANNOTATION: "0s"},
            )
        ],
        first.state,
    )
    # The old failed pod's tombstone has not arrived yet; it still must not count.
    second = evaluate(state, redeployed + SEC)
    assert second.verdict is not None
    v = second.verdict
    assert (v.state, v.reason, v.resetting_count, v.seq) == ("Healthy", "", 1, 2)
    assert v.attempt_started_at == redeployed


def test_an_autopilot_reset_starts_a_new_attempt_with_the_same_count() -> None:
    obs = [aw_obs(), *running("p0", "p1", resources=[GPU]), node_verdict(["node-1"])]
    first = decide(obs, T0 + MIN)
    assert first.verdict is not None and first.verdict.reason == "AutopilotNoExecute"
    redeployed = T0 + 3 * MIN
    state = fold(
        [
            aw_obs(deployed_at=redeployed),
            pod("p0", deleted=True),
            pod("p1", deleted=True),
            *running("q0", "q1", resources=[GPU], node="node-2", created_at=redeployed + SEC),
        ],
        first.state,
    )
    second = evaluate(state, redeployed + MIN)
    assert second.verdict is not None
    assert (second.verdict.state, second.verdict.resetting_count) == ("Healthy", 0)
    assert second.msg_id != first.msg_id


# ---------------------------------------------------------------------------- deletion


def test_deleting_the_appwrapper_publishes_one_deleted_verdict() -> None:
    state = fold([aw_obs(), *running("p0", "p1")])
    healthy = evaluate(state, T0 + MIN)
    tombstone = AppWrapperObservation(
        ref=ObjectRef(namespace=NS, name=AW), deleted=True, observed_at=T0 + 2 * MIN
    )
    deleted = evaluate(apply(healthy.state, tombstone), T0 + 2 * MIN)
    assert deleted.verdict is not None
    v = deleted.verdict
    assert (v.state, v.reason, v.seq, v.ref.uid) == ("Deleted", REASON_APPWRAPPER_DELETED, 2, UID)
    assert deleted.next_deadline is None
    assert evaluate(deleted.state, T0 + 3 * MIN).verdict is None


def test_a_tombstone_of_an_appwrapper_never_seen_alive_says_nothing() -> None:
    tombstone = AppWrapperObservation(ref=ObjectRef(namespace=NS, name=AW), deleted=True, observed_at=T0)
    assert decide([tombstone], T0).verdict is None


def test_an_appwrapper_whose_deletion_was_published_is_gone() -> None:
    state = fold([aw_obs(), *running("p0", "p1")])
    healthy = evaluate(state, T0 + MIN)
    assert not gone(healthy.state)
    tombstone = AppWrapperObservation(
        ref=ObjectRef(namespace=NS, name=AW), deleted=True, observed_at=T0 + 2 * MIN
    )
    deleted = evaluate(apply(healthy.state, tombstone), T0 + 2 * MIN)
    assert not gone(apply(healthy.state, tombstone))  # its deletion is yet to be published
    assert gone(deleted.state)
    # Read back from the verdict stream by a replica that takes the partition: with the tombstone
    # still stored, or with nothing stored any more, or with only pods of that incarnation.
    assert deleted.verdict is not None
    seeded = remember_published(AppWrapperHealth(namespace=NS, name=AW), deleted.verdict)
    assert gone(seeded)
    assert gone(apply(seeded, tombstone))
    assert gone(fold(running("p0"), seeded))
    # A new AppWrapper of the same name is not.
    assert not gone(apply(seeded, aw_obs(uid="aw-uid-2")))


def test_nothing_known_is_gone_but_pods_without_their_appwrapper_are_kept() -> None:
    empty = AppWrapperHealth(namespace=NS, name=AW)
    assert gone(empty)
    assert gone(fold([pod("p0", "Running"), pod("p0", deleted=True)]))
    # Its AppWrapper's observation may come (published again after the stream discarded it).
    assert not gone(fold(running("p0")))
    assert not gone(fold([component()]))
    # A verdict read for it, not about its deletion: kept, so that seq goes on from it.
    healthy = evaluate(fold([aw_obs(), *running("p0", "p1")]), T0 + MIN).verdict
    assert healthy is not None
    assert not gone(remember_published(empty, healthy))


# ---------------------------------------------------------------- identity and restarts


def test_msg_id_is_deterministic_and_names_attempt_seq_state_and_reason() -> None:
    obs = [aw_obs(), *running("p0", "p1")]
    a, b = decide(obs, T0 + MIN), decide(obs, T0 + 2 * MIN)
    assert a.msg_id is not None
    assert a.msg_id == b.msg_id
    assert a.verdict is not None
    assert a.msg_id == verdict_msg_id(a.verdict)
    assert a.msg_id == f"{UID}:0:{T0.isoformat()}:1:Healthy:-"


def test_a_restarted_instance_seeded_with_the_last_verdict_does_not_repeat_it() -> None:
    obs = [aw_obs(), pod("p0"), failed_pod("p1", finished_at=T0 + MIN)]
    published = verdict_of(obs, T0 + 70 * SEC)
    restarted = remember_published(fold(obs), published)
    assert evaluate(restarted, T0 + 80 * SEC).verdict is None
    nxt = evaluate(restarted, T0 + 2 * MIN)
    assert nxt.verdict is not None
    assert (nxt.verdict.state, nxt.verdict.seq) == ("Unhealthy", published.seq + 1)


def test_an_older_verdict_does_not_replace_a_newer_one() -> None:
    newer = Verdict(ref=ObjectRef(namespace=NS, name=AW, uid=UID), state="Healthy", decided_at=T0, seq=5)
    older = replace_verdict(newer, seq=4)
    state = remember_published(remember_published(fold([]), newer), older)
    assert state.last_verdict == newer


def replace_verdict(v: Verdict, **changes: Any) -> Verdict:
    return v.model_copy(update=changes)


def test_observations_of_other_appwrappers_are_ignored() -> None:
    state = fold([aw_obs(), *running("p0", "p1")])
    after = fold([failed_pod("x", appwrapper="other", finished_at=T0)], state)
    assert after == state


def test_a_pod_tombstone_for_an_older_uid_keeps_the_current_pod() -> None:
    state = fold([aw_obs(), pod("p0", uid="new"), pod("p1"), pod("p0", uid="old", deleted=True)])
    assert set(state.pods) == {"p0", "p1"}
    assert state.pods["p0"].uid == "new"


def test_naive_timestamps_are_taken_as_utc() -> None:
    naive = T0.replace(tzinfo=None)
    state = fold([aw_obs(), pod("p0"), failed_pod("p1", finished_at=naive + MIN)])
    decision = evaluate(state, naive + 90 * SEC)
    assert decision.next_deadline == T0 + 2 * MIN


def test_the_state_is_not_mutated_by_evaluate() -> None:
    state = fold([aw_obs(), *running("p0", "p1")])
    snapshot = replace(state)
    evaluate(state, T0 + MIN)
    assert state == snapshot
    assert state.last_verdict is None


@pytest.mark.parametrize(
    ("before", "after", "pods", "affected"),
    [
        (None, ["node-1"], running("p0", resources=[GPU]), True),  # its node entered NoExecute
        (["node-1"], [], running("p0", resources=[GPU]), True),  # and left it
        (None, ["node-2"], running("p0", resources=[GPU]), False),  # another node
        (["node-1"], ["node-1", "node-2"], running("p0", resources=[GPU]), False),  # its node unchanged
        (None, ["node-1"], running("p0"), False),  # its pods do not use the resource
        (["node-1"], ["node-1"], running("p0", resources=[GPU]), False),  # nothing changed
        (None, ["node-1"], [pod("p0", "Pending", resources=[GPU])], True),  # may run there next
    ],
)
def test_a_node_verdict_affects_only_appwrappers_with_pods_on_nodes_whose_state_changed(
    before: list[str] | None, after: list[str], pods: list[PodObservation], affected: bool
) -> None:
    """The service judges only these again; every other AppWrapper's verdict cannot change."""
    previous = None if before is None else node_verdict(before, decided_at=T0)
    current = node_verdict(after, decided_at=T0 + MIN)
    state = fold([aw_obs(), *pods, *([previous] if previous else [])])
    assert touched_by(state, node_changes(previous, current), current) is affected
    if not affected:
        # The claim behind skipping them: judging them again would reach the same verdict
        # (for one already unhealthy there, only the time of the newer node decision differs).
        def judged(observations: list[Observation]) -> tuple[object, ...]:
            v = verdict_of(observations, T0 + 2 * MIN)
            return v.state, v.reason, v.nodes, v.counts_toward_retry, v.terminal

        known: list[Observation] = [aw_obs(), *pods, *([previous] if previous else [])]
        assert judged(known) == judged([*known, current])


# ------------------------------------------------------------------- failure classes


def _classified(*observations: Observation, settings: FailureSettings | None = None) -> Verdict:
    state = AppWrapperHealth(
        namespace=NS, name=AW, defaults=FaultTolerance(), failures=settings or FailureSettings()
    )
    return (
        verdict_of(list(observations), T0 + 10 * MIN)
        if settings is None
        else _verdict(fold(observations, state))
    )


def _verdict(state: AppWrapperHealth) -> Verdict:
    decision = evaluate(state, T0 + 10 * MIN)
    assert decision.verdict is not None
    return decision.verdict


def evicted_pod(name: str, *, node: str = "node-1", at: datetime = T0 + 2 * MIN) -> PodObservation:
    return pod(name, "Failed", node=node, containers=[container(exit_code=143, finished_at=at)]).model_copy(
        update={
            "conditions": (
                PodConditionState(type="DisruptionTarget", status="True", reason="EvictionByEvictionAPI"),
            )
        },
    )


def test_an_evicted_pod_is_transient_and_its_node_is_blamed() -> None:
    v = _classified(aw_obs(), evicted_pod("p0"), pod("p1"))
    assert v.state == "Unhealthy"
    assert (v.failure_class, v.failure_code, v.fault_kind) == ("Transient", "Evicted", "Infrastructure")
    assert v.terminal is False
    assert v.nodes == ("node-1",)
    assert "; Transient (Evicted): pod p0 failed with Evicted: Transient by failure table row 7" in v.message


def test_an_oom_killed_pod_follows_the_default_table() -> None:
    oom = pod(
        "p0",
        "Failed",
        containers=[
            ContainerState(name="main", state="terminated", exit_code=137, reason="OOMKilled", finished_at=T0)
        ],
    )
    v = _classified(aw_obs(), oom, pod("p1"))
    assert (v.failure_class, v.failure_code) == ("Unknown", "OOMKilled")
    assert v.terminal is False


def test_a_workload_pattern_makes_an_exit_code_permanent() -> None:
    patterns = '[{"exitCodes": [3], "class": "Permanent", "code": "BadInput"}]'
    v = _classified(
        aw_obs(annotations={FAILURE_PATTERNS_ANNOTATION: patterns}), failed_pod("p0", exit_code=3)
    )
    assert (v.failure_class, v.failure_code) == ("Permanent", "BadInput")
    assert v.terminal is True
    assert "by workload failure pattern 0" in v.message


def test_a_refused_pattern_annotation_is_a_warning_and_the_table_applies() -> None:
    patterns = '[{"exitCodes": [3], "class": "Fatal"}]'
    v = _classified(
        aw_obs(annotations={FAILURE_PATTERNS_ANNOTATION: patterns}), failed_pod("p0", exit_code=3)
    )
    assert (v.failure_class, v.failure_code) == ("Unknown", "ExitCode:3")
    assert any(w.startswith(f"{FAILURE_PATTERNS_ANNOTATION} refused: [0].class") for w in v.warnings)


def test_the_operators_table_comes_from_the_settings() -> None:
    table = (FailurePattern.model_validate({"exitCodes": [1], "class": "Transient", "code": "Flaky"}),)
    v = _classified(aw_obs(), failed_pod("p0"), pod("p1"), settings=FailureSettings(table=table))
    assert (v.failure_class, v.failure_code) == ("Transient", "Flaky")


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ((1, 143), ("Unknown", "ExitCode:1")),  # one Unknown: the attempt is Unknown
        ((143, 143), ("Transient", "Signal:SIGTERM")),  # every pod Transient
        ((143, 127), ("Permanent", "ExitCode:127")),  # any Permanent decides
    ],
)
def test_the_attempts_class_combines_its_pods(codes: tuple[int, int], expected: tuple[str, str]) -> None:
    v = _classified(
        aw_obs(),
        failed_pod("p0", exit_code=codes[0], finished_at=T0 + MIN),
        failed_pod("p1", exit_code=codes[1], finished_at=T0 + MIN),
    )
    assert (v.failure_class, v.failure_code) == expected
    assert v.terminal is (expected[0] == "Permanent")


def test_every_pod_failing_alike_at_once_is_an_application_fault_that_blames_no_node() -> None:
    v = _classified(
        aw_obs(),
        failed_pod("p0", exit_code=1, finished_at=T0 + MIN, node="node-a"),
        failed_pod("p1", exit_code=1, finished_at=T0 + MIN + SEC, node="node-b"),
    )
    assert (v.fault_kind, v.nodes) == ("Application", ())


def test_a_failed_component_carries_the_class_of_its_failed_pods() -> None:
    v = _classified(aw_obs(), component(failed=True), evicted_pod("p0"))
    assert v.reason == "FailedComponent"
    assert (v.failure_class, v.failure_code, v.fault_kind) == ("Transient", "Evicted", "Infrastructure")


def test_a_failed_component_without_failed_pods_has_no_class() -> None:
    v = _classified(aw_obs(), component(failed=True))
    assert (v.failure_class, v.failure_code, v.fault_kind, v.terminal) == ("", "", "", False)


def test_failure_facts_come_from_the_pod_observation() -> None:
    obs = pod(
        "p0",
        "Failed",
        node="node-7",
        containers=[
            ContainerState(name="main", state="terminated", exit_code=1, reason="Error", message="boom"),
            ContainerState(name="pull", state="waiting", reason="ErrImagePull", message="no such image"),
            ContainerState(name="setup", init=True, state="terminated", exit_code=0, reason="Completed"),
        ],
    ).model_copy(
        update={
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "conditions": (
                PodConditionState(type="DisruptionTarget", status="True", reason="TerminationByKubelet"),
            ),
        }
    )
    facts = failure_facts(obs, T0)
    assert (facts.pod, facts.node, facts.phase, facts.reason, facts.failed_at) == (
        "p0",
        "node-7",
        "Failed",
        "Evicted",
        T0,
    )
    assert [(c.name, c.init, c.exit_code, c.reason, c.message) for c in facts.containers] == [
        ("setup", True, 0, "Completed", ""),
        ("main", False, 1, "Error", "boom"),
        ("pull", False, None, "ErrImagePull", "no such image"),
    ]
    assert [(c.type, c.reason) for c in facts.true_conditions()] == [
        ("DisruptionTarget", "TerminationByKubelet")
    ]
    # Kept for failed pods only.
    state = fold([aw_obs(), obs, pod("p1")])
    assert state.pods["p0"].facts is not None and state.pods["p1"].facts is None
