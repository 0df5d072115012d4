"""Announcements as a pure function of the status: the transition a status records, what is owed,
and ids that are the same whether the plan sends an announcement or a later pass re-derives it."""

from __future__ import annotations

import copy
import re
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings

from services.lifecycle import announcements
from services.lifecycle.actions import Action, EmitEvent, PublishLifecycleEvent
from services.lifecycle.machine import needs_attention, reconcile
from services.lifecycle.observed import Observed, ObservedPod
from shared.appwrapper.constants import ANNOUNCED_ANNOTATION, Phase
from shared.faulttolerance import FaultTolerance
from shared.messages import Verdict
from tests.unit.test_lifecycle_machine import (
    PARAMS,
    T0,
    apply,
    appwrapper,
    gone,
    present,
    running,
    scenarios,
    verdict,
)


def marked(aw: dict[str, Any], marker: str | None) -> dict[str, Any]:
    """``aw`` with the announcement record set to ``marker`` (None: absent)."""
    out = copy.deepcopy(aw)
    annotations = out["metadata"].setdefault("annotations", {})
    annotations.pop(ANNOUNCED_ANNOTATION, None)
    if marker is not None:
        annotations[ANNOUNCED_ANNOTATION] = marker
    return out


def ids(actions: tuple[Action, ...] | list[Action]) -> set[str]:
    out: set[str] = set()
    for action in actions:
        if isinstance(action, PublishLifecycleEvent):
            out.add(action.msg_id)
        elif isinstance(action, EmitEvent):
            out.add(action.id)
    return out


def recorded(aw: dict[str, Any]) -> dict[str, Any]:
    """``aw`` with its transition recorded as announced."""
    t = announcements.transition_of(aw)
    return marked(aw, t.marker if t else None)


# ----------------------------------------------------------------------------- transitions


def test_each_phase_has_a_transition_that_only_announced_changes_move() -> None:
    aw = running()
    t = announcements.transition_of(aw)
    assert t is not None and t.phase == Phase.RUNNING and t.count == 0
    assert t.stamp == "2025-03-01T12:00:00Z"
    # PodsReady flipping, a Healthy verdict: status changes nothing announces.
    pods = [ObservedPod("p0", "Running"), ObservedPod("p1", "Running")]
    later = apply(aw, reconcile(aw, present(1, pods), None, PARAMS, T0 + timedelta(minutes=3)))
    assert later["status"] != aw["status"]
    assert announcements.transition_of(later) == t
    # A reset: a new transition, with the count it made.
    v = verdict(at=T0 + timedelta(minutes=5), first_unhealthy_at=T0 + timedelta(seconds=30))
    reset = apply(later, reconcile(later, present(1), v, PARAMS, T0 + timedelta(minutes=5)))
    moved = announcements.transition_of(reset)
    assert moved is not None and (moved.phase, moved.count) == (Phase.RESETTING, 1)
    assert moved.stamp == "2025-03-01T12:00:30Z", "Unhealthy's time: when the failure was first seen"


def test_no_phase_means_nothing_announced_and_nothing_owed() -> None:
    aw = appwrapper()
    assert announcements.transition_of(aw) is None
    assert not announcements.pending(aw, T0)
    assert announcements.owed(aw, 3, T0) == ()


def test_an_escalation_to_forceful_deletion_is_its_own_part_and_stays_covered_after() -> None:
    params = FaultTolerance(forceful_deletion_grace=timedelta(seconds=10))
    aw = running(params=params)
    aw["spec"]["suspend"] = True
    aw = apply(aw, reconcile(aw, present(1), None, params, T0 + timedelta(seconds=1)))
    before = announcements.transition_of(aw)
    assert before is not None and before.phase == Phase.SUSPENDING and not before.forceful
    stuck = Observed(components=gone(1).components, pods=(ObservedPod("p0", "Running", terminating=True),))
    plan = reconcile(recorded(aw), stuck, None, params, T0 + timedelta(seconds=20))
    escalated = apply(recorded(aw), plan)
    after = announcements.transition_of(escalated)
    assert after is not None and after.key == before.key and after.forceful
    owed = announcements.owed(escalated, params.retry_limit, T0 + timedelta(seconds=20))
    assert [a.reason for a in owed if isinstance(a, EmitEvent)] == ["ForcefulDeletion"]
    assert ids(owed) <= ids(plan.actions)
    # Once the deletion completes, DeletingResources turns False: the record still covers it.
    assert announcements.covers(after.marker, announcements.Transition(after.phase, after.count, after.stamp))


def test_a_record_from_an_older_transition_owes_the_current_one() -> None:
    aw = running()
    assert announcements.pending(marked(aw, "Resuming/0/2025-03-01T12:00:00Z"))
    assert not announcements.pending(recorded(aw))
    assert needs_attention(marked(aw, "Resuming/0/2025-03-01T12:00:00Z"))
    assert not needs_attention(recorded(aw)), "a Running AppWrapper with nothing owed needs no resync"


