"""Announcements as a function of the status: which transition an AppWrapper is in, whether it has
been announced, what is still owed, and the deterministic ids that make a re-send harmless.

A status write and the announcements describing it (lifecycle-stream messages, Kubernetes Events)
are separate calls, so a process killed between the two would lose them. They are therefore
derived from what the status records, and sent at least once with ids that make every copy after
the first a no-op:

- :func:`transition_of`: the transition the status records. It is the phase, the
  ``resettingCount`` and the time the status gives for entering the phase (a condition's
  ``lastTransitionTime``, see :func:`_stamp`), plus the escalation of a deletion to grace period
  0 when there is one. It changes exactly when something announced happens, never otherwise.
- the ``respawn.dev/announced`` annotation: the transition whose announcements were all sent. The
  service writes it after sending them (one merge patch per reconcile that announced something).
- :func:`owed`: when the annotation does not cover the status's transition, the announcements of
  that transition, derived from the status alone; the service re-sends them before anything else.
- ids: every announcement's id is a function of the transition (:func:`msg_id`,
  :func:`event_id`), the same whether the plan that made the transition sends it or a later pass
  re-derives it. JetStream drops a repeated ``Nats-Msg-Id`` within the stream's duplicate window
  (120 s), and the API server refuses an Event whose (deterministic) name exists.

A re-derived announcement carries what the status records. It may be terser than the original
(e.g. ``previous_phase`` is the phase the annotation last recorded), but it has the original's
id, so wherever the original did go out, the copy is dropped.

An AppWrapper without the annotation was last written before Respawn recorded it (an upgrade), or
by a process that died before its first record. Its transition is taken as announced once its
status was last written more than :data:`UNMARKED_HORIZON` ago; a more recent one is re-sent.

Everything here is pure: no clock, no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from services.lifecycle.actions import Action, EmitEvent, LifecycleEventType, PublishLifecycleEvent
from services.lifecycle.conditions import find_condition, transition_time
from services.lifecycle.deletion import FORCEFUL_MESSAGE_PREFIX
from shared.appwrapper.constants import (
    ANNOUNCED_ANNOTATION,
    MSG_RESET_COMPLETE,
    MSG_SUSPEND_FALSE,
    ConditionStatus,
    ConditionType,
    EventReason,
    Phase,
    Reason,
)
from shared.appwrapper.model import as_mapping
from shared.kubetime import as_utc, format_kube_time, parse_kube_time
from shared.messages import LifecycleEvent, ObjectRef

__all__ = [
    "FORCEFUL_DELETION_EVENT",
    "UNMARKED_HORIZON",
    "Transition",
    "announced_marker",
    "covers",
    "event_id",
    "event_name",
    "msg_id",
    "owed",
    "pending",
    "transition_of",
    "who",
]

# An AppWrapper without the annotation whose status was last written longer ago than this is
# taken as announced (written before Respawn kept the record); a more recent one is re-sent.
UNMARKED_HORIZON: Final = timedelta(minutes=10)

# Reason of the Kubernetes event recorded when deletion escalates to grace period 0.
FORCEFUL_DELETION_EVENT: Final = "ForcefulDeletion"

# The phases in which a deletion runs (and may escalate to grace period 0).
_DELETING_PHASES: Final = frozenset(
    {Phase.RESETTING, Phase.SUSPENDING, Phase.FAILED, Phase.SUCCEEDED, Phase.TERMINATING}
)
# Separates the phase part of a transition's marker from its forceful-deletion part.
_FORCEFUL: Final = "+forceful/"
# Kubernetes object names are DNS subdomains of at most 253 characters.
_MAX_NAME: Final = 253


@dataclass(frozen=True, slots=True)
class Transition:
    """The transition a status records (see the module docstring)."""

    phase: str
    count: int
    # When the status says the phase was entered (RFC 3339, whole seconds), "-" if it says nothing.
    stamp: str
    # DeletingResources' transition time when the deletion escalated to grace period 0, else "".
    forceful: str = ""

    @property
    def key(self) -> str:
        """The phase part: phase, attempt count and time."""
        return f"{self.phase}/{self.count}/{self.stamp}"

    @property
    def forceful_key(self) -> str:
        return f"{self.key}{_FORCEFUL}{self.forceful}"

    @property
    def marker(self) -> str:
        """The annotation value recording that this transition has been announced."""
        return self.forceful_key if self.forceful else self.key


def _conditions(status: Mapping[str, Any]) -> Sequence[Any]:
    conditions = status.get("conditions")
    return conditions if isinstance(conditions, list) else []


def _count(status: Mapping[str, Any]) -> int:
    value = status.get("resettingCount", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _time(conditions: Sequence[Any], ctype: str) -> str | None:
    when = transition_time(conditions, ctype)
    return format_kube_time(when) if when is not None else None


def _stamp(meta: Mapping[str, Any], status: Mapping[str, Any], phase: str) -> str | None:
    """The time the status records for entering ``phase`` (None: a phase nothing announces).

    Each is the transition time of a condition the machine turns in the same write that enters
    the phase, read only while the condition still says what that write made it say (so that
    it keeps its time for as long as the phase lasts, whatever else is written meanwhile):

    - Suspended: QuotaReserved False/Suspended (Suspending -> Suspended); on the first Suspended,
      which writes no condition, the AppWrapper's creationTimestamp;
    - Resuming, Running, Suspending: ResourcesDeployed True, i.e. the attempt's start;
    - Resetting, Failed: Unhealthy True (every reset and every failure marks it);
    - Succeeded: QuotaReserved False/Succeeded;
    - Terminating: the deletionTimestamp.

    "-" when the status does not say (a status written by hand): constant, so never a new
    transition by itself.
    """
    conditions = _conditions(status)
    match phase:
        case Phase.SUSPENDED:
            if _suspended_after_running(conditions):
                return _time_if(conditions, ConditionType.QUOTA_RESERVED, ConditionStatus.FALSE)
            created = parse_kube_time(meta.get("creationTimestamp"))
            return format_kube_time(created) if created is not None else "-"
        case Phase.RESUMING | Phase.RUNNING | Phase.SUSPENDING:
            return _time_if(conditions, ConditionType.RESOURCES_DEPLOYED, ConditionStatus.TRUE)
        case Phase.RESETTING | Phase.FAILED:
            return _time_if(conditions, ConditionType.UNHEALTHY, ConditionStatus.TRUE)
        case Phase.SUCCEEDED:
            return _time_if(conditions, ConditionType.QUOTA_RESERVED, ConditionStatus.FALSE, Reason.SUCCEEDED)
        case Phase.TERMINATING:
            deleted = parse_kube_time(meta.get("deletionTimestamp"))
            return format_kube_time(deleted) if deleted is not None else "-"
        case _:
            return None


def _time_if(conditions: Sequence[Any], ctype: str, status: str, reason: str = "") -> str:
    cond = find_condition(conditions, ctype) or {}
    if cond.get("status") != status or (reason and cond.get("reason") != reason):
        return "-"
    return _time(conditions, ctype) or "-"


def _suspended_after_running(conditions: Sequence[Any]) -> bool:
    """Whether Suspended was entered from Suspending (rather than on submission)."""
    quota = find_condition(conditions, ConditionType.QUOTA_RESERVED) or {}
    return quota.get("status") == ConditionStatus.FALSE and quota.get("reason") == Reason.SUSPENDED


def transition_of(aw: Mapping[str, Any]) -> Transition | None:
    """The transition ``aw``'s status records; None before the first (no phase) or for a phase
    this version does not know."""
    meta = as_mapping(aw.get("metadata"))
    status = as_mapping(aw.get("status"))
    phase = status.get("phase")
    if not isinstance(phase, str) or not phase:
        return None
    stamp = _stamp(meta, status, phase)
    if stamp is None:
        return None
    conditions = _conditions(status)
    deleting = find_condition(conditions, ConditionType.DELETING_RESOURCES) or {}
    forceful = ""
    if (
        phase in _DELETING_PHASES
        and deleting.get("status") == ConditionStatus.TRUE
        and str(deleting.get("message", "")).startswith(FORCEFUL_MESSAGE_PREFIX)
    ):
        forceful = _time(conditions, ConditionType.DELETING_RESOURCES) or "-"
    return Transition(phase=phase, count=_count(status), stamp=stamp, forceful=forceful)


def announced_marker(aw: Mapping[str, Any]) -> str | None:
    """The ``respawn.dev/announced`` annotation, None when absent."""
    annotations = as_mapping(as_mapping(aw.get("metadata")).get("annotations"))
    value = annotations.get(ANNOUNCED_ANNOTATION)
    return value if isinstance(value, str) else None


def covers(marker: str | None, transition: Transition | None) -> bool:
    """Whether ``marker`` records every announcement of ``transition`` as sent.

    A forceful escalation recorded for this phase stays covered after the deletion completes
    (DeletingResources then turns False and the status no longer shows it).
    """
    if transition is None:
        return True
    if marker is None:
        return False
    key, _, forceful = marker.partition(_FORCEFUL)
    return key == transition.key and (not transition.forceful or forceful == transition.forceful)


def _last_written(aw: Mapping[str, Any], transition: Transition) -> datetime | None:
    """When the status was last written: the API server's own record of it (managedFields), or
    failing that the transition's times."""
    latest: datetime | None = None
    fields = as_mapping(aw.get("metadata")).get("managedFields")
    for entry in fields if isinstance(fields, list) else []:
        if isinstance(entry, Mapping) and entry.get("subresource") == "status":
            when = parse_kube_time(entry.get("time"))
            if when is not None and (latest is None or when > latest):
                latest = when
    if latest is not None:
        return latest
    times = [parse_kube_time(t) for t in (transition.stamp, transition.forceful)]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _unmarked_is_recent(aw: Mapping[str, Any], transition: Transition, now: datetime) -> bool:
    written = _last_written(aw, transition)
    return written is not None and as_utc(now) - written < UNMARKED_HORIZON


