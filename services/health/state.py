"""Health's state for one AppWrapper and the pure reducers that fold observations into it.

One :class:`AppWrapperHealth` per AppWrapper (namespace/name). It holds only the latest state of
each object that belongs to the AppWrapper, plus the last verdict published, so a restarted
instance rebuilds an equivalent state by replaying the latest observations (the observation
stream keeps the last message per object) and the last verdict from the verdict stream.

Every timestamp that a deadline is computed from comes from the observed objects themselves
(condition transition times, creation times, container finish times), not from when this
process happened to see them, so that two instances, or one restarted, agree on deadlines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from services.health.view import AppWrapperView, view_of
from shared.failures import failure_table
from shared.failures.blame import DEFAULT_WINDOW
from shared.failures.facts import ContainerExit, FailureFacts, PodCondition
from shared.failures.patterns import FailurePattern
from shared.faulttolerance import FaultTolerance
from shared.kubetime import as_utc
from shared.messages import (
    AppWrapperObservation,
    ComponentObservation,
    ContainerState,
    NodeVerdict,
    PodObservation,
    Verdict,
)

__all__ = [
    "AppWrapperHealth",
    "ComponentRecord",
    "FailureSettings",
    "Observation",
    "PodRecord",
    "affected_by",
    "apply",
    "failure_facts",
    "gone",
    "remember_published",
    "supersedes",
]

Observation = AppWrapperObservation | PodObservation | ComponentObservation | NodeVerdict


@dataclass(frozen=True, slots=True)
class PodRecord:
    name: str
    uid: str
    phase: str
    observed_at: datetime
    created_at: datetime | None
    node_name: str
    deletion_requested: bool
    resources: frozenset[str]
    # Non-zero exit codes of terminated (non-init) containers, for the exit-code policy.
    exit_codes: tuple[int, ...]
    # When the pod failed (phase Failed): the latest container finishedAt, or else the
    # observation time of the first Failed observation of this pod.
    failed_at: datetime | None
    # What the failure is classified on (docs/failures.md); kept for Failed pods only, the
    # others never need it.
    facts: FailureFacts | None = None


@dataclass(frozen=True, slots=True)
class ComponentRecord:
    kind: str
    name: str
    uid: str
    observed_at: datetime
    created_at: datetime | None
    # Tombstone (the object is gone) or deletionTimestamp set: both are "not deployed" upstream.
    deleted: bool
    deletion_requested: bool
    failed: bool
    # First observation time at which the component reported Failed.
    failed_at: datetime | None
    status_message: str


@dataclass(frozen=True, slots=True)
class FailureSettings:
    """The operator's side of failure classification (the ``failures`` config section)."""

    # The operator's table: its own patterns ahead of the defaults, or instead of them.
    table: tuple[FailurePattern, ...] = field(default_factory=failure_table)
    # Failures of one attempt this close together, all alike, are the application's fault.
    application_fault_window: timedelta = DEFAULT_WINDOW


@dataclass(frozen=True, slots=True)
class AppWrapperHealth:
    namespace: str
    name: str
    # Operator-level parameters; per-AppWrapper annotations are applied on top of them.
    defaults: FaultTolerance = field(default_factory=FaultTolerance)
    failures: FailureSettings = field(default_factory=FailureSettings)
    appwrapper: AppWrapperView | None = None
    # Keyed by pod name.
    pods: Mapping[str, PodRecord] = field(default_factory=dict)
    # Keyed by (kind, name), as status.componentStatus names them.
    components: Mapping[tuple[str, str], ComponentRecord] = field(default_factory=dict)
    # Latest Autopilot verdict per resource (e.g. nvidia.com/gpu). Node verdicts are global:
    # the service applies each one to every AppWrapper it tracks.
    node_verdicts: Mapping[str, NodeVerdict] = field(default_factory=dict)
    # The last verdict published for this AppWrapper (by this or a previous instance).
    last_verdict: Verdict | None = None

    def no_execute_nodes(self, resource: str) -> frozenset[str]:
        found = self.node_verdicts.get(resource)
        return frozenset(found.no_execute) if found is not None else frozenset()


