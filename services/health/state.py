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
from shared.failures.facts import ContainerExit, FailureFacts, NodeState, PodCondition
from shared.failures.patterns import FailurePattern
from shared.faulttolerance import FaultTolerance
from shared.kubetime import as_utc
from shared.messages import (
    NODE_STATE_RESOURCE,
    AppWrapperObservation,
    ComponentObservation,
    ContainerState,
    NodeVerdict,
    PodObservation,
    Verdict,
)
from shared.stalls import StallDefaults, StallPolicy

__all__ = [
    "AppWrapperHealth",
    "ComponentRecord",
    "ContainerRestarts",
    "FailureSettings",
    "Observation",
    "PodRecord",
    "Storm",
    "apply",
    "failure_facts",
    "forget_departed",
    "gone",
    "node_changes",
    "node_state_of",
    "remember_published",
    "supersedes",
    "touched_by",
    "with_node_verdicts",
]

Observation = AppWrapperObservation | PodObservation | ComponentObservation | NodeVerdict


@dataclass(frozen=True, slots=True)
class Storm:
    """A rise of a container's restart count by ``rise`` between ``since`` and ``at``."""

    at: datetime
    since: datetime
    rise: int
    window: timedelta


@dataclass(frozen=True, slots=True)
class ContainerRestarts:
    """What health keeps of one container's restarts (docs/failures.md#restart-storms).

    ``samples`` are (time first seen, restart count) pairs, oldest first, one per count seen:
    those inside the storm window of the latest, and the last one before it (the count in force
    when the window opened). Without a storm the counts inside the window rise by less than K,
    so at most K + 1 samples are kept; once a storm is seen it is kept and the samples stop
    changing (kept only so that a change of the AppWrapper's policy can judge them again).
    """

    name: str
    init: bool
    restart_count: int
    samples: tuple[tuple[datetime, int], ...] = ()
    storm: Storm | None = None
    # When the container was first seen waiting in CrashLoopBackOff at its current restart
    # count (the current back-off wait), or None.
    crash_loop_since: datetime | None = None


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
    # When the pod failed (phase Failed): the latest container finishedAt, or else the
    # observation time of the first Failed observation of this pod.
    failed_at: datetime | None
    # Its pod set (the respawn.dev/pod-set label), for a completion policy; None when unknown.
    pod_set: int | None = None
    # Restart history per container, for restart storms; in the pod's container order.
    restarts: tuple[ContainerRestarts, ...] = ()
    # The pod's respawn.dev/heartbeat as written, and when this value was first seen.
    heartbeat: str = ""
    heartbeat_seen_at: datetime | None = None
    # The observation time of the first Running observation of this pod (uid).
    running_since: datetime | None = None

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
    # A node lost no later than this after a pod failed counts as the pod's node state.
    node_lost_leeway: timedelta = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class AppWrapperHealth:
    namespace: str
    name: str
    # Operator-level parameters; per-AppWrapper annotations are applied on top of them.
    defaults: FaultTolerance = field(default_factory=FaultTolerance)
    # Operator-level restart-storm parameters (the health section of the configuration).
    stall_defaults: StallDefaults = field(default_factory=StallDefaults)

    failures: FailureSettings = field(default_factory=FailureSettings)
    appwrapper: AppWrapperView | None = None
    # Keyed by pod name.
    pods: Mapping[str, PodRecord] = field(default_factory=dict)
    # Failed pods whose tombstone came before the rules ran since they failed, keyed by uid.
    # A controller may delete a failed pod at once (KubeRay replaces a failed Ray worker within
    # milliseconds): the failure and the deletion then arrive together and are folded in before
    # the next evaluation, which would find no failed pod. Kept until one evaluation has seen
    # them (forget_departed), so a failure that was observed is judged however soon it went.
    departed: Mapping[str, PodRecord] = field(default_factory=dict)
    # Keyed by (kind, name), as status.componentStatus names them.
    components: Mapping[tuple[str, str], ComponentRecord] = field(default_factory=dict)
    # Latest Autopilot verdict per resource (e.g. nvidia.com/gpu). Node verdicts are global:
    # the service applies each one to every AppWrapper it tracks.
    node_verdicts: Mapping[str, NodeVerdict] = field(default_factory=dict)
    # The last verdict published for this AppWrapper (by this or a previous instance).
    last_verdict: Verdict | None = None

    @property
    def node_states(self) -> NodeVerdict | None:
        """Autopilot's lost nodes (the node verdict of respawn.dev/node-state), if any is known."""
        return self.node_verdicts.get(NODE_STATE_RESOURCE)

    def no_execute_nodes(self, resource: str) -> frozenset[str]:
        found = self.node_verdicts.get(resource)
        return frozenset(found.no_execute) if found is not None else frozenset()


