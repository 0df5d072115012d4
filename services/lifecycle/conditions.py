"""metav1.Condition helpers over raw JSON condition lists.

Every grace period and pause in the lifecycle is measured from a condition's
``lastTransitionTime``, so the one rule that matters here is upstream's
``meta.SetStatusCondition``: the transition time moves **only when the status changes**.
Rewriting the reason or message of a condition keeps its clock running.

The functions are pure: they take a sequence of condition objects and return a new list,
never touching their input, so decision code can build a new status from an old one freely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from services.lifecycle.copies import copy_json
from shared.appwrapper.constants import ConditionStatus
from shared.kubetime import as_utc, format_kube_time, parse_kube_time

__all__ = [
    "clear_condition",
    "condition_status",
    "find_condition",
    "is_true",
    "parse_time",
    "set_condition",
    "transition_time",
    "truncate",
]

Conditions = list[dict[str, Any]]


# Deadlines are computed by adding up to a day or so to a transition time; a time written by hand
# near the end of the calendar (year 9999) would make that addition overflow. Such a time is read
# as unreadable instead (its clock then starts once, now).
_LAST_YEAR: Final = 9000


def parse_time(value: Any) -> datetime | None:
    """A condition's time, None when absent, unreadable or beyond any plausible date."""
    parsed = parse_kube_time(value)
    if parsed is None or parsed.year >= _LAST_YEAR:
        return None
    return parsed


def truncate(value: datetime) -> datetime:
    """``value`` at whole-second precision, as it will read back after a round trip through the API."""
    return as_utc(value).replace(microsecond=0)


def _entries(conditions: Sequence[Any] | None) -> list[Mapping[str, Any]]:
    # A status written by hand (or by a buggy client) may hold non-objects; they are skipped
    # rather than trusted, so one bad entry cannot stop the lifecycle of the workload.
    return [c for c in (conditions or ()) if isinstance(c, Mapping)]


def find_condition(conditions: Sequence[Any] | None, ctype: str) -> Mapping[str, Any] | None:
    """The condition of type ``ctype``, or None."""
    for cond in _entries(conditions):
        if cond.get("type") == ctype:
            return cond
    return None


def condition_status(conditions: Sequence[Any] | None, ctype: str) -> str | None:
    """``True``/``False``/``Unknown`` for the condition of type ``ctype``, None when absent."""
    cond = find_condition(conditions, ctype)
    if cond is None:
        return None
    status = cond.get("status")
    return status if isinstance(status, str) else None


def is_true(conditions: Sequence[Any] | None, ctype: str) -> bool:
    return condition_status(conditions, ctype) == ConditionStatus.TRUE


def transition_time(conditions: Sequence[Any] | None, ctype: str) -> datetime | None:
    """When the condition of type ``ctype`` last changed status, or None when absent or unreadable."""
    cond = find_condition(conditions, ctype)
    return None if cond is None else parse_time(cond.get("lastTransitionTime"))


def set_condition(
    conditions: Sequence[Any] | None,
    *,
    ctype: str,
    status: str,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
    transition_at: datetime | None = None,
) -> Conditions:
    """A copy of ``conditions`` with the condition of type ``ctype`` set, as meta.SetStatusCondition.

    A new condition, or one whose status changes, gets ``lastTransitionTime`` = ``transition_at``
    (default ``now``). An unchanged status keeps its transition time; only an unreadable or
    missing one is replaced by ``now``, so that the clock it carries starts (once) instead of
    being unreadable forever. Reason, message and observedGeneration are always updated.
    """
    at = format_kube_time(transition_at if transition_at is not None else now)
    result: Conditions = []
    found = False
    for cond in _entries(conditions):
        entry = copy_json(dict(cond))
        if entry.get("type") == ctype and not found:
            found = True
            if entry.get("status") != status or parse_time(entry.get("lastTransitionTime")) is None:
                entry["lastTransitionTime"] = at
            entry["status"] = status
            entry["reason"] = reason
            entry["message"] = message
            _set_generation(entry, observed_generation)
        elif entry.get("type") == ctype:
            # A duplicate type cannot be written back (the list is a map keyed by type).
            continue
        result.append(entry)
    if not found:
        entry = {
            "type": ctype,
            "status": status,
            "lastTransitionTime": at,
            "reason": reason,
            "message": message,
        }
        _set_generation(entry, observed_generation)
        result.append(entry)
    return result


def _set_generation(entry: dict[str, Any], observed_generation: int | None) -> None:
    if observed_generation is not None:
        entry["observedGeneration"] = observed_generation


def clear_condition(
    conditions: Sequence[Any] | None,
    *,
    ctype: str,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
) -> Conditions:
    """Upstream's clearCondition: flip the condition to False only if it is currently True.

    A False, Unknown or absent condition is left exactly as it is (a plain copy is returned), so
    repeating a "clear" never rewrites a reason or message that explains an earlier state.
    """
    if not is_true(conditions, ctype):
        return [copy_json(dict(c)) for c in _entries(conditions)]
    return set_condition(
        conditions,
        ctype=ctype,
        status=ConditionStatus.FALSE,
        reason=reason,
        message=message,
        now=now,
        observed_generation=observed_generation,
    )