def _apply_appwrapper(state: AppWrapperHealth, obs: AppWrapperObservation) -> AppWrapperHealth:
    view = view_of(obs, state.defaults)
    previous = state.appwrapper
    if obs.deleted and previous is not None and view.ref.uid in ("", previous.ref.uid):
        # A tombstone may carry an empty or stale body: keep what was last known of the object
        # (its uid, attempt and count) and only mark it deleted.
        view = replace(previous, deleted=True)
    return replace(state, appwrapper=view)


def _failed_at(obs: PodObservation, previous: PodRecord | None) -> datetime | None:
    if obs.phase != "Failed":
        return None
    finished = [
        as_utc(c.finished_at)
        for c in obs.containers
        if not c.init and c.state == "terminated" and c.finished_at is not None
    ]
    if finished:
        return max(finished)
    if previous is not None and previous.uid == obs.ref.uid and previous.failed_at is not None:
        return previous.failed_at
    return as_utc(obs.observed_at)


def _container_exit(c: ContainerState) -> ContainerExit:
    if c.state == "terminated":
        return ContainerExit(
            name=c.name, init=c.init, exit_code=c.exit_code, reason=c.reason, message=c.message
        )
    if c.state == "waiting":
        return ContainerExit(name=c.name, init=c.init, reason=c.reason, message=c.message)
    return ContainerExit(name=c.name, init=c.init)


def failure_facts(obs: PodObservation, failed_at: datetime | None) -> FailureFacts:
    """The facts a failure of this pod is classified on, from its observation alone.

    The node's state and whether someone else deleted the pod are not in a pod observation;
    they are left unknown (``""``, False), so the table rows that need them do not match.
    """
    # Init containers first, as FailureFacts expects (first_failed prefers a non-init one).
    ordered = sorted(obs.containers, key=lambda c: not c.init)
    return FailureFacts(
        pod=obs.ref.name,
        node=obs.node_name,
        phase=obs.phase,
        reason=obs.reason,
        message=obs.message,
        containers=tuple(_container_exit(c) for c in ordered),
        conditions=tuple(
            PodCondition(type=c.type, status=c.status, reason=c.reason, message=c.message)
            for c in obs.conditions
        ),
        failed_at=failed_at,
    )


def _apply_pod(state: AppWrapperHealth, obs: PodObservation) -> AppWrapperHealth:
    name = obs.ref.name
    previous = state.pods.get(name)
    pods = dict(state.pods)
    if obs.deleted:
        if previous is not None and previous.uid and obs.ref.uid and previous.uid != obs.ref.uid:
            return state  # the tombstone of an earlier pod with the same name
        pods.pop(name, None)
        return replace(state, pods=pods)
    failed_at = _failed_at(obs, previous)
    pods[name] = PodRecord(
        name=name,
        uid=obs.ref.uid,
        phase=obs.phase,
        observed_at=as_utc(obs.observed_at),
        created_at=as_utc(obs.created_at) if obs.created_at is not None else None,
        node_name=obs.node_name,
        deletion_requested=obs.deletion_requested,
        resources=frozenset(obs.resources),
        exit_codes=tuple(
            c.exit_code
            for c in obs.containers
            if not c.init and c.state == "terminated" and c.exit_code is not None and c.exit_code != 0
        ),
        failed_at=failed_at,
        facts=failure_facts(obs, failed_at) if obs.phase == "Failed" else None,
    )
    return replace(state, pods=pods)


