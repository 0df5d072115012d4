"""What is wrong with an AppWrapper as lifecycle reads it, said in words its owner can act on.

The API server validates an AppWrapper against its schema, but not everything lifecycle reads
is covered by it: annotation values (grace periods, the retry limit), a status edited by hand,
and the fields of an object written with validation switched off or by an older CRD. None of
that may stop the service or go unnoticed. The machine reads every such value defensively (a
bad one counts as absent, see its module); this module names each bad value, so the service can
tell the AppWrapper's owner with a Warning Event (``InvalidValue``), once per value.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from services.lifecycle.conditions import parse_time
from shared.appwrapper.constants import Phase
from shared.appwrapper.model import as_mapping
from shared.appwrapper.params import EffectiveParams, effective_fault_tolerance
from shared.failures.annotation import transient_retry_limit
from shared.faulttolerance import FaultTolerance

__all__ = ["INVALID_VALUE_EVENT", "Problem", "parameters", "problems"]

# Reason of the Warning Event that names a value lifecycle could not use.
INVALID_VALUE_EVENT: Final = "InvalidValue"

_PHASES: Final = frozenset(str(p) for p in Phase)
# Longer values are cut in messages (an Event message is at most 1 KiB anyway).
_SHOWN: Final = 80


@dataclass(frozen=True, slots=True)
class Problem:
    # Where the value is (e.g. "status.resettingCount", an annotation key).
    field: str
    message: str


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def parameters(aw: Mapping[str, Any], defaults: FaultTolerance, transient_limit: int = 10) -> EffectiveParams:
    """The AppWrapper's effective fault-tolerance parameters (annotations over ``defaults``),
    with a warning for each annotation value that could not be used as given (the transient
    retry limit's too: the machine reads it from the annotation, over ``transient_limit``)."""
    annotations = as_mapping(aw.get("metadata")).get("annotations")
    if not isinstance(annotations, Mapping):
        return EffectiveParams(ft=defaults)
    try:
        effective = effective_fault_tolerance(annotations, defaults)
        transient = transient_retry_limit(annotations, transient_limit)
        if transient.warning:
            return EffectiveParams(ft=effective.ft, warnings=(*effective.warnings, transient.warning))
        return effective
    except Exception as exc:  # a value the parser did not foresee: the defaults, and say so
        return EffectiveParams(
            ft=defaults,
            warnings=(f"annotations could not be read ({type(exc).__name__}: {exc}); using defaults",),
        )


def problems(aw: Mapping[str, Any], param_warnings: tuple[str, ...] = ()) -> tuple[Problem, ...]:
    """Every value of ``aw`` lifecycle cannot use as it is, each with what it does instead."""
    found: list[Problem] = [Problem("metadata.annotations", w) for w in param_warnings]
    meta = aw.get("metadata")
    if not isinstance(meta, Mapping):
        return (*found, Problem("metadata", f"metadata is {_shown(meta)}, not an object"))
    annotations = meta.get("annotations")
    if annotations is not None and not isinstance(annotations, Mapping):
        found.append(Problem("metadata.annotations", "metadata.annotations is not an object; ignored"))
    found.extend(_spec_problems(aw.get("spec")))
    found.extend(_status_problems(aw.get("status")))
    return tuple(found)


def _spec_problems(spec: Any) -> list[Problem]:
    if spec is None:
        return [Problem("spec", "the AppWrapper has no spec")]
    if not isinstance(spec, Mapping):
        return [Problem("spec", f"spec is {_shown(spec)}, not an object")]
    out: list[Problem] = []
    suspend = spec.get("suspend")
    if suspend is not None and not isinstance(suspend, bool):
        out.append(
            Problem("spec.suspend", f"spec.suspend is {_shown(suspend)}, not a boolean; read as false")
        )
    components = spec.get("components")
    if not isinstance(components, list):
        out.append(Problem("spec.components", f"spec.components is {_shown(components)}, not a list"))
        return out
    for index, component in enumerate(components):
        where = f"spec.components[{index}]"
        if not isinstance(component, Mapping):
            out.append(Problem(where, f"{where} is {_shown(component)}, not an object"))
        elif not isinstance(component.get("template"), Mapping):
            out.append(Problem(f"{where}.template", f"{where}.template is not an object"))
    return out


def _status_problems(status: Any) -> list[Problem]:
    if status is None:
        return []
    if not isinstance(status, Mapping):
        return [Problem("status", f"status is {_shown(status)}, not an object; read as empty")]
    out: list[Problem] = []
    phase = status.get("phase", "")
    if not isinstance(phase, str) or phase not in _PHASES:
        out.append(
            Problem(
                "status.phase",
                f"status.phase {_shown(phase)} is not a phase lifecycle knows; the AppWrapper is left alone",
            )
        )
    count = status.get("resettingCount")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
        out.append(Problem("status.resettingCount", f"status.resettingCount is {_shown(count)}; read as 0"))
    conditions = status.get("conditions")
    if conditions is not None and not isinstance(conditions, list):
        out.append(Problem("status.conditions", "status.conditions is not a list; read as empty"))
    for index, cond in enumerate(conditions if isinstance(conditions, list) else []):
        out.extend(_condition_problems(f"status.conditions[{index}]", cond))
    entries = status.get("componentStatus")
    if entries is not None and not isinstance(entries, list):
        out.append(Problem("status.componentStatus", "status.componentStatus is not a list; recorded afresh"))
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        where = f"status.componentStatus[{index}]"
        if not isinstance(entry, Mapping):
            out.append(Problem(where, f"{where} is {_shown(entry)}, not an object; recorded afresh"))
            continue
        inner = entry.get("conditions")
        if inner is not None and not isinstance(inner, list):
            out.append(Problem(f"{where}.conditions", f"{where}.conditions is not a list; read as empty"))
        for j, cond in enumerate(inner if isinstance(inner, list) else []):
            out.extend(_condition_problems(f"{where}.conditions[{j}]", cond))
    return out


def _condition_problems(where: str, cond: Any) -> list[Problem]:
    if not isinstance(cond, Mapping):
        return [Problem(where, f"{where} is {_shown(cond)}, not an object; skipped")]
    if parse_time(cond.get("lastTransitionTime")) is None:
        return [
            Problem(
                f"{where}.lastTransitionTime",
                f"{where}.lastTransitionTime {_shown(cond.get('lastTransitionTime'))} is not a time; "
                "its clock starts now",
            )
        ]
    return []