def _apply_appwrapper(state: AppWrapperHealth, obs: AppWrapperObservation) -> AppWrapperHealth:
    view = view_of(obs, state.defaults, state.stall_defaults)
    previous = state.appwrapper
    if obs.deleted and previous is not None and view.ref.uid in ("", previous.ref.uid):
        # A tombstone may carry an empty or stale body: keep what was last known of the object
        # (its uid, attempt and count) and only mark it deleted.
        view = replace(previous, deleted=True)
    elif previous is not None and previous.heartbeat == view.heartbeat:
        # The heartbeat did not change: it was seen first when it was.
        view = replace(view, heartbeat_seen_at=previous.heartbeat_seen_at)
    return _restorm(replace(state, appwrapper=view), _stall_policy(state))


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


def _stall_policy(state: AppWrapperHealth) -> StallPolicy:
    if state.appwrapper is not None:
        return state.appwrapper.stalls
    d = state.stall_defaults
    return StallPolicy(storm_restarts=d.storm_restarts, storm_window=d.storm_window)


def _track(
    previous: ContainerRestarts | None,
    c: ContainerState,
    at: datetime,
    created_at: datetime | None,
    policy: StallPolicy,
) -> ContainerRestarts:
    """Fold one observation of a container into its restart history. Pure.

    A storm is a rise by at least K = ``policy.storm_restarts`` within W = ``policy.storm_window``:
    for some time t, the count first seen at t exceeds the count in force at t - W (the latest
    seen at or before it; the earliest seen when none is that old) by K or more: the restarts are
    taken to have happened when their count was first seen, as the watch reports every change
    of a pod. Checking at each new count suffices, because the count only rises then. For a pod
    first seen within W of its creation, the creation stands for a count of 0: a restarted health
    instance sees only the latest observation of a pod, and still knows that a young pod's
    restarts all fell within W.
    """
    count = c.restart_count
    crash_loop = c.state == "waiting" and c.reason == "CrashLoopBackOff"
    crash_loop_since = None
    if crash_loop:
        same_wait = (
            previous is not None and previous.crash_loop_since is not None and previous.restart_count == count
        )
        crash_loop_since = previous.crash_loop_since if same_wait and previous is not None else at
    if previous is None or count < previous.restart_count:
        # First seen (or a count that went down, which only a new container can do): a baseline.
        samples: tuple[tuple[datetime, int], ...] = ((at, count),)
        if count > 0 and created_at is not None and at - policy.storm_window <= created_at <= at:
            samples = ((created_at, 0), (at, count))
        storm = None
    else:
        samples, storm = previous.samples, previous.storm
        if count > previous.restart_count and storm is None:
            latest = samples[-1][0] if samples else at
            samples = (*samples, (max(at, latest), count))
    if not policy.counts_restarts:
        return ContainerRestarts(c.name, c.init, count, crash_loop_since=crash_loop_since)
    if storm is None and len(samples) > 1:
        storm = _storm_at(samples, len(samples) - 1, policy)
    if samples:
        opened = samples[-1][0] - policy.storm_window
        inside = [s for s in samples if s[0] > opened]
        before = [s for s in samples if s[0] <= opened]
        samples = (*before[-1:], *inside)
    return ContainerRestarts(c.name, c.init, count, samples, storm, crash_loop_since)