def test_without_a_record_only_a_recent_status_is_owed() -> None:
    aw = marked(running(), None)
    aw["metadata"]["managedFields"] = [{"subresource": "status", "time": "2025-03-01T12:00:00Z"}]
    assert announcements.pending(aw, T0 + timedelta(minutes=9))
    assert announcements.owed(aw, 3, T0 + timedelta(minutes=9))
    # Written before Respawn kept the record (an upgrade): adopted, not announced again.
    assert not announcements.pending(aw, T0 + timedelta(minutes=11))
    assert announcements.owed(aw, 3, T0 + timedelta(minutes=11)) == ()
    assert not announcements.pending(aw), "the resync without a clock does not guess"


# --------------------------------------------------------------------- re-derived content


def test_a_reset_owes_what_the_plan_announced_with_the_same_ids() -> None:
    aw = recorded(running())
    v = verdict(at=T0 + timedelta(minutes=5), first_unhealthy_at=T0 + timedelta(minutes=4))
    plan = reconcile(aw, present(1), v, PARAMS, T0 + timedelta(minutes=5))
    after = apply(aw, plan)
    owed = announcements.owed(after, PARAMS.retry_limit, T0 + timedelta(minutes=6))
    assert ids(owed) <= ids(plan.actions)
    events = [(a.type, a.reason, a.message) for a in owed if isinstance(a, EmitEvent)]
    assert events == [
        ("Normal", "Unhealthy", "FoundFailedPods: 1 failed pods"),
        ("Normal", "Resetting", "Resetting after FoundFailedPods: 1 failed pods (reset 1 of at most 3)"),
    ]
    assert events == [(a.type, a.reason, a.message) for a in plan.actions if isinstance(a, EmitEvent)]
    published = [a.event for a in owed if isinstance(a, PublishLifecycleEvent)]
    assert [(m.event, m.phase, m.previous_phase, m.resetting_count) for m in published] == [
        ("PhaseChanged", "Resetting", "Running", 1),
        ("ResetStarted", "Resetting", "", 1),
    ]


def test_suspending_owes_the_phase_the_record_last_saw() -> None:
    aw = recorded(running())
    aw["spec"]["suspend"] = True
    plan = reconcile(aw, present(1), None, PARAMS, T0 + timedelta(minutes=1))
    after = apply(aw, plan)
    owed = announcements.owed(after, PARAMS.retry_limit, T0 + timedelta(minutes=1))
    assert [(a.reason, a.message) for a in owed if isinstance(a, EmitEvent)] == [
        ("Suspending", "Externally suspended while in the Running phase")
    ]
    assert ids(owed) <= ids(plan.actions)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_what_a_later_pass_owes_is_what_the_plan_announced(
    scenario: tuple[dict[str, Any], Observed, Verdict | None, FaultTolerance, Any],
) -> None:
    """For any plan that moves an AppWrapper to a new transition: if the process dies after the
    status write, the announcements re-derived from that status carry ids the plan's own had
    (so a copy of one that went out is dropped), and the new phase is among them."""
    aw, observed, v, params, now = scenario
    before = announcements.transition_of(aw)
    aw = marked(aw, before.marker if before else "none")
    plan = reconcile(aw, observed, v, params, now)
    if plan.status is None:
        return
    after = apply(aw, plan)
    moved = announcements.transition_of(after)
    if moved is None or announcements.covers(before.marker if before else "none", moved):
        return
    owed = announcements.owed(after, params.retry_limit, now)
    assert owed, "a new transition is owed until recorded"
    assert ids(owed) <= ids(plan.actions), (ids(owed) - ids(plan.actions), ids(plan.actions))
    phases = {a.event.phase for a in owed if isinstance(a, PublishLifecycleEvent)}
    assert moved.phase in phases


# -------------------------------------------------------------------------- ids and names


def test_event_names_are_deterministic_valid_object_names() -> None:
    long = "a" * 253
    for name in ("train", long):
        first = announcements.event_name(name, "uid-1/Running/0/2025-03-01T12:00:00Z/Running")
        assert first == announcements.event_name(name, "uid-1/Running/0/2025-03-01T12:00:00Z/Running")
        assert len(first) <= 253
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", first)
    assert announcements.event_name("train", "a") != announcements.event_name("train", "b")


def test_message_ids_keep_the_documented_shape() -> None:
    aw = recorded(running())
    aw["spec"]["suspend"] = True
    plan = reconcile(aw, present(1), None, PARAMS, T0 + timedelta(minutes=1))
    [message] = [a for a in plan.actions if isinstance(a, PublishLifecycleEvent)]
    # <uid>/<event>/<resettingCount>/<phase>/<time the status records for the transition>
    assert message.msg_id == "uid-1/PhaseChanged/0/Suspending/2025-03-01T12:00:00Z"
