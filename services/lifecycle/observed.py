"""What the lifecycle service saw in the cluster, as input to one decision.

The reader (:mod:`services.lifecycle.reader`) fills this just before each call of
:func:`services.lifecycle.machine.reconcile`: a GET of each component, the labelled pods and the
nodes (from watch caches, or a LIST). Anything it did not look at is left
:attr:`Presence.UNKNOWN` / ``None``, and the machine treats unknown conservatively: an unknown
component is never reported missing (that would fail the workload), but is never assumed gone
either (that would release quota while it may still run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from services.lifecycle.actions import CreateOutcome

__all__ = ["Observed", "ObservedComponent", "ObservedNode", "ObservedPod", "Presence", "controller_uid"]


class Presence(StrEnum):
    UNKNOWN = "Unknown"
    ABSENT = "Absent"
    PRESENT = "Present"
    # Exists with a deletionTimestamp: on its way out, no longer counted as deployed.
    DELETING = "Deleting"


def controller_uid(obj: Mapping[str, Any]) -> str:
    """The uid its controller owner reference names ("" if it has none)."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid", ""))
    return ""


@dataclass(frozen=True, slots=True)
class ObservedComponent:
    presence: Presence = Presence.UNKNOWN
    # Whether the object's controller owner reference is this AppWrapper (by uid).
    controlled_by_us: bool = True
    # The object's actual name, when known.
    name: str = ""
    # The uid of the object seen. The service deletes with it as a precondition, so a plan
    # computed from a view that has gone stale never deletes a newer object of the same name.
    uid: str = ""


@dataclass(frozen=True, slots=True)
class ObservedPod:
    """One pod labelled ``workload.codeflare.dev/appwrapper=<name>`` that still exists."""

    name: str
    phase: str = "Pending"
    # Has a deletionTimestamp; one that stays like this is "stuck terminating".
    terminating: bool = False
    # As ObservedComponent.uid: a force delete touches only the pod that was seen.
    uid: str = ""

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> ObservedPod:
        """What a decision needs of a pod object (from a LIST or a watch event)."""
        meta = pod.get("metadata") or {}
        return cls(
            name=str(meta.get("name", "")),
            phase=str((pod.get("status") or {}).get("phase") or "Pending"),
            terminating=bool(meta.get("deletionTimestamp")),
            uid=str(meta.get("uid") or ""),
        )


@dataclass(frozen=True, slots=True)
class ObservedNode:
    """One node of the cluster, as far as placing a recreated workload is concerned."""

    name: str
    ready: bool = True
    # spec.unschedulable: cordoned.
    unschedulable: bool = False
    # status.allocatable as the API server writes it (quantities as strings).
    allocatable: Mapping[str, str] = field(default_factory=dict)

    @property
    def schedulable(self) -> bool:
        """Whether new pods can land on it: Ready and not cordoned."""
        return self.ready and not self.unschedulable

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> ObservedNode:
        """What a decision needs of a node object (from a LIST or a watch event)."""
        status = node.get("status") or {}
        return cls(
            name=str((node.get("metadata") or {}).get("name", "")),
            ready=any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
                if isinstance(c, Mapping)
            ),
            unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
            allocatable={str(k): str(v) for k, v in (status.get("allocatable") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class Observed:
    # Parallel to spec.components; missing trailing entries count as UNKNOWN.
    components: tuple[ObservedComponent, ...] = ()
    # Every labelled pod that still exists; None when the pods were not listed, which keeps a
    # deletion from ever being declared complete on a guess.
    pods: tuple[ObservedPod, ...] | None = None
    # Results of the CreateComponent actions of the previous plan, by component index.
    created: Mapping[int, CreateOutcome] = field(default_factory=dict)
    # The cluster's nodes, for node exclusion on a reset; None when not read.
    nodes: tuple[ObservedNode, ...] | None = None

    def component(self, index: int) -> ObservedComponent:
        if 0 <= index < len(self.components):
            return self.components[index]
        return ObservedComponent()

    def count_pods(self) -> tuple[int, int, int, int]:
        """(pending, running, succeeded, failed), counted as upstream does.

        A Running pod that is being deleted is not counted as running (upstream #158); a Pending
        pod is pending even while it is being deleted; pods in phase Unknown are not counted.
        """
        pending = running = succeeded = failed = 0
        for pod in self.pods or ():
            if pod.phase == "Pending":
                pending += 1
            elif pod.phase == "Running":
                running += 0 if pod.terminating else 1
            elif pod.phase == "Succeeded":
                succeeded += 1
            elif pod.phase == "Failed":
                failed += 1
        return pending, running, succeeded, failed