def _storm_at(samples: tuple[tuple[datetime, int], ...], i: int, policy: StallPolicy) -> Storm | None:
    """The storm the count first seen at ``samples[i]`` makes, if it makes one (see _track)."""
    t, top = samples[i]
    opened = t - policy.storm_window
    older = [s for s in samples[: i + 1] if s[0] <= opened]
    base_at, base = older[-1] if older else samples[0]
    if top - base >= policy.storm_restarts:
        return Storm(at=t, since=base_at, rise=top - base, window=policy.storm_window)
    return None


def _under(c: ContainerRestarts, policy: StallPolicy) -> ContainerRestarts:
    """A container's restart history judged again under ``policy``. Pure.

    A pod can be folded before its AppWrapper is (the stream keeps only the latest observation
    of each object, so an AppWrapper whose status changed since sorts after its pods), and so
    under the operator's defaults rather than the AppWrapper's own restart-storm annotation; or
    the annotation changed. The samples kept are searched again for the earliest storm.
    """
    if not policy.counts_restarts:
        return replace(c, samples=(), storm=None)
    storms = (_storm_at(c.samples, i, policy) for i in range(1, len(c.samples)))
    return replace(c, storm=next((s for s in storms if s is not None), None))


def _restorm(state: AppWrapperHealth, before: StallPolicy) -> AppWrapperHealth:
    policy = _stall_policy(state)
    if (policy.storm_restarts, policy.storm_window) == (before.storm_restarts, before.storm_window):
        return state
    pods = {
        name: replace(pod, restarts=tuple(_under(c, policy) for c in pod.restarts))
        for name, pod in state.pods.items()
    }
    return replace(state, pods=pods)


def _restarts(
    obs: PodObservation, previous: PodRecord | None, policy: StallPolicy
) -> tuple[ContainerRestarts, ...]:
    same_pod = previous is not None and previous.uid == obs.ref.uid
    known = {(r.init, r.name): r for r in previous.restarts} if same_pod and previous is not None else {}
    at = as_utc(obs.observed_at)
    created = as_utc(obs.created_at) if obs.created_at is not None else None
    return tuple(_track(known.get((c.init, c.name)), c, at, created, policy) for c in obs.containers)


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
    they are left unknown (``""``, False) here. The node's state is filled in when the failure is
    judged, from autopilot's node-state verdict (:func:`node_state_of`, by the rules).
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


def node_state_of(
    lost: NodeVerdict | None, node: str, failed_at: datetime | None, leeway: timedelta
) -> NodeState:
    """The state of a failed pod's node, from autopilot's node-state verdict (docs/failures.md#node-state).

    ``""`` when it is not known: no verdict held (autopilot does not publish one), or the pod has
    no node. A node the verdict lists counts only if it was lost no later than ``leeway`` after
    the pod failed: a pod that failed well before its node became NotReady (a kubelet that is
    merely late with its status, say) failed by itself, and its node was ``Ready`` then. A node
    not listed is ``Ready``. The verdict is the one held when the failure is judged.
    """
    if lost is None or not node:
        return ""
    entry = next((e for e in lost.lost_nodes if e.node == node), None)
    if entry is None:
        return "Ready"
    if failed_at is not None and as_utc(entry.since) > as_utc(failed_at) + leeway:
        return "Ready"
    return entry.state