def pending(aw: Mapping[str, Any], now: datetime | None = None) -> bool:
    """Whether ``aw`` has announcements owed (for the resync: someone must send them).

    Without ``now`` an AppWrapper without the annotation is never pending (its age is unknown).
    """
    transition = transition_of(aw)
    if transition is None:
        return False
    marker = announced_marker(aw)
    if marker is None:
        return now is not None and _unmarked_is_recent(aw, transition, now)
    return not covers(marker, transition)


def who(ref: ObjectRef) -> str:
    """The AppWrapper incarnation in ids: its uid, or namespace/name when it has none."""
    return ref.uid or f"{ref.namespace}/{ref.name}"


def msg_id(ref: ObjectRef, event: str, count: int, phase: str, stamp: str) -> str:
    """``Nats-Msg-Id`` of a lifecycle-stream message: ``<uid>/<event>/<resettingCount>/<phase>/<time>``."""
    return f"{who(ref)}/{event}/{count}/{phase}/{stamp}"


def event_id(ref: ObjectRef, key: str, reason: str, suffix: str = "") -> str:
    """Id of a Kubernetes Event: the incarnation, the transition (or its forceful part), the
    reason, and what tells two Events of one reason within one transition apart (if anything)."""
    return f"{who(ref)}/{key}/{reason}" + (f"/{suffix}" if suffix else "")


