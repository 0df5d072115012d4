"""Fuzzing what lifecycle reads from an AppWrapper: no value, however malformed, raises out of its
decisions, and every value it cannot use is named (for an Event to its owner) or ends in a
condition that says what is wrong.

Two kinds of input: anything JSON can hold, anywhere (as a status edited by hand, an object
written past validation, an older CRD would give); and a valid AppWrapper with one value made
bad at a place lifecycle reads.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.lifecycle import announcements, validation
from services.lifecycle.machine import needs_attention, reconcile
from services.lifecycle.observed import Observed, ObservedComponent, ObservedPod, Presence
from shared.appwrapper.constants import ANNOUNCED_ANNOTATION, ConditionType, Phase
from shared.appwrapper.params import (
    ADMISSION_GRACE_PERIOD_ANNOTATION,
    DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION,
    FAILURE_GRACE_PERIOD_ANNOTATION,
    FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION,
    RETRY_LIMIT_ANNOTATION,
    RETRY_PAUSE_PERIOD_ANNOTATION,
    SUCCESS_TTL_ANNOTATION,
    WARMUP_GRACE_PERIOD_ANNOTATION,
)
from shared.faulttolerance import FaultTolerance
from tests.unit.test_lifecycle_machine import T0, appwrapper, running, verdict

DEFAULTS = FaultTolerance()
PARAM_ANNOTATIONS = [
    ADMISSION_GRACE_PERIOD_ANNOTATION,
    WARMUP_GRACE_PERIOD_ANNOTATION,
    FAILURE_GRACE_PERIOD_ANNOTATION,
    RETRY_PAUSE_PERIOD_ANNOTATION,
    FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION,
    DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION,
    SUCCESS_TTL_ANNOTATION,
    RETRY_LIMIT_ANNOTATION,
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "2025-03-01T12:00:00Z", "Running"])
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)
times = (
    st.sampled_from(["2025-03-01T11:59:00Z", "2025-03-01T12:00:00Z", "9999-12-31T23:59:59Z"]) | json_values
)
condition = st.fixed_dictionaries(
    {
        "type": st.sampled_from([*map(str, ConditionType), "Other"]) | json_values,
        "status": st.sampled_from(["True", "False", "Unknown"]) | json_values,
        "reason": st.sampled_from(["Resuming", "DeletionInitiated"]) | json_values,
        "message": st.sampled_from(["", "Forceful deletion (grace period 0): x"]) | json_values,
        "lastTransitionTime": times,
    }
)
statuses = st.fixed_dictionaries(
    {},
    optional={
        "phase": st.sampled_from([*map(str, Phase), "Bogus"]) | json_values,
        "conditions": st.lists(condition | json_values, max_size=5) | json_values,
        "resettingCount": st.integers(min_value=-3, max_value=5) | json_values,
        "componentStatus": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": st.text(max_size=5) | json_values,
                    "kind": st.just("Job"),
                    "apiVersion": st.just("batch/v1"),
                    "podSets": json_values,
                    "conditions": st.lists(condition, max_size=2) | json_values,
                },
            )
            | json_values,
            max_size=3,
        )
        | json_values,
    },
)
metadata = st.fixed_dictionaries(
    {},
    optional={
        "name": st.just("aw") | json_values,
        "namespace": st.just("team") | json_values,
        "uid": st.just("uid-1") | json_values,
        "generation": st.integers(min_value=0, max_value=3) | json_values,
        "resourceVersion": st.just("1") | json_values,
        "finalizers": st.just(["workload.codeflare.dev/finalizer"]) | json_values,
        "deletionTimestamp": st.just("2025-03-01T11:00:00Z") | json_values,
        "creationTimestamp": times,
        "annotations": st.dictionaries(
            st.sampled_from([*PARAM_ANNOTATIONS, ANNOUNCED_ANNOTATION]), json_values
        )
        | json_values,
        "managedFields": json_values,
    },
)


@st.composite
def specs(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return draw(json_values)
    components = draw(
        st.lists(
            st.just(copy.deepcopy(appwrapper()["spec"]["components"][0]))
            | st.fixed_dictionaries({"template": json_values})
            | json_values,
            max_size=2,
        )
        | json_values
    )
    return {"suspend": draw(st.booleans() | json_values), "components": components}


observations = st.builds(
    Observed,
    components=st.lists(
        st.builds(
            ObservedComponent,
            presence=st.sampled_from(list(Presence)),
            controlled_by_us=st.booleans(),
            name=st.sampled_from(["", "c0"]),
            uid=st.sampled_from(["", "u"]),
        ),
        max_size=2,
    ).map(tuple),
    pods=st.none()
    | st.lists(st.builds(ObservedPod, name=st.sampled_from(["p0", "p1"])), max_size=2).map(tuple),
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    meta=metadata | json_values,
    spec=specs(),
    status=statuses | json_values,
    observed=observations,
    seconds=st.integers(min_value=0, max_value=400),
    with_verdict=st.booleans(),
)
def test_no_appwrapper_value_raises_out_of_lifecycle_decisions(
    meta: Any, spec: Any, status: Any, observed: Observed, seconds: int, with_verdict: bool
) -> None:
    aw = {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": meta,
        "spec": spec,
    }
    if status is not None:
        aw["status"] = status
    now = T0 + timedelta(seconds=seconds)
    effective = validation.parameters(aw, DEFAULTS)
    found = validation.problems(aw, effective.warnings)
    assert all(p.message for p in found)
    v = verdict(at=now) if with_verdict else None
    plan = reconcile(aw, observed, v, effective.ft, now)
    needs_attention(aw, now)
    announcements.owed(aw, effective.ft.retry_limit, now)
    if plan.status is not None:
        # The new status (and the announcements derived from it) must read back as well.
        after = {**aw, "status": plan.status}
        reconcile(after, observed, None, effective.ft, now + timedelta(seconds=1))
        announcements.owed(after, effective.ft.retry_limit, now)


# ------------------------------------------------------------------ one bad value, named


def _set_condition_time(aw: dict[str, Any], value: Any) -> str:
    aw["status"]["conditions"][0]["lastTransitionTime"] = value
    return "status.conditions[0].lastTransitionTime"


def _set(path: tuple[str, ...], value: Any, aw: dict[str, Any]) -> str:
    target = aw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return ".".join(path)


BAD_PLACES = {
    "resettingCount": lambda aw, v: _set(("status", "resettingCount"), v, aw),
    "phase": lambda aw, v: _set(("status", "phase"), v, aw),
    "conditions": lambda aw, v: _set(("status", "conditions"), v, aw),
    "condition time": _set_condition_time,
    "componentStatus": lambda aw, v: _set(("status", "componentStatus"), v, aw),
    "components": lambda aw, v: _set(("spec", "components"), v, aw),
    "annotations": lambda aw, v: _set(("metadata", "annotations"), v, aw),
}


def _bad_for(place: str) -> st.SearchStrategy[Any]:
    """Values that are wrong at ``place`` (the schema's type or range, or the meaning)."""
    match place:
        case "resettingCount":
            return (
                st.integers(max_value=-1)
                | st.text()
                | st.floats(allow_nan=False)
                | st.booleans()
                | st.lists(st.integers())
            )
        case "phase":
            return (
                st.text().filter(lambda p: p not in {str(x) for x in Phase})
                | st.integers()
                | st.lists(st.text())
            )
        case "condition time":
            return (
                st.text().filter(lambda t: not t[:4].isdigit())
                | st.integers()
                | st.just("9999-12-31T23:59:59Z")
            )
        case "conditions" | "componentStatus" | "components":
            return (
                st.text()
                | st.integers()
                | st.dictionaries(st.text(max_size=3), st.text(max_size=3), min_size=1)
            )
        case _:
            return st.text() | st.integers() | st.lists(st.text(), min_size=1)


@st.composite
def one_bad_value(draw: st.DrawFn) -> tuple[str, Any]:
    place = draw(st.sampled_from(sorted(BAD_PLACES)))
    return place, draw(_bad_for(place))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad=one_bad_value(), seconds=st.integers(min_value=0, max_value=400))
def test_every_bad_value_is_named_for_the_owner(bad: tuple[str, Any], seconds: int) -> None:
    place, value = bad
    aw = running()
    field = BAD_PLACES[place](aw, value)
    now = T0 + timedelta(seconds=seconds)
    effective = validation.parameters(aw, DEFAULTS)
    plan = reconcile(aw, Observed(), None, effective.ft, now)
    found = validation.problems(aw, effective.warnings)
    assert any(p.field.startswith(field) for p in found), (field, found)
    assert plan.phase is not None


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(PARAM_ANNOTATIONS),
    value=st.text(max_size=12) | st.sampled_from(["-5s", "99999h", "-1"]),
)
def test_every_annotation_value_is_used_or_named(key: str, value: str) -> None:
    aw = running()
    aw["metadata"]["annotations"] = {key: value}
    effective = validation.parameters(aw, DEFAULTS)
    reconcile(aw, Observed(), None, effective.ft, T0)
    found = validation.problems(aw, effective.warnings)
    named = [p for p in found if key in p.message]
    # A value not used as given (unparseable, negative, beyond the maximum) is named with its key.
    assert bool(effective.warnings) == bool(named)
