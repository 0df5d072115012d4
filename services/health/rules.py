"""The health rules: pure ``evaluate(state, now) -> Decision``.

Semantics follow upstream AppWrapper's Running-phase checks, in upstream's order (the first
that applies decides):

1. ``MissingComponent``: a wrapped resource of this attempt was deleted (tombstone) or is being
   deleted. Unhealthy at once, ``terminal`` (upstream fails the AppWrapper without a retry).
2. ``FailedComponent``: a wrapped batch/v1 Job or PyTorchJob reports Failed. Unhealthy at once
   when a failed pod of the attempt is known, and its failed pods are classified as for
   ``FoundFailedPods`` (below); otherwise Unhealthy FAILED_POD_SETTLE (2 s) after the component
   was seen Failed, unclassified, unless a failed pod is observed meanwhile (the pod's failure
   and the Job's come through different watches, in either order).
3. Success: at least the expected number of pods Succeeded and none pending, running or failed.
   With a completion policy (``respawn.dev/completion-policy``): a failed pod counts only once
   its pod set has ``minFailed`` failed pods (tolerated ones count as completed), and the
   workload succeeds as soon as a pod set has ``minSucceeded`` succeeded pods.
4. ``FoundFailedPods``: Unhealthy once FailureGracePeriod has passed since the earliest failure
   of a pod of this attempt. Every failed pod of the attempt is classified
   (:func:`shared.failures.classify.classify`: the upstream exit-code annotations, the
   workload's patterns, the operator's table) and the attempt gets one class and code
   (:func:`classify_attempt`); ``terminal`` when it is ``Permanent`` (a terminal exit code makes
   it so). A pod's node state is the one autopilot's node-state verdict gives when the rules
   run (:func:`services.health.state.node_state_of`). The fault is the application's or the
   infrastructure's (:func:`shared.failures.blame.attribute`), and ``nodes`` names the nodes
   blamed.
5. ``AutopilotNoExecute``: a Running pod uses a resource that Autopilot marks NoExecute on its
   node. Unhealthy at once, ``counts_toward_retry=False``, the nodes listed.
6. ``RestartStorm`` (Respawn's own): a container of a pod of this attempt restarted at least K
   times within W (``respawn.dev/restart-storm``, default ``health.restartStormRestarts`` /
   ``health.restartStormWindow``): Unhealthy at once, as the kubelet's restarts were the chances
   a grace period would give; or a container has been waiting in CrashLoopBackOff (at one
   restart count) for FailureGracePeriod (``health.crashLoopBackOff``). The pod phase may well
   stay Running (``restartPolicy: OnFailure``), so this comes before the readiness check, whose
   verdict would be less precise and later (except that a back-off wait still inside its grace
   period does not hold back a readiness verdict already due). Failure class ``Unknown``, code
   ``RestartStorm`` or ``CrashLoopBackOff``.
7. ``InsufficientPodsReady``: not all expected pods exist (Pending or later) by
   AdmissionGracePeriod, or not all are Running/Succeeded by WarmupGracePeriod, both measured
   from the attempt's deployment (ResourcesDeployed's transition time), and still so once a
   further FailureGracePeriod has passed. Upstream's code resets right at the admission/warmup
   deadline; the fault-tolerance specification says the pod-level conditions get the
   FailureGracePeriod too, and Respawn follows the specification (see docs/verdicts.md).
8. ``Stalled`` (Respawn's own, opt-in by ``respawn.dev/heartbeat-timeout``): every expected pod
   is Running and no ``respawn.dev/heartbeat`` (on the AppWrapper or a pod of this attempt) is
   newer than the timeout, counted from the newest heartbeat or, if later, from when the last pod
   became Running. Last because it only means something once the workload is up. A heartbeat is
   never taken as later than when it was first seen, so a clock far ahead cannot keep a workload
   alive. Unhealthy with no further grace (the timeout is the grace); class ``Unknown``, code
   ``Stalled``.

While a condition is inside its grace period the verdict is Healthy but names the condition
(``reason``), when it was first seen and its ``deadline``. Nothing is judged unless the
AppWrapper is Running, not suspended, not being deleted and managed by this controller.

Publication: a verdict is emitted only when its significant content (everything but the
human-readable message and the decision time) differs from the last one published, and once
an attempt has an Unhealthy or Succeeded verdict nothing more is emitted for that attempt: the
decision is made, and late observations of the reset that follows (components and pods being
deleted) must not produce a second, different one. ``seq`` counts verdicts per AppWrapper uid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from services.health.state import (
    AppWrapperHealth,
    ComponentRecord,
    ContainerRestarts,
    FailureSettings,
    PodRecord,
    node_state_of,
    remember_published,
)
from services.health.view import AppWrapperView
from shared.appwrapper.constants import Phase, Reason
from shared.appwrapper.control import CompletionPolicy
from shared.durations import format_go_duration
from shared.failures.blame import PodFailure, attribute
from shared.failures.classify import Classification, classify
from shared.failures.facts import FailureFacts
from shared.failures.patterns import FailureClass
from shared.kubetime import as_utc
from shared.messages import NodeVerdict, Verdict, VerdictState
from shared.stalls import parse_heartbeat

__all__ = [
    "CODE_CRASH_LOOP_BACK_OFF",
    "CODE_RESTART_STORM",
    "CODE_STALLED",
    "REASON_APPWRAPPER_DELETED",
    "REASON_RESTART_STORM",
    "REASON_STALLED",
    "REASON_SUCCEEDED",
    "AttemptFailure",
    "Decision",
    "Finding",
    "assess",
    "classify_attempt",
    "evaluate",
    "verdict_msg_id",
]

# Reasons shared with upstream's Unhealthy condition come from shared.appwrapper.constants.Reason
# (MissingComponent, FailedComponent, FoundFailedPods, AutopilotNoExecute, InsufficientPodsReady).
REASON_SUCCEEDED: Final = str(Reason.SUCCEEDED)
# Respawn's own: upstream has no condition for it because the object is simply gone.
REASON_APPWRAPPER_DELETED: Final = "AppWrapperDeleted"
# Respawn's own: a container crash-loops while its pod stays Running, or the workload stopped
# refreshing its progress heartbeat (docs/failures.md). Both are failures of class Unknown.
REASON_RESTART_STORM: Final = "RestartStorm"
REASON_STALLED: Final = "Stalled"
CODE_RESTART_STORM: Final = "RestartStorm"
CODE_CRASH_LOOP_BACK_OFF: Final = "CrashLoopBackOff"
CODE_STALLED: Final = "Stalled"
CLASS_UNKNOWN: Final = "Unknown"

_NAMES_SHOWN: Final = 5
# How long a failed component without a failed pod in sight waits for one (see _failed_component).
FAILED_POD_SETTLE: Final = timedelta(seconds=2)


@dataclass(frozen=True, slots=True)
class Finding:
    """What the rules conclude about the current attempt at one instant."""

    state: VerdictState
    reason: str = ""
    message: str = ""
    terminal: bool = False
    counts_toward_retry: bool = True
    nodes: tuple[str, ...] = ()
    first_unhealthy_at: datetime | None = None
    deadline: datetime | None = None
    # The earliest later time at which this finding changes with no new input, if any.
    next_check: datetime | None = None
    # The attempt's failure class and code, and whose fault it is (docs/failures.md); "" when
    # the finding is not about failed pods.
    failure_class: str = ""
    failure_code: str = ""
    fault_kind: str = ""


@dataclass(frozen=True, slots=True)
class AttemptFailure:
    """The failed pods of one attempt, judged together."""

    failure_class: FailureClass
    code: str
    # The pod whose class and code the attempt's are, and why it has them.
    pod: str
    classification: Classification
    fault_kind: str
    # The nodes blamed (none for an application fault).
    nodes: tuple[str, ...]

    def describe(self) -> str:
        return self.classification.describe(self.pod)


def _facts(pod: PodRecord, node_states: NodeVerdict | None, settings: FailureSettings) -> FailureFacts:
    facts = (
        pod.facts
        if pod.facts is not None
        else FailureFacts(pod=pod.name, node=pod.node_name, failed_at=pod.failed_at)
    )
    # The node's state is not in the pod's observation: it is autopilot's, as held now.
    state = node_state_of(node_states, facts.node, facts.failed_at, settings.node_lost_leeway)
    return dataclasses.replace(facts, node_state=state) if state else facts


def classify_attempt(
    aw: AppWrapperView,
    failed: Iterable[PodRecord],
    settings: FailureSettings,
    pods: int,
    node_states: NodeVerdict | None = None,
) -> AttemptFailure | None:
    """Classify every failed pod of the attempt and combine: Permanent if any pod's is,
    Transient if every pod's is, else Unknown; the code is that of the pod that decides (the
    first by name of the deciding class). ``pods``: how many pods the attempt has;
    ``node_states``: autopilot's lost nodes, for each pod's node state."""
    judged = [
        (
            pod,
            classify(
                _facts(pod, node_states, settings),
                exit_codes=aw.exit_codes,
                workload=aw.failure_patterns,
                table=settings.table,
            ),
        )
        for pod in sorted(failed, key=lambda p: p.name)
    ]
    if not judged:
        return None
    classes = {c.failure_class for _, c in judged}
    if FailureClass.PERMANENT in classes:
        deciding = FailureClass.PERMANENT
    elif classes == {FailureClass.TRANSIENT}:
        deciding = FailureClass.TRANSIENT
    else:
        deciding = FailureClass.UNKNOWN
    pod, found = next((p, c) for p, c in judged if c.failure_class is deciding)
    blame = attribute(
        [
            PodFailure(
                pod=p.name,
                node=p.node_name,
                code=c.code,
                failure_class=c.failure_class,
                failed_at=p.failed_at,
            )
            for p, c in judged
        ],
        pods=max(pods, len(judged)),
        window=settings.application_fault_window,
    )
    return AttemptFailure(
        failure_class=deciding,
        code=found.code,
        pod=pod.name,
        classification=found,
        fault_kind=str(blame.kind),
        nodes=blame.nodes,
    )


@dataclass(frozen=True, slots=True)
class Decision:
    # The state to keep once ``verdict`` (if any) has been published; a caller whose publish
    # fails keeps the old state and evaluates again, getting the same verdict.
    state: AppWrapperHealth
    verdict: Verdict | None
    # When to evaluate again if nothing arrives before then.
    next_deadline: datetime | None

    @property
    def msg_id(self) -> str | None:
        return verdict_msg_id(self.verdict) if self.verdict is not None else None


def verdict_msg_id(verdict: Verdict) -> str:
    """Deterministic identity of a verdict, for ``Nats-Msg-Id``.

    Two instances that reach the same decision from the same history produce the same id, so
    JetStream's de-duplication keeps one copy. The attempt is part of it because an Autopilot
    reset starts a new attempt without changing ``resetting_count``.
    """
    who = verdict.ref.uid or f"{verdict.ref.namespace}/{verdict.ref.name}"
    attempt = verdict.attempt_started_at.astimezone(UTC).isoformat() if verdict.attempt_started_at else "-"
    return f"{who}:{verdict.resetting_count}:{attempt}:{verdict.seq}:{verdict.state}:{verdict.reason or '-'}"


def _names(items: Iterable[str]) -> str:
    ordered = sorted(items)
    shown = ", ".join(ordered[:_NAMES_SHOWN])
    hidden = len(ordered) - _NAMES_SHOWN
    return f"{shown} and {hidden} more" if hidden > 0 else shown


def _kube_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _in_attempt(created_at: datetime | None, observed_at: datetime, start: datetime | None) -> bool:
    """Whether an object belongs to the attempt that started (was deployed) at ``start``.

    A reset deletes every pod and component and only then does lifecycle mark the resources
    deployed again (ResourcesDeployed's transition time, ``start``); the new attempt's objects
    are created after that, by the API server's clock, as is ``start``. So an object created
    before ``start`` is left over from an earlier attempt: its late or replayed observation must
    not count (a Failed pod of attempt 1 must not fail attempt 2). Both times have one-second
    resolution, so an object created in the same second as ``start`` counts as current; an old
    object cannot be that recent because it was gone before ``start`` was written. Without a
    creation time, the observation time stands in.
    """
    if start is None:
        return True
    return (created_at if created_at is not None else observed_at) >= start


@dataclass(frozen=True, slots=True)
class _Pods:
    pending: int
    running: tuple[PodRecord, ...]
    succeeded: int
    failed: tuple[PodRecord, ...]


def _count_pods(state: AppWrapperHealth, start: datetime | None) -> _Pods:
    pending = succeeded = 0
    running: list[PodRecord] = []
    failed: list[PodRecord] = []
    pods: Iterable[PodRecord] = state.pods.values()
    if state.departed:
        # Failed pods already deleted count as failed until judged once (AppWrapperHealth.departed).
        held = {pod.uid for pod in state.pods.values()}
        pods = (*pods, *(pod for pod in state.departed.values() if pod.uid not in held))
    for pod in pods:
        if not _in_attempt(pod.created_at, pod.observed_at, start):
            continue
        if pod.phase == "Pending":
            pending += 1  # even while being deleted, as upstream
        elif pod.phase == "Running":
            if not pod.deletion_requested:  # a terminating pod is not doing useful work
                running.append(pod)
        elif pod.phase == "Succeeded":
            succeeded += 1
        elif pod.phase == "Failed":
            failed.append(pod)
        # Unknown (node lost contact) is not counted, as upstream.
    return _Pods(pending, tuple(running), succeeded, tuple(failed))


def _components(state: AppWrapperHealth, aw: AppWrapperView) -> list[ComponentRecord]:
    return [
        record
        for key, record in state.components.items()
        # Only resources the AppWrapper recorded as its own; if it recorded none yet, any
        # resource labelled for it.
        if (not aw.components or key in aw.components)
        and _in_attempt(record.created_at, record.observed_at, aw.attempt_started_at)
    ]


def _missing_component(aw: AppWrapperView, missing: list[ComponentRecord]) -> Finding:
    gone = _names(f"{c.kind}/{c.name}" for c in missing if c.deleted)
    going = _names(f"{c.kind}/{c.name}" for c in missing if not c.deleted)
    details = "; ".join(
        part for part in (gone and f"deleted: {gone}", going and f"being deleted: {going}") if part
    )
    if aw.components:
        expected = len(aw.components)
        message = f"Only found {expected - len(missing)} deployed components, but was expecting {expected}"
        message += f" ({details})"
    else:
        message = f"Wrapped resources removed externally ({details})"
    return Finding(
        state="Unhealthy",
        reason=str(Reason.MISSING_COMPONENT),
        message=message,
        terminal=True,
        first_unhealthy_at=min(c.observed_at for c in missing),
    )


def _attempt_pods(aw: AppWrapperView, pods: _Pods) -> int:
    if aw.expected_pods is not None:
        return aw.expected_pods
    return pods.pending + len(pods.running) + pods.succeeded + len(pods.failed)


def _failed_component(
    state: AppWrapperHealth, aw: AppWrapperView, failed: list[ComponentRecord], pods: _Pods, now: datetime
) -> Finding:
    settings = state.failures
    judged = classify_attempt(aw, pods.failed, settings, _attempt_pods(aw, pods), state.node_states)
    details = _names(
        f"{c.kind}/{c.name}" + (f" ({c.status_message})" if c.status_message else "") for c in failed
    )
    message = f"Found {len(failed)} failed components: {details}"
    first = min(c.failed_at or c.observed_at for c in failed)
    if judged is not None:
        message += f"; {judged.failure_class} ({judged.code}): {judged.describe()}"
    elif now < first + FAILED_POD_SETTLE:
        # A Job fails because its pod did, but the two come through different watches: the
        # Job's failure may be seen first. Deciding then would leave the failure unclassified
        # (an eviction counted as a retry, a terminal exit code not seen), so wait a moment for
        # the failed pods; a component that fails with no pod failing waits this long too.
        settled = first + FAILED_POD_SETTLE
        return Finding(
            state="Healthy",
            reason=str(Reason.FAILED_COMPONENT),
            message=f"{message}; waiting until {_kube_time(settled)} for its failed pods to be observed",
            first_unhealthy_at=first,
            deadline=settled,
            next_check=settled,
        )
    return Finding(
        state="Unhealthy",
        reason=str(Reason.FAILED_COMPONENT),
        message=message,
        # Upstream's terminal exit codes make a pod's class Permanent (docs/failures.md).
        terminal=judged is not None and judged.failure_class is FailureClass.PERMANENT,
        nodes=judged.nodes if judged is not None else (),
        first_unhealthy_at=first,
        failure_class=str(judged.failure_class) if judged is not None else "",
        failure_code=judged.code if judged is not None else "",
        fault_kind=judged.fault_kind if judged is not None else "",
    )


def _failed_pods(state: AppWrapperHealth, aw: AppWrapperView, pods: _Pods, now: datetime) -> Finding:
    grace = aw.params.ft.failure_grace
    first = min(p.failed_at or p.observed_at for p in pods.failed)
    deadline = first + grace
    judged = classify_attempt(aw, pods.failed, state.failures, _attempt_pods(aw, pods), state.node_states)
    if judged is None:  # pragma: no cover - only called with failed pods
        return Finding(state="Healthy")
    message = f"{len(pods.failed)} failed pods: {_names(p.name for p in pods.failed)}"
    message += f"; {judged.failure_class} ({judged.code}): {judged.describe()}"
    unhealthy = now >= deadline
    if not unhealthy:
        message += f"; failure grace period {format_go_duration(grace)} ends at {_kube_time(deadline)}"
    return Finding(
        state="Unhealthy" if unhealthy else "Healthy",
        reason=str(Reason.FOUND_FAILED_PODS),
        message=message,
        terminal=judged.failure_class is FailureClass.PERMANENT,
        nodes=judged.nodes,
        first_unhealthy_at=first,
        deadline=deadline,
        next_check=None if unhealthy else deadline,
        failure_class=str(judged.failure_class),
        failure_code=judged.code,
        fault_kind=judged.fault_kind,
    )


def _no_execute(state: AppWrapperHealth, pods: _Pods) -> Finding | None:
    nodes: set[str] = set()
    resources: set[str] = set()
    for pod in pods.running:
        for resource in pod.resources:
            if pod.node_name and pod.node_name in state.no_execute_nodes(resource):
                nodes.add(pod.node_name)
                resources.add(resource)
    if not nodes:
        return None
    ordered = tuple(sorted(nodes))
    return Finding(
        state="Unhealthy",
        reason=str(Reason.AUTOPILOT_NO_EXECUTE),
        message=f"Workload contains pods using NoExecute resources on Nodes: {', '.join(ordered)}",
        counts_toward_retry=False,
        nodes=ordered,
        first_unhealthy_at=max(as_utc(state.node_verdicts[r].decided_at) for r in resources),
    )


def _readiness(aw: AppWrapperView, pods: _Pods, now: datetime) -> Finding:
    expected, start = aw.expected_pods, aw.attempt_started_at
    running = len(pods.running)
    if expected is None or start is None or running + pods.succeeded >= expected:
        return Finding(state="Healthy")
    ft = aw.params.ft
    all_exist = pods.pending + running + pods.succeeded >= expected
    grace, which = (ft.warmup_grace, "warmup") if all_exist else (ft.admission_grace, "admission")
    detected = start + grace
    if now < detected:
        return Finding(state="Healthy", next_check=detected)
    deadline = detected + ft.failure_grace
    unhealthy = now >= deadline
    message = (
        f"{pods.pending} pods pending; {running} pods running; {pods.succeeded} pods succeeded; "
        f"expected {expected} by the end of the {which} grace period {format_go_duration(grace)}"
    )
    if not unhealthy:
        message += (
            f"; failure grace period {format_go_duration(ft.failure_grace)} ends at {_kube_time(deadline)}"
        )
    return Finding(
        state="Unhealthy" if unhealthy else "Healthy",
        reason=str(Reason.INSUFFICIENT_PODS_READY),
        message=message,
        first_unhealthy_at=detected,
        deadline=deadline,
        next_check=None if unhealthy else deadline,
    )


def _running_or_starting(state: AppWrapperHealth, start: datetime | None) -> list[PodRecord]:
    return [
        pod
        for pod in state.pods.values()
        if pod.phase in ("Pending", "Running")
        and not pod.deletion_requested
        and _in_attempt(pod.created_at, pod.observed_at, start)
    ]


def _who(pod: PodRecord, c: ContainerRestarts) -> str:
    return f"{'init container' if c.init else 'container'} {c.name} of pod {pod.name}"


def _restart_storm(state: AppWrapperHealth, aw: AppWrapperView, now: datetime) -> Finding | None:
    policy = aw.stalls
    pods = sorted(_running_or_starting(state, aw.attempt_started_at), key=lambda p: p.name)
    storms = [(pod, c) for pod in pods for c in pod.restarts if c.storm is not None]
    if storms and policy.counts_restarts:
        storms.sort(key=lambda pc: (pc[1].storm.at if pc[1].storm else now, pc[0].name))
        pod, c = storms[0]
        storm = c.storm
        assert storm is not None
        message = (
            f"{_who(pod, c)} restarted {storm.rise} times within {format_go_duration(storm.window)} "
            f"(between {_kube_time(storm.since)} and {_kube_time(storm.at)}; at most "
            f"{policy.storm_restarts - 1} allowed)"
        )
        if len(storms) > 1:
            in_pods = _names({p.name for p, _ in storms})
            message += f"; {len(storms)} containers in a restart storm, in pods {in_pods}"
        return Finding(
            state="Unhealthy",
            reason=REASON_RESTART_STORM,
            message=message,
            first_unhealthy_at=storm.at,
            failure_class=CLASS_UNKNOWN,
            failure_code=CODE_RESTART_STORM,
        )
    if not policy.crash_loop_backoff:
        return None
    looping = [(pod, c) for pod in pods for c in pod.restarts if c.crash_loop_since is not None]
    if not looping:
        return None
    looping.sort(key=lambda pc: (pc[1].crash_loop_since or now, pc[0].name))
    pod, c = looping[0]
    since = c.crash_loop_since
    assert since is not None
    grace = aw.params.ft.failure_grace
    deadline = since + grace
    unhealthy = now >= deadline
    message = (
        f"{_who(pod, c)} is waiting in CrashLoopBackOff after {c.restart_count} restarts, "
        f"since {_kube_time(since)}"
    )
    if len(looping) > 1:
        message += (
            f"; {len(looping)} containers in CrashLoopBackOff, in pods {_names({p.name for p, _ in looping})}"
        )
    if not unhealthy:
        message += f"; failure grace period {format_go_duration(grace)} ends at {_kube_time(deadline)}"
    return Finding(
        state="Unhealthy" if unhealthy else "Healthy",
        reason=REASON_RESTART_STORM,
        message=message,
        first_unhealthy_at=since,
        deadline=deadline,
        next_check=None if unhealthy else deadline,
        failure_class=CLASS_UNKNOWN,
        failure_code=CODE_CRASH_LOOP_BACK_OFF,
    )


def _heartbeat_at(value: str, seen_at: datetime | None) -> datetime | None:
    """When a heartbeat was written: its value, but never later than when it was first seen (a
    clock far ahead, or a value set in the future, must not keep a stalled workload alive)."""
    written = parse_heartbeat(value) if value else None
    if written is None or seen_at is None:
        return None
    return min(written, as_utc(seen_at))


def _stalled(state: AppWrapperHealth, aw: AppWrapperView, pods: _Pods, now: datetime) -> Finding | None:
    timeout = aw.stalls.heartbeat_timeout
    if timeout is None or aw.expected_pods is None or aw.attempt_started_at is None:
        return None
    if not pods.running or len(pods.running) + pods.succeeded < aw.expected_pods:
        return None  # not up (the readiness check's business): the heartbeat clock has not started
    started = [p.running_since for p in pods.running if p.running_since is not None]
    up_at = max(started) if started else None
    beats = [_heartbeat_at(p.heartbeat, p.heartbeat_seen_at) for p in pods.running]
    beats.append(_heartbeat_at(aw.heartbeat, aw.heartbeat_seen_at))
    known = [b for b in beats if b is not None]
    last = max(known) if known else None
    reference = max((t for t in (up_at, last) if t is not None), default=None)
    if reference is None:
        return None
    deadline = reference + timeout
    if now < deadline:
        # No verdict while the heartbeat is fresh (each refresh would publish one); just the timer.
        return Finding(state="Healthy", next_check=deadline)
    since = f"the last at {_kube_time(last)}" if last is not None and last >= reference else "none since"
    if last is None or last < reference:
        since += f" all pods were Running at {_kube_time(reference)}"
    return Finding(
        state="Unhealthy",
        reason=REASON_STALLED,
        message=f"no progress heartbeat within the heartbeat timeout {format_go_duration(timeout)} ({since})",
        first_unhealthy_at=deadline,
        deadline=deadline,
        failure_class=CLASS_UNKNOWN,
        failure_code=CODE_STALLED,
    )


def assess(state: AppWrapperHealth, aw: AppWrapperView, now: datetime) -> Finding:
    """Judge the current attempt of a Running AppWrapper at ``now`` (see the module docstring)."""
    now = as_utc(now)
    components = _components(state, aw)
    pods = _count_pods(state, aw.attempt_started_at)

    missing = [c for c in components if c.deleted or c.deletion_requested]
    if missing:
        return _missing_component(aw, missing)
    failed_components = [c for c in components if c.failed]
    if failed_components:
        return _failed_component(state, aw, failed_components, pods, now)
    tolerated = 0
    if aw.completion is not None:
        pods, tolerated, by_policy = _completion(state, aw.completion, pods, aw.attempt_started_at)
        if by_policy is not None and not pods.failed:
            return by_policy
    if (
        aw.expected_pods is not None
        and pods.succeeded + tolerated >= aw.expected_pods
        and pods.pending + len(pods.running) + len(pods.failed) == 0
    ):
        return Finding(
            state="Succeeded",
            reason=REASON_SUCCEEDED,
            message=f"{pods.succeeded} pods succeeded and no running, pending, or failed pods",
        )
    if pods.failed:
        return _failed_pods(state, aw, pods, now)
    no_execute = _no_execute(state, pods)
    if no_execute is not None:
        return no_execute
    storm = _restart_storm(state, aw, now)
    if tolerated and aw.expected_pods is not None:
        # A failed pod the completion policy tolerates is done, not missing.
        aw = dataclasses.replace(aw, expected_pods=max(aw.expected_pods - tolerated, 0))
    readiness = _readiness(aw, pods, now)
    if storm is not None:
        # A back-off wait inside its grace period does not hold back a readiness check that is
        # already due.
        return readiness if storm.state == "Healthy" and readiness.state == "Unhealthy" else storm
    if readiness.reason or readiness.next_check is not None:
        return readiness
    return _stalled(state, aw, pods, now) or readiness


def _completion(
    state: AppWrapperHealth, policy: CompletionPolicy, pods: _Pods, start: datetime | None
) -> tuple[_Pods, int, Finding | None]:
    """A completion policy applied (docs/lifecycle.md, "Completion policy"): the failed pods
    that count (those of pod sets whose minFailed is reached), how many failed pods are
    tolerated, and the Succeeded finding when a pod set's minSucceeded is reached."""
    failed_by_set: dict[int | None, list[PodRecord]] = {}
    for pod in pods.failed:
        failed_by_set.setdefault(pod.pod_set, []).append(pod)
    counted = [
        pod
        for pod_set, failed in failed_by_set.items()
        if policy.failed_enough(pod_set, len(failed))
        for pod in failed
    ]
    succeeded: dict[int, int] = {}
    for pod in state.pods.values():
        if (
            pod.phase == "Succeeded"
            and pod.pod_set is not None
            and _in_attempt(pod.created_at, pod.observed_at, start)
        ):
            succeeded[pod.pod_set] = succeeded.get(pod.pod_set, 0) + 1
    finding = None
    won = policy.succeeded_by(succeeded)
    if won is not None:
        finding = Finding(
            state="Succeeded",
            reason=REASON_SUCCEEDED,
            message=(
                f"{succeeded[won]} pods of pod set {won} succeeded (minSucceeded "
                f"{policy.min_succeeded[won]} by the completion policy)"
            ),
        )
    kept = tuple(sorted(counted, key=lambda p: p.name))
    return dataclasses.replace(pods, failed=kept), len(pods.failed) - len(kept), finding


def _judged(aw: AppWrapperView) -> bool:
    return aw.phase == Phase.RUNNING and not aw.suspend and not aw.deleting and not aw.managed_elsewhere


def _settled(last: Verdict | None, aw: AppWrapperView) -> bool:
    """Whether the last verdict already decided this attempt (or the AppWrapper's end)."""
    if last is None or last.ref.uid != aw.ref.uid:
        return False
    if last.state == "Deleted":
        return True
    same_attempt = (
        last.resetting_count == aw.resetting_count and last.attempt_started_at == aw.attempt_started_at
    )
    return same_attempt and last.state in ("Unhealthy", "Succeeded")


_Signature = tuple[object, ...]


def _signature_of_verdict(v: Verdict) -> _Signature:
    return (
        v.ref.uid,
        v.state,
        v.reason,
        v.terminal,
        v.counts_toward_retry,
        tuple(v.nodes),
        v.first_unhealthy_at,
        v.deadline,
        v.resetting_count,
        v.attempt_started_at,
        tuple(v.warnings),
        v.failure_class,
        v.failure_code,
        v.fault_kind,
    )


def _signature(aw: AppWrapperView, f: Finding) -> _Signature:
    return (
        aw.ref.uid,
        f.state,
        f.reason,
        f.terminal,
        f.counts_toward_retry,
        f.nodes,
        f.first_unhealthy_at,
        f.deadline,
        aw.resetting_count,
        aw.attempt_started_at,
        aw.warnings,
        f.failure_class,
        f.failure_code,
        f.fault_kind,
    )


def evaluate(state: AppWrapperHealth, now: datetime) -> Decision:
    """Decide whether a verdict is due for this AppWrapper at ``now``. Pure."""
    now = as_utc(now)
    aw = state.appwrapper
    if aw is None:
        return Decision(state, None, None)
    last = state.last_verdict
    if aw.deleted:
        if not aw.ref.uid:
            return Decision(state, None, None)  # never seen alive: nobody to tell
        finding = Finding(state="Deleted", reason=REASON_APPWRAPPER_DELETED, message="AppWrapper was deleted")
    elif not _judged(aw) or _settled(last, aw):
        return Decision(state, None, None)
    else:
        finding = assess(state, aw, now)

    if last is not None and _signature_of_verdict(last) == _signature(aw, finding):
        return Decision(state, None, finding.next_check)
    seq = last.seq + 1 if last is not None and last.ref.uid == aw.ref.uid else 1
    verdict = Verdict(
        ref=aw.ref,
        state=finding.state,
        reason=finding.reason,
        message=finding.message,
        terminal=finding.terminal,
        counts_toward_retry=finding.counts_toward_retry,
        nodes=finding.nodes,
        resetting_count=aw.resetting_count,
        first_unhealthy_at=finding.first_unhealthy_at,
        decided_at=now,
        seq=seq,
        warnings=aw.warnings,
        deadline=finding.deadline,
        attempt_started_at=aw.attempt_started_at,
        failure_class=finding.failure_class,
        failure_code=finding.failure_code,
        fault_kind=finding.fault_kind,
    )
    return Decision(remember_published(state, verdict), verdict, finding.next_check)