def event_name(appwrapper: str, event: str) -> str:
    """The Event's object name for id ``event``: the AppWrapper's name (as the API server's own
    Events are named) and a digest of the id."""
    digest = hashlib.sha256(event.encode()).hexdigest()[:16]
    return f"{appwrapper[: _MAX_NAME - len(digest) - 1]}.{digest}"


def _ref(aw: Mapping[str, Any]) -> ObjectRef:
    meta = as_mapping(aw.get("metadata"))
    return ObjectRef(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), uid=str(meta.get("uid", ""))
    )


def _split(marker: str | None) -> tuple[str, str]:
    if marker is None:
        return "", ""
    key, _, forceful = marker.partition(_FORCEFUL)
    return key, forceful


def owed(aw: Mapping[str, Any], retry_limit: int, now: datetime) -> tuple[Action, ...]:
    """The announcements of ``aw``'s transition that the annotation does not record as sent.

    Derived from the status (and the annotation: the phase and count it last recorded); ids as
    the plan that made the transition gave them. ``retry_limit`` completes a reset's or a
    failure's message. Empty when nothing is owed, and for an AppWrapper without the annotation
    whose status is older than :data:`UNMARKED_HORIZON`.
    """
    transition = transition_of(aw)
    marker = announced_marker(aw)
    if transition is None or covers(marker, transition):
        return ()
    if marker is None and not _unmarked_is_recent(aw, transition, now):
        return ()
    key, forceful = _split(marker)
    out: list[Action] = []
    if key != transition.key:
        out.extend(_phase_announcements(aw, transition, key, retry_limit, now))
    # An escalation is owed only when the record shows the phase's own announcements went out
    # before it: then it happened in this phase, and its ids are this phase's. A deletion under
    # way carries its escalation into the next phase (Resetting -> Suspending, anything ->
    # Terminating), where it was not announced again; re-sending it under the new phase's ids
    # could duplicate it, so an escalation whose phase is unknown is not re-sent.
    if transition.forceful and key == transition.key and forceful != transition.forceful:
        out.extend(_forceful_announcements(aw, transition, now))
    return tuple(out)


