"""What the health rules need to know about an AppWrapper, read defensively from its raw body.

The body comes from the bus and is untrusted input: a field of the wrong type or a missing
status must never make the rules raise, so nothing here validates the whole object (that is the
API server's and the webhook's job); each field is read on its own, and a problem that changes
the judgement becomes a warning on the verdict. The fields are read by
:func:`shared.appwrapper.model.read_appwrapper`, which never raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from shared.appwrapper.constants import CONTROLLER_NAME, ConditionStatus, ConditionType
from shared.appwrapper.control import CompletionPolicy, completion_policy
from shared.appwrapper.model import AppWrapperFields, read_appwrapper, str_at
from shared.appwrapper.params import (
    EffectiveParams,
    ExitCodePolicy,
    effective_fault_tolerance,
    exit_code_policy,
)
from shared.appwrapper.podsets import expected_pod_count
from shared.failures.annotation import workload_patterns
from shared.failures.patterns import FailurePattern
from shared.faulttolerance import FaultTolerance
from shared.kubetime import parse_kube_time
from shared.messages import AppWrapperObservation, ObjectRef
from shared.stalls import HEARTBEAT_ANNOTATION, HEARTBEAT_LIMIT, StallDefaults, StallPolicy, stall_policy

__all__ = ["AppWrapperView", "view_of"]


@dataclass(frozen=True, slots=True)
class AppWrapperView:
    ref: ObjectRef
    deleted: bool = False
    phase: str = ""
    suspend: bool = False
    # metadata.deletionTimestamp is set: the AppWrapper is being torn down, not judged.
    deleting: bool = False
    # spec.managedBy names another controller (MultiKueue): hands off, as upstream.
    managed_elsewhere: bool = False
    resetting_count: int = 0
    # lastTransitionTime of ResourcesDeployed=True: when the current attempt's resources were
    # deployed. Upstream starts the admission and warmup clocks here; Respawn also uses it to
    # tell this attempt's pods from the previous one's.
    attempt_started_at: datetime | None = None
    # (kind, name) of every wrapped resource recorded in status.componentStatus.
    components: frozenset[tuple[str, str]] = frozenset()
    # None when it cannot be computed; the pod-count rules are then skipped (with a warning).
    expected_pods: int | None = None
    params: EffectiveParams = field(default_factory=lambda: EffectiveParams(ft=FaultTolerance()))
    exit_codes: ExitCodePolicy = field(default_factory=ExitCodePolicy)
    # The respawn.dev/completion-policy annotation; None: the default (all succeed, one fails).
    completion: CompletionPolicy | None = None
    # The workload's own failure patterns (respawn.dev/failure-patterns); none when refused.
    failure_patterns: tuple[FailurePattern, ...] = ()
    warnings: tuple[str, ...] = ()
    # Restart storms and the progress heartbeat (shared.stalls): respawn.dev/restart-storm and
    # respawn.dev/heartbeat-timeout over the operator's defaults.
    stalls: StallPolicy = field(default_factory=StallPolicy)
    # The AppWrapper's own respawn.dev/heartbeat as written, and the observation time at which
    # this value was first seen (the state carries it over while the value stays the same).
    heartbeat: str = ""
    heartbeat_seen_at: datetime | None = None


def _components(fields: AppWrapperFields) -> frozenset[tuple[str, str]]:
    found = set()
    for entry in fields.component_status:
        kind, name = str_at(entry, "kind"), str_at(entry, "name")
        if kind and name:
            found.add((kind, name))
    return frozenset(found)


def view_of(
    observation: AppWrapperObservation, defaults: FaultTolerance, stall_defaults: StallDefaults | None = None
) -> AppWrapperView:
    """Extract the health-relevant facts from an AppWrapper observation. Never raises."""
    body = observation.body
    fields = read_appwrapper(body)
    ref = ObjectRef(
        namespace=observation.ref.namespace, name=observation.ref.name, uid=observation.ref.uid or fields.uid
    )
    params = effective_fault_tolerance(fields.annotations, defaults)
    exit_codes = exit_code_policy(fields.annotations)
    completion, completion_warning = completion_policy(fields.annotations)
    stalls = stall_policy(
        fields.annotations, stall_defaults or StallDefaults(), params.ft.grace_period_maximum
    )
    warnings = [
        *params.warnings,
        *exit_codes.warnings,
        *([completion_warning] if completion_warning else []),
        *stalls.warnings,
    ]
    heartbeat = fields.annotations.get(HEARTBEAT_ANNOTATION)
    patterns = workload_patterns(fields.annotations)
    if patterns.error:
        # Refused as a whole: the operator's table classifies this workload's failures.
        warnings.append(patterns.error)

    expected: int | None
    try:
        expected = expected_pod_count(body)
    except Exception as exc:  # a malformed body must not stop the other rules
        expected = None
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        warnings.append(f"cannot compute the expected pod count ({reason}); pod-count checks are skipped")

    deployed = fields.condition(ConditionType.RESOURCES_DEPLOYED)
    return AppWrapperView(
        ref=ref,
        deleted=observation.deleted,
        phase=fields.phase,
        suspend=fields.suspend,
        deleting=fields.deleting,
        managed_elsewhere=fields.managed_by is not None and fields.managed_by != CONTROLLER_NAME,
        resetting_count=fields.resetting_count,
        attempt_started_at=(
            parse_kube_time(deployed.get("lastTransitionTime"))
            if deployed.get("status") == ConditionStatus.TRUE
            else None
        ),
        components=_components(fields),
        expected_pods=expected,
        params=params,
        exit_codes=exit_codes,
        completion=completion,
        failure_patterns=patterns.patterns,
        warnings=tuple(warnings),
        stalls=stalls,
        heartbeat=heartbeat[:HEARTBEAT_LIMIT] if isinstance(heartbeat, str) else "",
        heartbeat_seen_at=observation.observed_at,
    )