def _apply_pod(state: AppWrapperHealth, obs: PodObservation) -> AppWrapperHealth:
    name = obs.ref.name
    previous = state.pods.get(name)
    pods = dict(state.pods)
    if obs.deleted:
        if previous is not None and previous.uid and obs.ref.uid and previous.uid != obs.ref.uid:
            return state  # the tombstone of an earlier pod with the same name
        pods.pop(name, None)
        if previous is not None and previous.phase == "Failed" and previous.uid:
            return replace(state, pods=pods, departed={**state.departed, previous.uid: previous})
        return replace(state, pods=pods)
    same = previous is not None and previous.uid == obs.ref.uid
    observed_at = as_utc(obs.observed_at)
    failed_at = _failed_at(obs, previous)
    pods[name] = PodRecord(
        name=name,
        uid=obs.ref.uid,
        phase=obs.phase,
        observed_at=observed_at,
        created_at=as_utc(obs.created_at) if obs.created_at is not None else None,
        node_name=obs.node_name,
        deletion_requested=obs.deletion_requested,
        resources=frozenset(obs.resources),
        failed_at=failed_at,
        pod_set=obs.pod_set,
        restarts=_restarts(obs, previous, _stall_policy(state)),
        heartbeat=obs.heartbeat,
        heartbeat_seen_at=(
            previous.heartbeat_seen_at
            if same and previous is not None and previous.heartbeat == obs.heartbeat
            else observed_at
        ),
        running_since=(
            (
                previous.running_since
                if same and previous is not None and previous.running_since
                else observed_at
            )
            if obs.phase == "Running"
            else None
        ),
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


def node_changes(previous: NodeVerdict | None, current: NodeVerdict) -> frozenset[str]:
    """The nodes whose standing a new node verdict changed: those that entered or left the
    NoExecute set of its resource, or (the node-state verdict) that were lost or came back
    (pure). Computed once per node verdict, not once per AppWrapper."""
    if current.resource == NODE_STATE_RESOURCE:
        moved = set(current.lost_nodes).symmetric_difference(previous.lost_nodes if previous else ())
        return frozenset(e.node for e in moved)
    return frozenset(set(current.no_execute).symmetric_difference(previous.no_execute if previous else ()))


def touched_by(state: AppWrapperHealth, changed: frozenset[str], current: NodeVerdict) -> bool:
    """Whether the node verdict ``current``, which changed the standing of the nodes
    ``changed`` (:func:`node_changes`), can change this AppWrapper's health.

    Only NoExecute decides verdicts, and only for pods that use the resource on a node that
    entered or left the NoExecute set; a lost node only changes the class of a failure on it
    (node_state_of). Judging every tracked AppWrapper again on every node label change would
    cost O(AppWrappers) evaluations for what usually concerns a handful.
    """
    if not changed:
        return False
    if current.resource == NODE_STATE_RESOURCE:
        return any(pod.facts is not None and pod.node_name in changed for pod in state.pods.values())
    return any(pod.node_name in changed and current.resource in pod.resources for pod in state.pods.values())


def with_node_verdicts(state: AppWrapperHealth, verdicts: Mapping[str, NodeVerdict]) -> AppWrapperHealth:
    """The state with each of ``verdicts`` that supersedes its own applied (pure; the state itself
    when it already holds them all, the common case, at the cost of a look per resource).

    The service applies a node verdict at once only to the AppWrappers it may change, and to the
    others through this before they are next judged: applied to all of them at once, one node
    label change cost a copy of every state held (hundreds of milliseconds at 10,000
    AppWrappers, on the way to the verdicts of the pods that node ran)."""
    for resource, verdict in verdicts.items():
        if state.node_verdicts.get(resource) is not verdict:
            state = _apply_node_verdict(state, verdict)
    return state


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
    return last is None and aw is None and not state.pods and not state.components and not state.departed


def forget_departed(state: AppWrapperHealth, judged: AppWrapperHealth) -> AppWrapperHealth:
    """``state`` without the departed pods that ``judged`` (the state an evaluation saw) held:
    their failure has been judged. Ones that departed since (folded in while a verdict was
    being published) wait for the next evaluation."""
    if not judged.departed or not state.departed:
        return state
    left = {uid: pod for uid, pod in state.departed.items() if uid not in judged.departed}
    return replace(state, departed=left) if len(left) != len(state.departed) else state


def remember_published(state: AppWrapperHealth, verdict: Verdict) -> AppWrapperHealth:
    """Record a verdict already on the stream (read back at start-up) so it is not repeated.

    Also used by the rules for each verdict they emit. An older verdict (lower ``seq`` for the
    same uid) never replaces a newer one.
    """
    last = state.last_verdict
    if last is not None and last.ref.uid == verdict.ref.uid and last.seq > verdict.seq:
        return state
    return replace(state, last_verdict=verdict)