def _previous(key: str) -> tuple[str, int | None]:
    """The phase and count a marker's key recorded ("" and None when unknown)."""
    parts = key.split("/", 2)
    if len(parts) != 3:
        return "", None
    try:
        return parts[0], int(parts[1])
    except ValueError:
        return parts[0], None


class _Builder:
    """Announcements of one transition, with the ids the machine gives them."""

    def __init__(self, aw: Mapping[str, Any], transition: Transition, now: datetime) -> None:
        self.ref = _ref(aw)
        self.transition = transition
        self.now = now
        self.actions: list[Action] = []

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str, *, key: str = "") -> None:
        eid = event_id(self.ref, key or self.transition.key, reason)
        self.actions.append(EmitEvent(type=type_, reason=reason, message=message, id=eid))

    def publish(
        self,
        event: LifecycleEventType,
        *,
        previous_phase: str = "",
        reason: str = "",
        message: str = "",
        stamp: str = "",
    ) -> None:
        t = self.transition
        self.actions.append(
            PublishLifecycleEvent(
                event=LifecycleEvent(
                    ref=self.ref,
                    event=event,
                    phase=t.phase,
                    previous_phase=previous_phase,
                    reason=reason,
                    message=message,
                    resetting_count=t.count,
                    at=self.now,
                ),
                msg_id=msg_id(self.ref, event, t.count, t.phase, stamp or t.stamp),
            )
        )


