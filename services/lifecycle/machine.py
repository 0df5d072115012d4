"""The AppWrapper lifecycle as a pure function: ``reconcile(aw, observed, verdict, params, now) -> Plan``.

The function reads the AppWrapper (as the API server returned it), what the service observed in
the cluster, the latest health verdict and the effective fault-tolerance parameters, and returns
a :class:`Plan`: the new status to write, a finalizer change, the actions to carry out and when
to look again. It reads no clock and does no I/O.

Every clock (admission grace for creation errors, forceful deletion, retry pause, deletion on
failure, success TTL) is computed from a ``lastTransitionTime`` in the status, never from memory,
so a restarted or replacement instance continues exactly where the previous one stopped.

A plan is carried out in this order (see docs/lifecycle.md):

1. add the finalizer if ``finalizer`` is ADD;
2. write ``status`` (when not None) with the object's resourceVersion. On a conflict, stop: read
   the AppWrapper again and call :func:`reconcile` anew; never carry out the rest of a plan
   computed from a stale object;
3. carry out ``actions`` in order; report the outcome of each CreateComponent in
   ``Observed.created`` of the next call;
4. remove the finalizer if ``finalizer`` is REMOVE;
5. ack or keep the verdict as ``verdict_use`` says; reconcile again at ``requeue_at``.

Events (Kubernetes and lifecycle stream) are only ever part of a plan that changes the status, so
whichever instance wins the status write is the one that announces the change. Their ids are a
function of the transition the new status records (:mod:`services.lifecycle.announcements`), so
a copy re-sent after a crash between the status write and the announcements (derived from the
status by :func:`services.lifecycle.announcements.owed`) is dropped wherever the original went.

Within one call the machine runs phase after phase until it has to wait (for the API, for
observations or for a deadline): e.g. an Unhealthy verdict in Running yields, in one plan, the
Resetting status, the nodes the next attempt must avoid (node exclusion) and the first delete
calls.

:func:`needs_attention` is the other half of the phase policy: which AppWrappers the periodic
resync must reconcile because they have work or a clock pending.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final, Literal

from services.lifecycle import announcements
from services.lifecycle.actions import (
    Action,
    CreateComponent,
    EmitEvent,
    LifecycleEventType,
    PublishLifecycleEvent,
)
from services.lifecycle.announcements import FORCEFUL_DELETION_EVENT
from services.lifecycle.attempts import attempt_hook, attempt_of, next_attempt
from services.lifecycle.backoff import retry_pause
from services.lifecycle.conditions import (
    clear_condition,
    condition_status,
    find_condition,
    is_true,
    set_condition,
    transition_time,
    truncate,
)
from services.lifecycle.copies import copy_json
from services.lifecycle.deletion import staged_deletion
from services.lifecycle.observed import Observed, ObservedComponent, Presence
from services.lifecycle.placement.exclusion import exclude_on_reset
from services.lifecycle.templating import (
    PodTemplateHook,
    TemplateError,
    component_identity,
    render_component,
)
from services.lifecycle.verdicts import (
    VerdictRelation,
    VerdictUse,
    attempt_start,
    resetting_count,
    verdict_relation,
)
from shared.appwrapper.constants import (
    COMPONENT_ANNOTATION,
    CONTROLLER_NAME,
    FINALIZER,
    MSG_KUEUE_FORCED_DELETION,
    MSG_NO_RESOURCES_DEPLOYED,
    MSG_RESET_COMPLETE,
    MSG_RESOURCES_DELETED,
    MSG_RESOURCES_DELETED_FAILED,
    MSG_RESOURCES_DELETED_RESETTING,
    MSG_SUSPEND_FALSE,
    MSG_SUSPEND_TRUE,
    STOP_ANNOTATION,
    ComponentReason,
    ConditionStatus,
    ConditionType,
    EventReason,
    Phase,
    Reason,
)
from shared.appwrapper.control import completion_policy, stop_requested
from shared.appwrapper.model import as_mapping
from shared.appwrapper.params import DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION
from shared.appwrapper.podsets import component_pod_sets, expected_pod_count
from shared.config import NodeExclusionConfig
from shared.durations import format_go_duration
from shared.failures.annotation import transient_retry_limit
from shared.failures.budget import RetryAction, decide_retry
from shared.failures.patterns import FailureClass
from shared.faulttolerance import FaultTolerance
from shared.kubetime import as_utc, format_kube_time
from shared.messages import LifecycleEvent, ObjectRef, Verdict

__all__ = [
    "COMPONENT_NOT_CONTROLLED_EVENT",
    "CREATE_RETRY_INTERVAL",
    "FORCEFUL_DELETION_EVENT",
    "TRANSIENT_RETRY_COUNT",
    "FinalizerChange",
    "Plan",
    "needs_attention",
    "reconcile",
]

# How soon a create that failed with a retryable error is tried again (upstream: 1 s), while
# the admission grace period lasts.
CREATE_RETRY_INTERVAL: Final = timedelta(seconds=1)

# More phase steps than any legal chain needs (e.g. Suspending -> Suspended -> Resuming); a
# guard against a bug turning into a busy loop, not a limit on behaviour.
_MAX_STEPS: Final = 8

# Reason of the Warning Event that tells the AppWrapper's owner a component's name is taken by
# an object someone else controls, which lifecycle leaves alone (never deletes).
COMPONENT_NOT_CONTROLLED_EVENT: Final = "ComponentNotControlled"


# status field: the retries of Transient failures, which do not count toward retryLimit
# (docs/failures.md). Written with the Resetting status it counts, in one write.
TRANSIENT_RETRY_COUNT: Final = "transientRetryCount"


def transient_retry_count(status: Mapping[str, Any]) -> int:
    """status.transientRetryCount; anything but a non-negative integer reads as 0."""
    value = status.get(TRANSIENT_RETRY_COUNT)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class FinalizerChange(StrEnum):
    # Before the status write: no resource may exist without the finalizer that guarantees
    # its deletion.
    ADD = "Add"
    # After the status write and the actions: the last thing done for a deleted AppWrapper.
    REMOVE = "Remove"


@dataclass(frozen=True, slots=True)
class Plan:
    # The complete new status, or None when it does not change.
    status: dict[str, Any] | None = None
    # metadata.resourceVersion of the AppWrapper the plan was computed from (for the write).
    resource_version: str = ""
    finalizer: FinalizerChange | None = None
    actions: tuple[Action, ...] = ()
    requeue_at: datetime | None = None
    verdict_use: VerdictUse = VerdictUse.NONE
    # status.phase after the plan.
    phase: str = ""

    @property
    def empty(self) -> bool:
        """Nothing to write, do or wait for."""
        return self.status is None and self.finalizer is None and not self.actions and self.requeue_at is None


def reconcile(
    aw: Mapping[str, Any],
    observed: Observed,
    verdict: Verdict | None,
    params: FaultTolerance,
    now: datetime,
    *,
    hooks: Sequence[PodTemplateHook] = (),
    node_exclusion: NodeExclusionConfig | None = None,
    transient_limit: int = 10,
) -> Plan:
    """Decide what to do next for ``aw``.

    ``verdict`` is the latest verdict for this AppWrapper (or None); ``params`` are the effective
    parameters (operator defaults with the AppWrapper's annotations applied, see
    :func:`shared.appwrapper.params.effective_fault_tolerance`). ``hooks`` add to every pod
    template when components are (re)created, e.g. Autopilot anti-affinity and node exclusion.
    ``node_exclusion``, when enabled, makes a reset after failed pods record the nodes they
    failed on (from ``observed.nodes``; nothing is recorded when the nodes were not read).
    ``transient_limit`` is the operator's transient retry limit (``failures.transientRetryLimit``);
    the AppWrapper's ``respawn.dev/transient-retry-limit`` annotation overrides it.
    """
    exclusion = node_exclusion if node_exclusion is not None and node_exclusion.enabled else None
    return _Reconciliation(
        aw, observed, verdict, params, as_utc(now), tuple(hooks), exclusion, transient_limit
    ).run()


def needs_attention(aw: Mapping[str, Any], now: datetime | None = None) -> bool:
    """Whether the periodic resync should reconcile ``aw``: it has work or a clock pending, or
    announcements owed (a process died between the status write and them).

    Running workloads are driven by verdicts and observations; finished ones only while they
    still hold resources or quota (deletion, success TTL, deletion-on-failure grace); every
    other phase is on its way somewhere. ``now`` lets an AppWrapper without the announcement
    record count as owing its announcements while its status is recent (see
    :func:`services.lifecycle.announcements.pending`).
    """
    meta = as_mapping(aw.get("metadata"))
    status = as_mapping(aw.get("status"))
    if meta.get("deletionTimestamp"):
        return True
    if announcements.pending(aw, now):
        return True
    raw_conditions = status.get("conditions")
    conditions = raw_conditions if isinstance(raw_conditions, list) else []
    holding = is_true(conditions, ConditionType.RESOURCES_DEPLOYED) or is_true(
        conditions, ConditionType.QUOTA_RESERVED
    )
    match status.get("phase", Phase.EMPTY):
        case Phase.RUNNING:
            return False
        case Phase.FAILED | Phase.SUCCEEDED:
            return holding
        case Phase.SUSPENDED:
            return holding or as_mapping(aw.get("spec")).get("suspend") is not True
        case _:
            return True


class _Reconciliation:
    """The working state of one reconcile call: a private copy of the status plus what to do."""

    def __init__(
        self,
        aw: Mapping[str, Any],
        observed: Observed,
        verdict: Verdict | None,
        params: FaultTolerance,
        now: datetime,
        hooks: tuple[PodTemplateHook, ...],
        exclusion: NodeExclusionConfig | None,
        transient_limit: int = 10,
    ) -> None:
        self.aw = aw
        self.meta = as_mapping(aw.get("metadata"))
        # The annotation's problems are reported by validation.parameters, not here.
        self.transient_limit = transient_retry_limit(
            as_mapping(self.meta.get("annotations")), transient_limit
        ).limit
        self.spec = as_mapping(aw.get("spec"))
        raw_components = self.spec.get("components")
        self.components: list[Any] = raw_components if isinstance(raw_components, list) else []
        raw_status = aw.get("status")
        self.original: dict[str, Any] = copy_json(dict(raw_status)) if isinstance(raw_status, Mapping) else {}
        self.status: dict[str, Any] = copy_json(self.original)
        self.observed = observed
        self.verdict = verdict
        self.params = params
        self.now = now
        self.hooks = hooks
        self.exclusion = exclusion
        self.suspend = self.spec.get("suspend") is True
        generation = self.meta.get("generation")
        self.generation = (
            generation if isinstance(generation, int) and not isinstance(generation, bool) else None
        )
        finalizers = self.meta.get("finalizers")
        self.has_finalizer = isinstance(finalizers, list) and FINALIZER in finalizers
        self.actions: list[Action] = []
        # Events that need a discriminator in their id, by identity (see _event).
        self.event_suffix: dict[int, str] = {}
        self.finalizer: FinalizerChange | None = None
        self.requeues: list[datetime] = []
        self.verdict_use: VerdictUse | None = None
        self.start_phase = self.phase
        # A new attempt began within this call (Suspended or Resetting -> Resuming): what was
        # observed and created before the call belongs to an earlier attempt.
        self.new_attempt = False
        # A reset began within this call (see _resetting).
        self.reset_started = False
        # The respawn.dev/stop annotation asks for the workload to be stopped (see _stop).
        self.stopping = stop_requested(self.meta)

    # ------------------------------------------------------------------ driver

    def run(self) -> Plan:
        managed_by = self.spec.get("managedBy")
        if managed_by is not None and managed_by != CONTROLLER_NAME:
            # Another controller (e.g. MultiKueue on a manager cluster) owns this object.
            return Plan(
                resource_version=self._resource_version(),
                verdict_use=VerdictUse.SETTLED if self.verdict else VerdictUse.NONE,
                phase=self.phase,
            )
        if self.meta.get("deletionTimestamp"):
            if self.has_finalizer:
                self._terminate()
        else:
            handlers: dict[str, Callable[[], bool]] = {
                Phase.EMPTY: self._empty,
                Phase.SUSPENDED: self._suspended,
                Phase.RESUMING: self._resuming,
                Phase.RUNNING: self._running,
                Phase.RESETTING: self._resetting,
                Phase.SUSPENDING: self._suspending,
                Phase.SUCCEEDED: self._succeeded,
                Phase.FAILED: self._failed,
            }
            if self.stopping:
                self._stop()
            for _ in range(_MAX_STEPS):
                handler = handlers.get(self.phase)
                if handler is None or not handler():
                    break
            else:
                self._requeue(self.now)
            if self._is_true(ConditionType.RESOURCES_DEPLOYED) and not self.has_finalizer:
                # Resources may exist: they must not outlive the AppWrapper undeleted, even if
                # someone removed the finalizer by hand.
                self.finalizer = FinalizerChange.ADD
        return self._plan()

    def _plan(self) -> Plan:
        changed = self.status != self.original
        if not changed:
            # Announcements only ever travel with the status change they describe (see module doc).
            self.actions = [a for a in self.actions if not isinstance(a, EmitEvent | PublishLifecycleEvent)]
        else:
            self.actions = self._with_ids(self.actions)
        return Plan(
            status=copy_json(self.status) if changed else None,
            resource_version=self._resource_version(),
            finalizer=self.finalizer,
            actions=tuple(self.actions),
            requeue_at=min(self.requeues) if self.requeues else None,
            verdict_use=self._final_verdict_use(),
            phase=self.phase,
        )

    def _with_ids(self, actions: Sequence[Action]) -> list[Action]:
        """The announcements with their ids: functions of the transition the new status records,
        exactly as :func:`services.lifecycle.announcements.owed` re-derives them from it."""
        transition = announcements.transition_of({"metadata": self.meta, "status": self.status})
        if transition is None:  # pragma: no cover - every announced phase has a transition
            now = format_kube_time(self.now)
            transition = announcements.Transition(self.phase, resetting_count(self.status), now, now)
        ref = self._ref()
        seen: dict[str, int] = {}
        out: list[Action] = []
        for action in actions:
            if isinstance(action, PublishLifecycleEvent):
                event = action.event
                forceful = event.event == LifecycleEventType.DELETION_FORCEFUL and transition.forceful
                stamp = transition.forceful if forceful else transition.stamp
                msg_id = announcements.msg_id(ref, event.event, transition.count, event.phase, stamp)
                action = dataclasses.replace(action, msg_id=msg_id)
            elif isinstance(action, EmitEvent):
                forceful = action.reason == FORCEFUL_DELETION_EVENT and transition.forceful
                key = transition.forceful_key if forceful else transition.key
                event_id = announcements.event_id(
                    ref, key, action.reason, self.event_suffix.get(id(action), "")
                )
                # Two Events of one reason in one plan (not expected) must not share a name.
                repeat = seen.get(event_id, 0)
                seen[event_id] = repeat + 1
                action = dataclasses.replace(action, id=f"{event_id}#{repeat + 1}" if repeat else event_id)
            out.append(action)
        return out

    def _final_verdict_use(self) -> VerdictUse:
        if self.verdict is None:
            return VerdictUse.NONE
        if self.verdict_use is not None:
            return self.verdict_use
        relation = verdict_relation(self.meta, self.status, self.verdict)
        if relation is VerdictRelation.AHEAD:
            return VerdictUse.HELD
        if (
            relation is VerdictRelation.CURRENT
            and self.phase == Phase.RESUMING
            and not self.meta.get("deletionTimestamp")
        ):
            # Health may judge the new pods before creation is recorded as done; keep the verdict
            # for the Running phase rather than lose it.
            return VerdictUse.HELD
        return VerdictUse.SETTLED

    def _resource_version(self) -> str:
        rv = self.meta.get("resourceVersion")
        return rv if isinstance(rv, str) else ""

    # ----------------------------------------------------------------- helpers

    @property
    def phase(self) -> str:
        phase = self.status.get("phase", "")
        return phase if isinstance(phase, str) else ""

    @property
    def conditions(self) -> list[Any]:
        conds = self.status.get("conditions")
        return conds if isinstance(conds, list) else []

    def _set(
        self, ctype: str, status: str, reason: str, message: str = "", transition_at: datetime | None = None
    ) -> None:
        self.status["conditions"] = set_condition(
            self.conditions,
            ctype=ctype,
            status=status,
            reason=reason,
            message=message,
            now=self.now,
            observed_generation=self.generation,
            transition_at=transition_at,
        )

    def _clear(self, ctype: str, reason: str, message: str = "") -> None:
        if is_true(self.conditions, ctype):
            self.status["conditions"] = clear_condition(
                self.conditions,
                ctype=ctype,
                reason=reason,
                message=message,
                now=self.now,
                observed_generation=self.generation,
            )

    def _is_true(self, ctype: str) -> bool:
        return is_true(self.conditions, ctype)

    def _since(self, ctype: str) -> datetime:
        """The condition's transition time; a missing one starts now (and is written by _set)."""
        return transition_time(self.conditions, ctype) or truncate(self.now)

    def _requeue(self, at: datetime) -> None:
        self.requeues.append(at)

    def _ref(self) -> ObjectRef:
        return ObjectRef(
            namespace=str(self.meta.get("namespace", "")),
            name=str(self.meta.get("name", "")),
            uid=str(self.meta.get("uid", "")),
        )

    def _event(
        self, type_: Literal["Normal", "Warning"], reason: str, message: str, *, suffix: str = ""
    ) -> None:
        """Record an Event (its id is given in :meth:`_with_ids`; ``suffix`` tells apart Events of
        one reason within one transition, e.g. one per component)."""
        event = EmitEvent(type=type_, reason=reason, message=message)
        if suffix:
            self.event_suffix[id(event)] = suffix
        self.actions.append(event)

    def _announce(
        self,
        event: LifecycleEventType,
        *,
        previous_phase: str = "",
        reason: str = "",
        message: str = "",
        nodes: tuple[str, ...] = (),
        failure: tuple[str, str] = ("", ""),
    ) -> None:
        count = resetting_count(self.status)
        ref = self._ref()
        self.actions.append(
            PublishLifecycleEvent(
                event=LifecycleEvent(
                    ref=ref,
                    event=event,
                    phase=self.phase,
                    previous_phase=previous_phase,
                    reason=reason,
                    message=message,
                    resetting_count=count,
                    nodes=nodes,
                    at=self.now,
                    failure_class=failure[0],
                    failure_code=failure[1],
                ),
                # Given in _with_ids, from the transition the plan's final status records.
                msg_id="",
            )
        )

    def _transition(
        self,
        phase: Phase,
        message: str,
        *,
        reason: str = "",
        event_type: Literal["Normal", "Warning"] = "Normal",
        record_event: bool = True,
        nodes: tuple[str, ...] = (),
        failure: tuple[str, str] = ("", ""),
    ) -> None:
        previous = self.phase
        self.status["phase"] = str(phase)
        if record_event:
            self._event(event_type, str(phase), message)
        self._announce(
            LifecycleEventType.PHASE_CHANGED,
            previous_phase=previous,
            reason=reason,
            message=message,
            nodes=nodes,
            failure=failure,
        )

    # ------------------------------------------------------ component status

    def _fresh_entry(self, index: int) -> dict[str, Any]:
        """status.componentStatus[index] as first recorded: identity plus validated pod sets."""
        component = as_mapping(self.components[index]) if index < len(self.components) else {}
        template = as_mapping(component.get("template"))
        meta = as_mapping(template.get("metadata"))
        pod_sets = component_pod_sets(component)
        return {
            "name": str(meta.get("name", "")),
            "kind": str(template.get("kind", "")),
            "apiVersion": str(template.get("apiVersion", "")),
            "podSets": [ps.model_dump(mode="json", by_alias=True, exclude_defaults=True) for ps in pod_sets],
        }

    def _entries(self) -> list[dict[str, Any]]:
        """status.componentStatus, one object per component (missing ones recorded now)."""
        raw = self.status.get("componentStatus")
        entries: list[dict[str, Any]] = (
            [dict(e) if isinstance(e, Mapping) else {} for e in raw] if isinstance(raw, list) else []
        )
        for index in range(len(entries), len(self.components)):
            entries.append(self._fresh_entry(index))
        for index, entry in enumerate(entries):
            if not entry and index < len(self.components):
                entries[index] = self._fresh_entry(index)
        if entries != raw:
            self.status["componentStatus"] = entries
        return entries

    def _set_component(self, entry: dict[str, Any], status: str, reason: str, message: str = "") -> None:
        entry["conditions"] = set_condition(
            entry.get("conditions") or [],
            ctype=ConditionType.RESOURCES_DEPLOYED,
            status=status,
            reason=reason,
            message=message,
            now=self.now,
            observed_generation=self.generation,
        )

    # --------------------------------------------------------------- deletion

    def _delete_step(self) -> bool:
        """One step of staged deletion; True when nothing the AppWrapper created is left."""
        step = staged_deletion(
            self.status,
            namespace=str(self.meta.get("namespace", "")),
            observed=self.observed,
            forceful_grace=self.params.forceful_deletion_grace,
            now=self.now,
            observed_generation=self.generation,
            consistency=self.params.consistency_mode,
        )
        self.status["conditions"] = step.conditions
        if step.component_status or "componentStatus" in self.status:
            self.status["componentStatus"] = step.component_status
        self.actions.extend(step.actions)
        if step.requeue_at is not None:
            self._requeue(step.requeue_at)
        entries = self.status.get("componentStatus")
        for index in step.foreign:
            entry = as_mapping(entries[index]) if isinstance(entries, list) and index < len(entries) else {}
            name = entry.get("name") or self.observed.component(index).name
            self._event(
                "Warning",
                COMPONENT_NOT_CONTROLLED_EVENT,
                f"{entry.get('kind', 'component')} {name} exists, but is not controlled by this AppWrapper: "
                "it is left in place, not deleted",
                suffix=str(index),
            )
        if step.escalated:
            self._event("Warning", FORCEFUL_DELETION_EVENT, f"Deleting with grace period 0: {step.summary}")
            self._announce(
                LifecycleEventType.DELETION_FORCEFUL, reason=FORCEFUL_DELETION_EVENT, message=step.summary
            )
        return step.complete

    # ------------------------------------------------------------ transitions

    def _unhealthy(self, reason: str, message: str, transition_at: datetime | None = None) -> None:
        self._set(ConditionType.UNHEALTHY, ConditionStatus.TRUE, reason, message, transition_at)
        self._event("Normal", EventReason.UNHEALTHY, f"{reason}: {message}" if message else reason)

    def _suspend_from(self, phase: Phase) -> None:
        message = f"Externally suspended while in the {phase} phase"
        self._event("Normal", EventReason.SUSPENDING, message)
        self._transition(Phase.SUSPENDING, message, reason=EventReason.SUSPENDING, record_event=False)

    def _fail(
        self, reason: str, message: str, nodes: tuple[str, ...] = (), *, failure: tuple[str, str] = ("", "")
    ) -> None:
        self._transition(
            Phase.FAILED, message, reason=reason, event_type="Warning", nodes=nodes, failure=failure
        )
        if (
            self.params.deletion_on_failure_grace > timedelta(0)
            and not self.suspend
            and not self.stopping
            and self._is_true(ConditionType.RESOURCES_DEPLOYED)
        ):
            # The debugging window is measured from entering Failed. The condition is written
            # afresh: an earlier reset may have left DeletingResources False (DeletionComplete),
            # and keeping that old transition time would cut the window short.
            self.status["conditions"] = [
                c
                for c in self.conditions
                if not (isinstance(c, Mapping) and c.get("type") == ConditionType.DELETING_RESOURCES)
            ]
            self._set(
                ConditionType.DELETING_RESOURCES,
                ConditionStatus.FALSE,
                Reason.DELETION_PAUSED,
                self._paused_message(),
            )

    def _paused_message(self) -> str:
        return (
            f"{DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION} has value "
            f"{format_go_duration(self.params.deletion_on_failure_grace)}"
        )

    def _reset_or_fail(
        self, *, terminal: bool, increment: int, reason: str, message: str, nodes: tuple[str, ...] = ()
    ) -> None:
        """Upstream's resetOrFail: reset while retries remain and the failure is not terminal."""
        count = resetting_count(self.status)
        limit = self.params.retry_limit
        if terminal or count >= limit:
            why = "the failure is terminal" if terminal else f"the retry limit of {limit} is reached"
            self._fail(reason, f"{reason}: {message}; {why}" if message else f"{reason}; {why}", nodes)
            return
        # Every reset begins a new attempt, counted or not; written with the Resetting status.
        self.status["attempt"] = next_attempt(self.status)
        self.status["resettingCount"] = count + increment
        self.reset_started = True
        if increment:
            detail = f"reset {count + increment} of at most {limit}"
        else:
            detail = f"not counted toward the retry limit ({count} of {limit} used)"
        text = (
            f"Resetting after {reason}: {message} ({detail})"
            if message
            else f"Resetting after {reason} ({detail})"
        )
        self._transition(Phase.RESETTING, text, reason=reason, nodes=nodes)
        self._announce(LifecycleEventType.RESET_STARTED, reason=reason, message=message, nodes=nodes)
        if reason == Reason.FOUND_FAILED_PODS:
            self._exclude_nodes(nodes)

    def _retry_by_class(self, verdict: Verdict, reason: str, message: str, nodes: tuple[str, ...]) -> None:
        """The retry budget of a classified failure (docs/failures.md, "The retry budget")."""
        failure = (verdict.failure_class, verdict.failure_code)
        count = resetting_count(self.status)
        transient = transient_retry_count(self.status)
        decision = decide_retry(
            FailureClass(verdict.failure_class),
            resetting_count=count,
            retry_limit=self.params.retry_limit,
            transient_count=transient,
            transient_limit=self.transient_limit,
        )
        if decision.action is RetryAction.FAIL:
            # Past the retry limit, said as upstream says it (and as a verdict without a class).
            why = (
                decision.message
                if decision.counted or verdict.failure_class == FailureClass.PERMANENT
                else decision.message.replace(
                    f"retry limit ({self.params.retry_limit}) reached",
                    f"the retry limit of {self.params.retry_limit} is reached",
                )
            )
            text = f"{reason}: {message}; {why}" if message else f"{reason}; {why}"
            self._fail(reason, text, nodes, failure=failure)
            return
        # Every reset begins a new attempt, whatever its class; written with the Resetting status.
        self.status["attempt"] = next_attempt(self.status)
        if decision.counted:
            self.status["resettingCount"] = count + 1
        elif verdict.counts_toward_retry:
            # Not counted toward retryLimit, but toward the transient limit, in the same write
            # as the Resetting status: a crash can neither lose nor repeat it.
            self.status[TRANSIENT_RETRY_COUNT] = transient + 1
        # (An Autopilot migration, counts_toward_retry False, is counted by neither.)
        self.reset_started = True
        text = (
            f"Resetting after {reason}: {message} ({decision.message})"
            if message
            else f"Resetting after {reason} ({decision.message})"
        )
        self._transition(Phase.RESETTING, text, reason=reason, nodes=nodes, failure=failure)
        self._announce(
            LifecycleEventType.RESET_STARTED, reason=reason, message=message, nodes=nodes, failure=failure
        )
        if reason == Reason.FOUND_FAILED_PODS:
            # The nodes the verdict blames: none for an application fault.
            self._exclude_nodes(nodes)

    def _exclude_nodes(self, failed: tuple[str, ...]) -> None:
        """Node exclusion on retry: keep the next attempt off the nodes where pods just failed.

        Only after failed pods: an Autopilot migration (another reason) needs no record, the
        anti-affinity hook already keeps pods off the nodes Autopilot flags.
        """
        if self.exclusion is None or not failed or self.observed.nodes is None:
            return
        recorded = exclude_on_reset(
            self.aw, failed_nodes=failed, nodes=self.observed.nodes, limit=self.exclusion.max_nodes
        )
        if recorded is not None:
            self.actions.extend(recorded)

    # ---------------------------------------------------------------- phases
    # Each handler returns True when it changed the phase (so the next handler runs at once).

    def _empty(self) -> bool:
        try:
            self.status["componentStatus"] = [self._fresh_entry(i) for i in range(len(self.components))]
        except ValueError as exc:
            # The CRD's validation should make this impossible; if it happens, no retry can help.
            message = f"error creating components: cannot determine pod sets: {exc}"
            self._unhealthy(Reason.CREATE_FAILED, message)
            self._fail(Reason.CREATE_FAILED, message)
            return True
        self._transition(
            Phase.SUSPENDED,
            f"Recorded the pod sets of {len(self.components)} components; waiting for admission",
        )
        return True

    def _suspended(self) -> bool:
        if self.suspend:
            return False
        try:
            self._entries()
        except ValueError as exc:
            message = f"error creating components: cannot determine pod sets: {exc}"
            self._unhealthy(Reason.CREATE_FAILED, message)
            self._fail(Reason.CREATE_FAILED, message)
            return True
        if not self.has_finalizer:
            self.finalizer = FinalizerChange.ADD
        self._set(ConditionType.QUOTA_RESERVED, ConditionStatus.TRUE, Reason.RESUMING, MSG_SUSPEND_FALSE)
        self._set(ConditionType.RESOURCES_DEPLOYED, ConditionStatus.TRUE, Reason.RESUMING, MSG_SUSPEND_FALSE)
        self._set(ConditionType.PODS_READY, ConditionStatus.FALSE, Reason.RESUMING, MSG_SUSPEND_FALSE)
        self._set(ConditionType.UNHEALTHY, ConditionStatus.FALSE, Reason.RESUMING, MSG_SUSPEND_FALSE)
        self.new_attempt = True
        self._transition(Phase.RESUMING, f"{MSG_SUSPEND_FALSE}; creating {len(self.components)} components")
        return True

    def _resuming(self) -> bool:
        if self.suspend:
            self._suspend_from(Phase.RESUMING)
            return True
        try:
            entries = self._entries()
        except ValueError as exc:
            entries, early = [], f"cannot determine pod sets: {exc}"
        else:
            early = ""
        # Outcomes belong to the creates of the previous plan, which was made in Resuming; after
        # a reset within this call they would describe an earlier attempt, and so would what
        # was observed.
        current_attempt = self.start_phase == Phase.RESUMING and not self.new_attempt
        outcomes = self.observed.created if current_attempt else {}
        fatal: list[str] = [early] if early else []
        errors: list[str] = []
        creates: list[CreateComponent] = []
        uid = str(self.meta.get("uid", ""))
        started = attempt_start(self.status)
        hooks = (*self.hooks, attempt_hook(uid, attempt_of(self.status), _first_pod_sets(entries)))
        for index, entry in enumerate(entries[: len(self.components)]):
            conditions = entry.get("conditions") or []
            current = condition_status(conditions, ConditionType.RESOURCES_DEPLOYED)
            if current == ConditionStatus.TRUE:
                continue
            recorded = find_condition(conditions, ConditionType.RESOURCES_DEPLOYED) is not None
            if recorded and not current_attempt:
                # The attempt begins in this call, so none of its creates has been issued: a
                # CreationInitiated or CreationErrored record here is an earlier attempt's, whose
                # resources the deletion that ended it removed. (A component created under a
                # generated name that was never learned keeps such a record through that
                # deletion, which marks only named components deleted.) Read as this attempt's,
                # it would make the component wait until "it can be told whether it was already
                # created", which nothing observed in this call can tell; with no admission grace
                # that is an immediate counted reset, on every attempt, until the retry limit
                # fails the AppWrapper. Dropped instead: the component is created, and its
                # CreationInitiated recorded afresh, as in a first attempt.
                conditions = [
                    c
                    for c in conditions
                    if not (isinstance(c, Mapping) and c.get("type") == ConditionType.RESOURCES_DEPLOYED)
                ]
                entry["conditions"] = conditions
                current = None
            seen = self.observed.component(index) if current_attempt else ObservedComponent()
            described = f"{entry.get('kind', '?')} {entry.get('name') or seen.name or '<generated>'}"
            outcome = outcomes.get(index)
            if outcome is not None:
                if outcome.succeeded:
                    if outcome.name:
                        entry["name"] = outcome.name
                    self._set_component(entry, ConditionStatus.TRUE, ComponentReason.CREATED_SUCCESSFULLY)
                    continue
                if outcome.fatal and not outcome.controlled_by_us:
                    text = f"resource {described} exists, but is not controlled by appwrapper"
                else:
                    text = f"{described}: {outcome.message or outcome.result}"
                self._set_component(entry, ConditionStatus.FALSE, ComponentReason.CREATION_ERRORED, text)
                (fatal if outcome.fatal else errors).append(text)
                continue
            attempted = current == ConditionStatus.UNKNOWN or (
                current == ConditionStatus.FALSE
                and _component_reason(conditions) == ComponentReason.CREATION_ERRORED
            )
            if attempted and seen.presence is Presence.PRESENT and seen.controlled_by_us:
                # Created by an earlier attempt at this plan whose outcome was never recorded (a
                # crash, a status write that lost to another, a create that timed out but took
                # effect); under a generated name it is found by its respawn.dev/component
                # annotation. Adopted, never created a second time.
                if seen.name:
                    entry["name"] = seen.name
                self._set_component(entry, ConditionStatus.TRUE, ComponentReason.CREATED_SUCCESSFULLY)
                continue
            if attempted and not entry.get("name") and seen.presence is not Presence.ABSENT:
                # Created under a generated name that was never recorded, and not looked for
                # successfully (the search failed, or nothing was read): creating again could make
                # a second one. Wait, as for any create error, until it can be found or not.
                errors.append(f"{described}: cannot tell yet whether it was already created")
                continue
            try:
                body = render_component(
                    self.aw,
                    index,
                    pod_sets=_pod_sets(entry),
                    hooks=hooks,
                    annotations={COMPONENT_ANNOTATION: component_identity(uid, started, index)},
                    now=self.now,
                )
            except (TemplateError, ValueError) as exc:
                fatal.append(str(exc))
                continue
            if current is None or _component_reason(conditions) == ComponentReason.DELETED:
                # Recorded before the create call, so that a crash right after it still leaves a
                # trace that this object may exist and must be deleted. (A retry after an error
                # keeps its ComponentCreationErrored condition, which deletion also heeds.)
                name = as_mapping(body.get("metadata")).get("name")
                entry["name"] = name if isinstance(name, str) else ""
                self._set_component(entry, ConditionStatus.UNKNOWN, ComponentReason.CREATION_INITIATED)
            creates.append(CreateComponent(index=index, body=body))
        self.status["componentStatus"] = entries

        if fatal:
            message = "error creating components: " + "; ".join(fatal)
            self._unhealthy(Reason.CREATE_FAILED, message)
            self._fail(Reason.CREATE_FAILED, message)
            return True
        if errors:
            deadline = self._since(ConditionType.RESOURCES_DEPLOYED) + self.params.admission_grace
            if self.now < deadline:
                self._requeue(min(self.now + CREATE_RETRY_INTERVAL, deadline))
                return False
            message = "error creating components: " + "; ".join(errors)
            self._unhealthy(Reason.CREATE_FAILED, message)
            self._reset_or_fail(terminal=False, increment=1, reason=Reason.CREATE_FAILED, message=message)
            return True
        if creates:
            self.actions.extend(creates)
            return False
        self._transition(Phase.RUNNING, f"All {len(self.components)} components created")
        return True

    def _running(self) -> bool:
        if self.suspend:
            self._suspend_from(Phase.RUNNING)
            return True
        entries = self.status.get("componentStatus")
        entries = entries if isinstance(entries, list) else []
        expected = len(entries)
        # Components created by the previous plan may have been observed before their creation
        # (or through a lagging cache); their create outcome is the fresher truth.
        just_created = (
            set(self.observed.created)
            if self.start_phase == Phase.RESUMING and not self.new_attempt
            else set()
        )
        missing = sum(
            1
            for index in range(expected)
            if index not in just_created
            and self.observed.component(index).presence in (Presence.ABSENT, Presence.DELETING)
        )
        if missing:
            # A wrapped resource deleted by someone else: no controller will bring it back, so
            # the AppWrapper fails at once, whatever the retry limit.
            message = f"Only found {expected - missing} deployed components, but was expecting {expected}"
            self._unhealthy(Reason.MISSING_COMPONENT, message)
            self._fail(Reason.MISSING_COMPONENT, message)
            return True
        if self.verdict is not None and self.verdict_use is None:
            relation = verdict_relation(self.meta, self.status, self.verdict)
            if relation is VerdictRelation.STALE:
                self.verdict_use = VerdictUse.SETTLED
            elif relation is VerdictRelation.AHEAD:
                self.verdict_use = VerdictUse.HELD
            elif self._apply_verdict(self.verdict):
                return True
        self._pods_ready()
        return False

    def _apply_verdict(self, verdict: Verdict) -> bool:
        """Act on a current verdict in Running; True when the phase changed."""
        if verdict.state == "Succeeded":
            self.verdict_use = VerdictUse.APPLIED
            succeeded = (
                # An unconfirmed "none" (the pod cache's) says nothing of how many succeeded.
                self.observed.count_pods()[2]
                if self.observed.pods_gone_known is not None
                else self._expected_pods()
            )
            message = f"{succeeded} pods succeeded and no running, pending, or failed pods"
            if verdict.message and completion_policy(as_mapping(self.meta.get("annotations")))[0] is not None:
                # Success by a completion policy: other pods may still run; health's message says why.
                message = verdict.message
            self._set(ConditionType.QUOTA_RESERVED, ConditionStatus.FALSE, Reason.SUCCEEDED, message)
            self._set(ConditionType.RESOURCES_DEPLOYED, ConditionStatus.TRUE, Reason.SUCCEEDED, message)
            self._transition(Phase.SUCCEEDED, message, reason=verdict.reason or Reason.SUCCEEDED)
            return True
        if verdict.state == "Unhealthy":
            self.verdict_use = VerdictUse.APPLIED
            reason = verdict.reason or Reason.FOUND_FAILED_PODS
            # The retry pause is measured from when the workload was first seen unhealthy (as
            # upstream, whose Unhealthy condition turns True at the start of the failure grace
            # period), bounded by now and by the start of this attempt.
            marked = self.now
            if verdict.first_unhealthy_at is not None:
                marked = min(as_utc(verdict.first_unhealthy_at), self.now)
                start = transition_time(self.conditions, ConditionType.RESOURCES_DEPLOYED)
                if start is not None:
                    marked = max(marked, start)
            message = _with_class(verdict)
            self._unhealthy(reason, message, transition_at=marked)
            nodes = tuple(verdict.nodes)
            failure = (verdict.failure_class, verdict.failure_code)
            if reason == Reason.MISSING_COMPONENT:
                self._fail(reason, message, nodes, failure=failure)
            elif verdict.failure_class in _CLASSES:
                self._retry_by_class(verdict, reason, message, nodes)
            else:
                # A verdict without a class (an older health, or not about failed pods).
                self._reset_or_fail(
                    terminal=verdict.terminal,
                    increment=1 if verdict.counts_toward_retry else 0,
                    reason=reason,
                    message=message,
                    nodes=nodes,
                )
            return True
        if verdict.state == "Healthy" and self._is_true(ConditionType.UNHEALTHY):
            self.verdict_use = VerdictUse.APPLIED
            self._clear(ConditionType.UNHEALTHY, Reason.FOUND_NO_FAILED_PODS)
            return False
        self.verdict_use = VerdictUse.SETTLED
        return False

    def _expected_pods(self) -> int:
        # Only well-formed parts go to the counter: its contract is ValueError for a malformed
        # pod set, and a spec or status edited past validation may hold anything.
        entries = self.status.get("componentStatus")
        recorded = [
            {"podSets": e["podSets"]}
            for e in (entries if isinstance(entries, list) else [])
            if isinstance(e, Mapping) and isinstance(e.get("podSets"), list)
        ]
        components = [c for c in self.components if isinstance(c, Mapping)]
        try:
            return expected_pod_count(
                {"spec": {"components": components}, "status": {"componentStatus": recorded}}
            )
        except (ValueError, TypeError):
            return 0

    def _pods_ready(self) -> None:
        if self.observed.pods is None:
            return
        pending, running, succeeded, _failed = self.observed.count_pods()
        if running + succeeded >= self._expected_pods():
            self._set(
                ConditionType.PODS_READY,
                ConditionStatus.TRUE,
                Reason.SUFFICIENT_PODS_READY,
                f"{running} pods running; {succeeded} pods succeeded",
            )
        else:
            self._clear(
                ConditionType.PODS_READY,
                Reason.INSUFFICIENT_PODS_READY,
                f"{pending} pods pending; {running} pods running; {succeeded} pods succeeded",
            )

    def _resetting(self) -> bool:
        if self.suspend:
            # Suspending trumps Resetting: Kueue wants the quota back.
            self._suspend_from(Phase.RESETTING)
            return True
        self._clear(ConditionType.PODS_READY, Reason.RESETTING)
        if self._is_true(ConditionType.RESOURCES_DEPLOYED):
            if not self._delete_step():
                return False
            self._set(
                ConditionType.RESOURCES_DEPLOYED,
                ConditionStatus.FALSE,
                Reason.RESETTING,
                MSG_RESOURCES_DELETED_RESETTING,
            )
        # Measured from when the workload was marked unhealthy, not from when deletion ended.
        if self._is_true(ConditionType.UNHEALTHY):
            marked = self._since(ConditionType.UNHEALTHY)
        else:
            marked = self._since(ConditionType.RESOURCES_DEPLOYED)
        deadline = marked + retry_pause(self.params, str(self.meta.get("uid", "")), attempt_of(self.status))
        # Never recreate the components the moment the old ones are gone, whatever the pause:
        # controllers that work from a cache (the Kubeflow training operator) lag behind the
        # deletion by up to a second or so under load, and can still act on the deleted object
        # (creating pods owned by it, which the garbage collector then deletes under the new
        # attempt's names) when a namesake is created that soon. Counted from ResourcesDeployed
        # turning False, i.e. from when the last pod and component were seen gone.
        deadline = max(deadline, self._since(ConditionType.RESOURCES_DEPLOYED) + self.params.recreate_delay)
        if self.now < deadline or self.reset_started:
            # A reset begun in this call ends in a later one, whatever the clocks say (a status
            # that entered Resetting with nothing deployed would otherwise start the next attempt
            # in the same breath): the Resetting status, with its count, is written first.
            self._requeue(max(deadline, self.now))
            return False
        self._set(ConditionType.RESOURCES_DEPLOYED, ConditionStatus.TRUE, Reason.RESUMING, MSG_RESET_COMPLETE)
        # Cleared here (upstream leaves it True until a healthy check) so that the next incident
        # starts its own clock: the retry pause is measured from Unhealthy turning True.
        self._set(ConditionType.UNHEALTHY, ConditionStatus.FALSE, Reason.RESUMING, MSG_RESET_COMPLETE)
        attempt = resetting_count(self.status)
        self.new_attempt = True
        self._transition(Phase.RESUMING, f"{MSG_RESET_COMPLETE} (after reset {attempt})")
        self._announce(LifecycleEventType.RESET_FINISHED, message=MSG_RESET_COMPLETE)
        return True

    def _suspending(self) -> bool:
        # Runs to completion whatever spec.suspend says now: half-deleted workloads are not resumed.
        if self._is_true(ConditionType.RESOURCES_DEPLOYED):
            if not self._delete_step():
                return False
            self._set(
                ConditionType.RESOURCES_DEPLOYED, ConditionStatus.FALSE, Reason.SUSPENDED, MSG_SUSPEND_TRUE
            )
        self._set(ConditionType.QUOTA_RESERVED, ConditionStatus.FALSE, Reason.SUSPENDED, MSG_SUSPEND_TRUE)
        self._clear(ConditionType.PODS_READY, Reason.SUSPENDED)
        self._clear(ConditionType.UNHEALTHY, Reason.SUSPENDED)
        self._transition(Phase.SUSPENDED, "All resources deleted; quota released")
        return True

    def _stop(self) -> None:
        """The user asked for the workload to stop: Failed (reason Stopped) from any phase that
        is not finished, and no retry; staged deletion follows in _failed, without the
        deletion-on-failure pause (a stop asks for the resources back)."""
        if self.phase in (Phase.FAILED, Phase.SUCCEEDED):
            return
        if self.phase == Phase.EMPTY:
            # Recorded as for any new AppWrapper, so the status says what it would have deployed.
            with contextlib.suppress(ValueError):
                self.status["componentStatus"] = [self._fresh_entry(i) for i in range(len(self.components))]
        self._fail(Reason.STOPPED, f"Stopped: the AppWrapper has the annotation {STOP_ANNOTATION}=true")

    def _failed(self) -> bool:
        if self._is_true(ConditionType.RESOURCES_DEPLOYED):
            delay = timedelta(0) if self.stopping else self.params.deletion_on_failure_grace
            # Once deletion has begun it is never paused again (re-pausing would restart the
            # window with every step).
            if (
                delay > timedelta(0)
                and not self.suspend
                and not self._is_true(ConditionType.DELETING_RESOURCES)
            ):
                self._set(
                    ConditionType.DELETING_RESOURCES,
                    ConditionStatus.FALSE,
                    Reason.DELETION_PAUSED,
                    self._paused_message(),
                )
                deadline = self._since(ConditionType.DELETING_RESOURCES) + delay
                if self.now < deadline:
                    self._requeue(deadline)
                    return False
            if not self._delete_step():
                return False
            message = (
                MSG_KUEUE_FORCED_DELETION
                if delay > timedelta(0) and self.suspend
                else MSG_RESOURCES_DELETED_FAILED
            )
            self._set(ConditionType.RESOURCES_DEPLOYED, ConditionStatus.FALSE, Reason.FAILED, message)
        self._set(
            ConditionType.QUOTA_RESERVED, ConditionStatus.FALSE, Reason.FAILED, MSG_NO_RESOURCES_DEPLOYED
        )
        return False

    def _succeeded(self) -> bool:
        if not self._is_true(ConditionType.RESOURCES_DEPLOYED):
            return False
        # The TTL runs from success, i.e. from QuotaReserved turning False on entering Succeeded
        # (upstream measures from ResourcesDeployed, i.e. deployment; the documented behaviour
        # is "after the AppWrapper entered the Succeeded state").
        if condition_status(self.conditions, ConditionType.QUOTA_RESERVED) == ConditionStatus.FALSE:
            since = self._since(ConditionType.QUOTA_RESERVED)
        else:
            since = self._since(ConditionType.RESOURCES_DEPLOYED)
        ttl = self.params.success_ttl
        # A stop asks for the resources back now, not when the time to live runs out; so does a
        # completion policy met while pods still run (servers beside a launcher that succeeded:
        # nothing would ever stop them). Once begun (DeletingResources True), deletion goes on.
        early = (
            self.stopping or self._is_true(ConditionType.DELETING_RESOURCES) or self._completed_by_policy()
        )
        if self.now < since + ttl and not early:
            self._requeue(since + ttl)
            return False
        if not self._delete_step():
            return False
        self._set(
            ConditionType.RESOURCES_DEPLOYED,
            ConditionStatus.FALSE,
            Reason.SUCCEEDED,
            f"Time to live after success of {format_go_duration(ttl)} expired",
        )
        return False

    def _completed_by_policy(self) -> bool:
        """Succeeded by a completion policy while pods of the workload are still pending or running."""
        annotations = as_mapping(self.meta.get("annotations"))
        policy, _ = completion_policy(annotations)
        if policy is None or self.observed.pods is None:
            return False
        return any(p.phase in ("Pending", "Running") and not p.terminating for p in self.observed.pods)

    def _terminate(self) -> None:
        """The AppWrapper is being deleted: remove everything, then let it go."""
        if self._is_true(ConditionType.RESOURCES_DEPLOYED):
            if self.phase != Phase.TERMINATING:
                self._transition(Phase.TERMINATING, "AppWrapper deleted; deleting its resources")
            if not self._delete_step():
                return
            self._set(
                ConditionType.RESOURCES_DEPLOYED,
                ConditionStatus.FALSE,
                Reason.TERMINATING,
                MSG_RESOURCES_DELETED,
            )
        if self._is_true(ConditionType.QUOTA_RESERVED):
            self._set(
                ConditionType.QUOTA_RESERVED,
                ConditionStatus.FALSE,
                Reason.TERMINATING,
                MSG_NO_RESOURCES_DEPLOYED,
            )
        self.finalizer = FinalizerChange.REMOVE


_CLASSES: Final = frozenset(str(c) for c in FailureClass)


def _with_class(verdict: Verdict) -> str:
    """The verdict's message, naming its failure class and code if it does not already."""
    message = verdict.message
    if verdict.failure_class not in _CLASSES:
        return message
    named = f"{verdict.failure_class} ({verdict.failure_code})"
    if named in message:
        return message
    return f"{message}; {named}" if message else named


def _pod_sets(entry: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    pod_sets = entry.get("podSets")
    if isinstance(pod_sets, list) and all(isinstance(p, Mapping) for p in pod_sets):
        return pod_sets
    return None


def _first_pod_sets(entries: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Component index -> the global index of its first pod set (pod sets numbered in order)."""
    first: dict[int, int] = {}
    total = 0
    for index, entry in enumerate(entries):
        first[index] = total
        total += len(_pod_sets(entry) or ())
    return first


def _component_reason(conditions: Sequence[Any]) -> str:
    for cond in conditions:
        if isinstance(cond, Mapping) and cond.get("type") == ConditionType.RESOURCES_DEPLOYED:
            reason = cond.get("reason")
            return reason if isinstance(reason, str) else ""
    return ""
