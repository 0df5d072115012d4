"""Staged deletion of everything an AppWrapper created: gracefully first, then forcefully.

One call is one step; the caller repeats it (on observations or at ``requeue_at``) until
``complete``. The stages, as upstream's ``deleteComponents``:

1. ``DeletingResources`` becomes True (reason ``DeletionInitiated``); its transition time starts
   the forceful-deletion clock, so a restarted instance continues the same clock.
2. Every component still present is deleted with Background propagation, letting its own
   controller cascade the deletion to its pods. Only an object confirmed to be this
   AppWrapper's (seen with its controller owner reference, or created by us) is deleted, and the
   delete carries its uid as a precondition: an object of the same name owned by someone else
   is never touched, and neither is one that could not be read (it is waited for instead).
   Once no component is left, its pods (the labelled ones in its owner tree, see the reader)
   not yet terminating are deleted too, with their
   own grace period (a Respawn addition: the garbage collector would get to them, one after
   another, but a large reset waits for the last one).
3. Once ``ForcefulDeletionGracePeriod`` has passed with anything left: every remaining pod of
   the AppWrapper is deleted with grace period 0, and only when no pod is left, the remaining components
   are deleted with grace period 0. Pods go first because a component's controller could
   otherwise recreate them, and because pods are what holds the nodes (and the quota).
4. Complete when no component and no pod of the AppWrapper is left: ``DeletingResources`` turns False
   (``DeletionComplete``). Only then may the caller turn ``ResourcesDeployed`` False, which is
   Kueue's signal that the quota is free.

The escalation to grace 0 is recorded in the ``DeletingResources`` message (its status stays
True, so the clock is unaffected). That makes "deletion became forceful" an event that happens
exactly once per deletion, whichever instance observes it, rather than on every step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from services.lifecycle.actions import Action, DeleteComponent, DeletePods
from services.lifecycle.conditions import (
    clear_condition,
    condition_status,
    find_condition,
    is_true,
    set_condition,
    transition_time,
)
from services.lifecycle.copies import copy_json
from services.lifecycle.observed import Observed, ObservedNode, ObservedPod, Presence
from shared.appwrapper.constants import ComponentReason, ConditionStatus, ConditionType, Reason
from shared.durations import format_go_duration
from shared.kubetime import as_utc

__all__ = ["DELETION_POLL", "FORCEFUL_MESSAGE_PREFIX", "DeletionStep", "staged_deletion", "unreachable_pods"]

# How soon to look again while a deletion is in progress, in case an observation that would
# wake the service is lost; progress is normally driven by observations, not by this poll.
DELETION_POLL: Final = timedelta(seconds=5)

FORCEFUL_MESSAGE_PREFIX: Final = "Forceful deletion"


@dataclass(frozen=True, slots=True)
class DeletionStep:
    complete: bool
    # The AppWrapper's new status.conditions and status.componentStatus.
    conditions: list[dict[str, Any]]
    component_status: list[dict[str, Any]]
    actions: tuple[Action, ...]
    requeue_at: datetime | None
    # True in the one step that escalates to grace-period-0 deletion.
    escalated: bool = False
    # What was left when escalating, for events.
    summary: str = ""
    # Components found under their recorded name but controlled by someone else: left alone
    # (and no reason to wait for them), reported to the AppWrapper's owner.
    foreign: tuple[int, ...] = ()


def _component_name(entry: Mapping[str, Any], observed_name: str) -> str:
    name = entry.get("name")
    return observed_name or (name if isinstance(name, str) else "")


def _delete(
    index: int, entry: Mapping[str, Any], namespace: str, name: str, uid: str, *, force: bool
) -> DeleteComponent:
    return DeleteComponent(
        index=index,
        api_version=str(entry.get("apiVersion", "")),
        kind=str(entry.get("kind", "")),
        namespace=namespace,
        name=name,
        force=force,
        uid=uid,
    )


def unreachable_pods(pods: Sequence[ObservedPod], nodes: Sequence[ObservedNode] | None) -> frozenset[str]:
    """The pods (by name) on a node that exists but is not Ready; with the nodes unknown, every
    pod that is bound to a node (it cannot be told that its node answers)."""
    if nodes is None:
        return frozenset(p.name for p in pods if p.node)
    by_name = {n.name: n for n in nodes}
    return frozenset(p.name for p in pods if p.node and p.node in by_name and not by_name[p.node].ready)


def staged_deletion(
    status: Mapping[str, Any],
    *,
    namespace: str,
    observed: Observed,
    forceful_grace: timedelta,
    now: datetime,
    observed_generation: int | None = None,
    consistency: bool = False,
) -> DeletionStep:
    """One step of staged deletion over the AppWrapper ``status`` (which is not modified).

    ``consistency`` (``faultTolerance.consistencyMode``): a pod on a node that does not answer
    (not Ready, or not known to be Ready because the nodes were not read) is never deleted with
    grace period 0, since its containers may still run there; the deletion waits until the node
    answers (its kubelet then confirms the graceful deletion) or the node object is deleted (the
    garbage collector then removes its pods). So at most one instance of a pod ever runs."""
    now = as_utc(now)
    conditions: Sequence[Any] = status.get("conditions") or []
    if not is_true(conditions, ConditionType.DELETING_RESOURCES):
        conditions = set_condition(
            conditions,
            ctype=ConditionType.DELETING_RESOURCES,
            status=ConditionStatus.TRUE,
            reason=Reason.DELETION_INITIATED,
            message="",
            now=now,
            observed_generation=observed_generation,
        )
    started = transition_time(conditions, ConditionType.DELETING_RESOURCES) or now
    deadline = started + forceful_grace
    expired = now >= deadline

    raw_entries = status.get("componentStatus")
    entries = [copy_json(dict(e)) if isinstance(e, Mapping) else {} for e in (raw_entries or [])]
    actions: list[Action] = []
    # (index, status entry, name, confirmed ours, its uid)
    remaining: list[tuple[int, Mapping[str, Any], str, bool, str]] = []
    foreign: list[int] = []
    for index, entry in enumerate(entries):
        seen = observed.component(index)
        name = _component_name(entry, seen.name)
        comp_conditions = entry.get("conditions") or []
        comp_status = condition_status(comp_conditions, ConditionType.RESOURCES_DEPLOYED)
        # Anything whose creation was attempted and whose deletion was not yet confirmed may
        # exist: a create that timed out or errored may still have taken effect.
        condition = find_condition(comp_conditions, ConditionType.RESOURCES_DEPLOYED)
        recorded = comp_status == ConditionStatus.TRUE or (
            condition is not None and bool(name) and condition.get("reason") != ComponentReason.DELETED
        )
        if seen.presence is Presence.ABSENT:
            if recorded:
                entry["conditions"] = set_condition(
                    comp_conditions,
                    ctype=ConditionType.RESOURCES_DEPLOYED,
                    status=ConditionStatus.FALSE,
                    reason=ComponentReason.DELETED,
                    message="",
                    now=now,
                )
            continue
        if seen.presence in (Presence.PRESENT, Presence.DELETING) and not seen.controlled_by_us:
            # An object of that name owned by someone else (our create found it there): never
            # ours to delete, and no reason to wait for it.
            foreign.append(index)
            continue
        # Ours for certain: read with our controller owner reference, or (not read this pass)
        # known by the uid an earlier read or our create confirmed.
        confirmed = seen.presence in (Presence.PRESENT, Presence.DELETING) or (
            seen.presence is Presence.UNKNOWN and bool(seen.uid) and seen.controlled_by_us
        )
        present = confirmed or recorded
        if not present or not name:
            # Never created, or created under a generated name we never learned: nothing to delete.
            continue
        uid = seen.uid if confirmed else ""
        remaining.append((index, entry, name, confirmed, uid))
        # An object that may exist but was not confirmed ours (its read failed) is waited for,
        # never deleted blindly: deleting by name could remove another team's object.
        if confirmed and seen.presence is not Presence.DELETING:
            actions.append(_delete(index, entry, namespace, name, uid, force=False))

    poll = now + DELETION_POLL
    seen_foreign = tuple(foreign)
    if remaining and not expired:
        return DeletionStep(
            False, list(conditions), entries, tuple(actions), min(deadline, poll), foreign=seen_foreign
        )
    pods = observed.pods_gone_known
    if pods is None:
        # Not listed (or only the cache's unconfirmed "none"): completion cannot be declared,
        # and forcing needs names.
        return DeletionStep(False, list(conditions), entries, tuple(actions), poll, foreign=seen_foreign)
    if not remaining and not pods:
        conditions = clear_condition(
            conditions,
            ctype=ConditionType.DELETING_RESOURCES,
            reason=Reason.DELETION_COMPLETE,
            message="",
            now=now,
            observed_generation=observed_generation,
        )
        return DeletionStep(True, list(conditions), entries, tuple(actions), None, foreign=seen_foreign)
    if not expired:
        # Components are gone but their pods are still there. Delete those not yet terminating
        # ourselves (with their own grace period) instead of waiting for the garbage collector
        # to reach each of them: nothing is left to recreate them.
        leftover = tuple(p.name for p in pods if not p.terminating)
        if not remaining and leftover:
            actions.append(DeletePods(namespace=namespace, names=leftover))
        return DeletionStep(
            False, list(conditions), entries, tuple(actions), min(deadline, poll), foreign=seen_foreign
        )

    held = unreachable_pods(pods, observed.nodes) if consistency else frozenset()
    if pods:
        forced = tuple(p.name for p in pods if p.name not in held)
        if forced:
            actions.append(DeletePods(namespace=namespace, names=forced, force=True))
    else:
        actions.extend(
            _delete(index, entry, namespace, name, uid, force=True)
            for index, entry, name, confirmed, uid in remaining
            if confirmed
        )
    current = find_condition(conditions, ConditionType.DELETING_RESOURCES) or {}
    escalated = not str(current.get("message", "")).startswith(FORCEFUL_MESSAGE_PREFIX)
    stuck = sum(1 for p in pods if p.terminating)
    summary = (
        f"{len(pods)} pods ({stuck} stuck terminating) and {len(remaining)} components left after "
        f"ForcefulDeletionGracePeriod of {format_go_duration(forceful_grace)}"
    )
    if held:
        summary += f"; {len(held)} pods on unreachable nodes wait for their node (consistency mode)"
    if escalated:
        conditions = set_condition(
            conditions,
            ctype=ConditionType.DELETING_RESOURCES,
            status=ConditionStatus.TRUE,
            reason=Reason.DELETION_INITIATED,
            message=f"{FORCEFUL_MESSAGE_PREFIX} (grace period 0): {summary}",
            now=now,
            observed_generation=observed_generation,
        )
    return DeletionStep(
        False, list(conditions), entries, tuple(actions), poll, escalated, summary, seen_foreign
    )