def _apply_component(state: AppWrapperHealth, obs: ComponentObservation) -> AppWrapperHealth:
    key = (obs.kind, obs.ref.name)
    previous = state.components.get(key)
    if obs.deleted and previous is not None and previous.uid and obs.ref.uid and previous.uid != obs.ref.uid:
        return state  # the tombstone of an earlier object with the same name
    observed_at = as_utc(obs.observed_at)
    failed_at = None
    if obs.failed and not obs.deleted:
        same = previous is not None and previous.uid == obs.ref.uid and previous.failed_at is not None
        failed_at = previous.failed_at if same and previous is not None else observed_at
    components = dict(state.components)
    components[key] = ComponentRecord(
        kind=obs.kind,
        name=obs.ref.name,
        uid=obs.ref.uid,
        observed_at=observed_at,
        created_at=as_utc(obs.created_at) if obs.created_at is not None else None,
        deleted=obs.deleted,
        deletion_requested=obs.deletion_requested,
        failed=obs.failed and not obs.deleted,
        failed_at=failed_at,
        status_message=obs.status_message,
    )
    return replace(state, components=components)


def supersedes(verdict: NodeVerdict, current: NodeVerdict | None) -> bool:
    """Whether ``verdict`` replaces ``current`` (the same resource's): not an older decision
    delivered late."""
    return current is None or as_utc(current.decided_at) <= as_utc(verdict.decided_at)


def _apply_node_verdict(state: AppWrapperHealth, verdict: NodeVerdict) -> AppWrapperHealth:
    if not supersedes(verdict, state.node_verdicts.get(verdict.resource)):
        return state  # an older decision delivered late
    node_verdicts = dict(state.node_verdicts)
    node_verdicts[verdict.resource] = verdict
    return replace(state, node_verdicts=node_verdicts)


def apply(state: AppWrapperHealth, observation: Observation) -> AppWrapperHealth:
    """Fold one observation into the state. Pure; observations of other AppWrappers are ignored."""
    if isinstance(observation, NodeVerdict):
        return _apply_node_verdict(state, observation)
    if observation.ref.namespace != state.namespace:
        return state
    if isinstance(observation, AppWrapperObservation):
        if observation.ref.name != state.name:
            return state
        return _apply_appwrapper(state, observation)
    if observation.appwrapper != state.name:
        return state
    if isinstance(observation, PodObservation):
        return _apply_pod(state, observation)
    return _apply_component(state, observation)


def affected_by(state: AppWrapperHealth, previous: NodeVerdict | None, current: NodeVerdict) -> bool:
    """Whether a new node verdict can change this AppWrapper's health.

    Only NoExecute decides verdicts, and only for pods that use the resource on a node that
    entered or left the NoExecute set: judging every tracked AppWrapper again on every node
    label change would cost O(AppWrappers) evaluations for what usually concerns a handful.
    """
    changed = set(current.no_execute).symmetric_difference(previous.no_execute if previous else ())
    if not changed:
        return False
    return any(pod.node_name in changed and current.resource in pod.resources for pod in state.pods.values())


def gone(state: AppWrapperHealth) -> bool:
    """Whether holding this AppWrapper serves nothing any more.

    Either its deletion was published (the last verdict says ``Deleted``, and the only AppWrapper
    of that name known, if any, is the deleted one), so nothing more will be said of it; or
    nothing at all is known of it (the tombstones of its last objects were folded in, and no
    verdict was read for it). A state holding pods or components but no AppWrapper is kept: its
    AppWrapper's observation may be on its way (published again after the stream discarded it).
    """
    aw, last = state.appwrapper, state.last_verdict
    if last is not None and last.state == "Deleted":
        return aw is None or (aw.deleted and aw.ref.uid in ("", last.ref.uid))
    return last is None and aw is None and not state.pods and not state.components


def remember_published(state: AppWrapperHealth, verdict: Verdict) -> AppWrapperHealth:
    """Record a verdict already on the stream (read back at start-up) so it is not repeated.

    Also used by the rules for each verdict they emit. An older verdict (lower ``seq`` for the
    same uid) never replaces a newer one.
    """
    last = state.last_verdict
    if last is not None and last.ref.uid == verdict.ref.uid and last.seq > verdict.seq:
        return state
    return replace(state, last_verdict=verdict)
