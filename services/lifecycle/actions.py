"""What the lifecycle state machine asks the service to do, and what the service reports back.

The machine never performs I/O. A :class:`~services.lifecycle.machine.Plan` carries an ordered
tuple of the actions below; the service carries them out against the Kubernetes API and the
bus. Outcomes of component creation come back into the next decision as
:class:`CreateOutcome` values, because whether a failed create means "retry", "reset" or
"fail" is itself a lifecycle decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from shared.messages import LifecycleEvent

__all__ = [
    "Action",
    "CreateComponent",
    "CreateOutcome",
    "CreateResult",
    "DeleteComponent",
    "DeletePods",
    "EmitEvent",
    "ExcludeNodes",
    "LifecycleEventType",
    "PublishLifecycleEvent",
]


@dataclass(frozen=True, slots=True)
class CreateComponent:
    """Create ``body`` (the rendered component ``index``) in the AppWrapper's namespace.

    The body already carries the namespace, the AppWrapper label and a controller owner
    reference. On AlreadyExists the service reads the object and reports whether its controller
    owner reference names this AppWrapper (see :class:`CreateOutcome`).
    """

    index: int
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeleteComponent:
    """Delete a wrapped resource with ``propagationPolicy: Background``; NotFound is success.

    ``force``: with ``gracePeriodSeconds: 0``, the last stage of a deletion that has outlived
    its ForcefulDeletionGracePeriod.
    """

    index: int
    api_version: str
    kind: str
    namespace: str
    name: str
    force: bool = False
    # The uid of the object confirmed to be controlled by this AppWrapper (seen with its
    # controller owner reference, or returned by our create). The delete carries it as a
    # precondition, so it can only ever remove that very object; without one (nothing was
    # confirmed ours, e.g. the read failed) the service does not delete at all.
    uid: str = ""


@dataclass(frozen=True, slots=True)
class DeletePods:
    """Delete these labelled pods; NotFound is success.

    Without ``force``, each with its own grace period, once no component is left: with
    Background propagation the garbage collector would delete them too, but it finds and
    deletes them one after another, and a large workload's reset waits for the last one.
    With ``force``, with ``gracePeriodSeconds: 0`` (pods stuck terminating).
    """

    namespace: str
    names: tuple[str, ...]
    force: bool = False


@dataclass(frozen=True, slots=True)
class ExcludeNodes:
    """Record ``nodes`` as the AppWrapper's excluded nodes (the ``respawn.dev/excluded-nodes``
    annotation, by merge patch; no nodes removes it), read when its components are recreated."""

    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EmitEvent:
    """Record a Kubernetes Event on the AppWrapper.

    ``id`` is deterministic (see :mod:`services.lifecycle.announcements`): the Event is created
    under a name derived from it, so a second copy (a re-send after a crash, or by another
    replica) is refused by the API server as AlreadyExists instead of recorded twice. Without an
    id the Event gets a generated name.
    """

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    id: str = ""


@dataclass(frozen=True, slots=True)
class PublishLifecycleEvent:
    """Publish ``event`` on ``respawn.lifecycle.<namespace>.<name>``.

    ``msg_id`` is deterministic (AppWrapper uid, event type, attempt, phase and the transition's
    time as the status records it), so that a copy re-sent after a crash, by this or another
    instance, is dropped by JetStream's de-duplication.
    """

    event: LifecycleEvent
    msg_id: str


Action = CreateComponent | DeleteComponent | DeletePods | ExcludeNodes | EmitEvent | PublishLifecycleEvent


class LifecycleEventType(StrEnum):
    """Values of ``LifecycleEvent.event``: part of the public lifecycle stream."""

    # Every phase change, with phase and previous_phase.
    PHASE_CHANGED = "PhaseChanged"
    # A reset began: resetting_count is the attempt number after it, reason the cause.
    RESET_STARTED = "ResetStarted"
    # Everything was deleted and the retry pause is over; the workload is being recreated.
    RESET_FINISHED = "ResetFinished"
    # The ForcefulDeletionGracePeriod ran out with resources left; deletion went to grace 0.
    DELETION_FORCEFUL = "DeletionForceful"


class CreateResult(StrEnum):
    """How one CreateComponent call ended."""

    CREATED = "Created"
    # AlreadyExists; ``controlled_by_us`` says whether its controller owner is this AppWrapper.
    ALREADY_EXISTS = "AlreadyExists"
    # The API server rejected the object as Invalid (422): retrying cannot help.
    INVALID = "Invalid"
    # The kind is not served (no CRD / NoMatch): retrying within a reconcile cannot help.
    NO_MATCH = "NoMatch"
    # Anything else (throttling, timeouts, webhooks down, quota, forbidden...): retried.
    ERROR = "Error"


@dataclass(frozen=True, slots=True)
class CreateOutcome:
    result: CreateResult
    # The name the object got (differs from the template with metadata.generateName).
    name: str = ""
    controlled_by_us: bool = True
    message: str = ""
    # The uid of the object, when it is ours (created, or found existing under our controller
    # owner reference): what a later delete of it carries as its precondition.
    uid: str = ""

    @property
    def fatal(self) -> bool:
        """Whether the failure makes the AppWrapper Failed at once, with no retry."""
        if self.result is CreateResult.ALREADY_EXISTS:
            return not self.controlled_by_us
        return self.result in (CreateResult.INVALID, CreateResult.NO_MATCH)

    @property
    def succeeded(self) -> bool:
        return self.result is CreateResult.CREATED or (
            self.result is CreateResult.ALREADY_EXISTS and self.controlled_by_us
        )
