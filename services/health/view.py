"""What the health rules need to know about an AppWrapper, read defensively from its raw body.

The body comes from the bus and is untrusted input: a field of the wrong type or a missing
status must never make the rules raise, so nothing here validates the whole object (that is the
API server's and the webhook's job); each field is read on its own, and a problem that changes
the judgement becomes a warning on the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.appwrapper.constants import CONTROLLER_NAME, ConditionStatus, ConditionType
from shared.appwrapper.params import (
    EffectiveParams,
    ExitCodePolicy,
    effective_fault_tolerance,
    exit_code_policy,
)
from shared.appwrapper.podsets import expected_pod_count
from shared.faulttolerance import FaultTolerance
from shared.kubetime import parse_kube_time
from shared.messages import AppWrapperObservation, ObjectRef

__all__ = ["AppWrapperView", "view_of"]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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
    warnings: tuple[str, ...] = ()


def _attempt_started_at(conditions: Any) -> datetime | None:
    if not isinstance(conditions, list):
        return None
    for cond in conditions:
        cond = _mapping(cond)
        if cond.get("type") == ConditionType.RESOURCES_DEPLOYED:
            if cond.get("status") != ConditionStatus.TRUE:
                return None
            return parse_kube_time(cond.get("lastTransitionTime"))
    return None


def _components(component_status: Any) -> frozenset[tuple[str, str]]:
    if not isinstance(component_status, list):
        return frozenset()
    found = set()
    for entry in component_status:
        entry = _mapping(entry)
        kind, name = entry.get("kind"), entry.get("name")
        if isinstance(kind, str) and isinstance(name, str) and kind and name:
            found.add((kind, name))
    return frozenset(found)


def _string_map(value: Any) -> dict[str, str]:
    # Kubernetes guarantees string values; anything else is passed through so that the
    # parameter parser can report it instead of silently dropping it.
    return {str(k): v for k, v in _mapping(value).items()}


def view_of(observation: AppWrapperObservation, defaults: FaultTolerance) -> AppWrapperView:
    """Extract the health-relevant facts from an AppWrapper observation. Never raises."""
    body = observation.body
    metadata = _mapping(body.get("metadata"))
    spec = _mapping(body.get("spec"))
    status = _mapping(body.get("status"))

    uid = observation.ref.uid or str(metadata.get("uid") or "")
    ref = ObjectRef(namespace=observation.ref.namespace, name=observation.ref.name, uid=uid)
    annotations = _string_map(metadata.get("annotations"))
    params = effective_fault_tolerance(annotations, defaults)
    exit_codes = exit_code_policy(annotations)
    warnings = [*params.warnings, *exit_codes.warnings]

    expected: int | None
    try:
        expected = expected_pod_count(body)
    except Exception as exc:  # a malformed body must not stop the other rules
        expected = None
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        warnings.append(f"cannot compute the expected pod count ({reason}); pod-count checks are skipped")

    managed_by = spec.get("managedBy")
    return AppWrapperView(
        ref=ref,
        deleted=observation.deleted,
        phase=str(status.get("phase") or ""),
        suspend=spec.get("suspend") is True,
        deleting=metadata.get("deletionTimestamp") is not None,
        managed_elsewhere=isinstance(managed_by, str) and managed_by != CONTROLLER_NAME,
        resetting_count=_int(status.get("resettingCount")),
        attempt_started_at=_attempt_started_at(status.get("conditions")),
        components=_components(status.get("componentStatus")),
        expected_pods=expected,
        params=params,
        exit_codes=exit_codes,
        warnings=tuple(warnings),
    )