def _phase_announcements(
    aw: Mapping[str, Any], transition: Transition, previous_key: str, retry_limit: int, now: datetime
) -> list[Action]:
    """What the machine announces on entering ``transition.phase`` (see machine._transition and
    its callers), as far as the status tells."""
    status = as_mapping(aw.get("status"))
    spec = as_mapping(aw.get("spec"))
    components = spec.get("components")
    n = len(components) if isinstance(components, list) else 0
    conditions = _conditions(status)
    unhealthy = find_condition(conditions, ConditionType.UNHEALTHY) or {}
    cause = str(unhealthy.get("reason") or "")
    detail = str(unhealthy.get("message") or "")
    previous, previous_count = _previous(previous_key)
    count = transition.count
    b = _Builder(aw, transition, now)
    phase = transition.phase
    reason = ""
    if phase == Phase.SUSPENDED:
        if _suspended_after_running(conditions):
            message = "All resources deleted; quota released"
        else:
            message = f"Recorded the pod sets of {n} components; waiting for admission"
    elif phase == Phase.RESUMING:
        deployed = find_condition(conditions, ConditionType.RESOURCES_DEPLOYED) or {}
        after_reset = deployed.get("message") == MSG_RESET_COMPLETE
        message = (
            f"{MSG_RESET_COMPLETE} (after reset {count})"
            if after_reset
            else f"{MSG_SUSPEND_FALSE}; creating {n} components"
        )
    elif phase == Phase.RUNNING:
        message = f"All {n} components created"
    elif phase == Phase.RESETTING:
        b.event("Normal", EventReason.UNHEALTHY, f"{cause}: {detail}" if detail else cause)
        counted = previous_count is None or previous_count < count
        what = (
            f"reset {count} of at most {retry_limit}"
            if counted
            else f"not counted toward the retry limit ({count} of {retry_limit} used)"
        )
        message = (
            f"Resetting after {cause}: {detail} ({what})" if detail else f"Resetting after {cause} ({what})"
        )
        reason = cause
    elif phase == Phase.SUSPENDING:
        message = (
            f"Externally suspended while in the {previous} phase"
            if previous in (Phase.RESUMING, Phase.RUNNING, Phase.RESETTING)
            else "Externally suspended"
        )
        reason = EventReason.SUSPENDING
    elif phase == Phase.SUCCEEDED:
        quota = find_condition(conditions, ConditionType.QUOTA_RESERVED) or {}
        message = str(quota.get("message") or "Succeeded")
        reason = Reason.SUCCEEDED
    elif phase == Phase.FAILED:
        b.event("Normal", EventReason.UNHEALTHY, f"{cause}: {detail}" if detail else cause)
        if cause in (Reason.MISSING_COMPONENT, Reason.CREATE_FAILED):
            message = detail or cause
        else:
            why = (
                f"the retry limit of {retry_limit} is reached"
                if count >= retry_limit
                else "the failure is terminal"
            )
            message = f"{cause}: {detail}; {why}" if detail else f"{cause}; {why}"
        reason = cause
    else:  # Terminating
        message = "AppWrapper deleted; deleting its resources"
    if phase == Phase.SUSPENDING:
        b.event("Normal", EventReason.SUSPENDING, message)
    else:
        b.event("Warning" if phase == Phase.FAILED else "Normal", phase, message)
    b.publish(LifecycleEventType.PHASE_CHANGED, previous_phase=previous, reason=reason, message=message)
    if phase == Phase.RESETTING:
        b.publish(LifecycleEventType.RESET_STARTED, reason=cause, message=detail)
    if phase == Phase.RESUMING and message.startswith(MSG_RESET_COMPLETE):
        b.publish(LifecycleEventType.RESET_FINISHED, message=MSG_RESET_COMPLETE)
    return b.actions


def _forceful_announcements(aw: Mapping[str, Any], transition: Transition, now: datetime) -> list[Action]:
    """What the machine announces when a deletion escalates to grace period 0 (the summary is in
    the DeletingResources message)."""
    conditions = _conditions(as_mapping(aw.get("status")))
    deleting = find_condition(conditions, ConditionType.DELETING_RESOURCES) or {}
    text = str(deleting.get("message", ""))
    summary = text.partition(": ")[2] or text
    b = _Builder(aw, transition, now)
    b.event(
        "Warning",
        FORCEFUL_DELETION_EVENT,
        f"Deleting with grace period 0: {summary}",
        key=transition.forceful_key,
    )
    b.publish(
        LifecycleEventType.DELETION_FORCEFUL,
        reason=FORCEFUL_DELETION_EVENT,
        message=summary,
        stamp=transition.forceful,
    )
    return b.actions
