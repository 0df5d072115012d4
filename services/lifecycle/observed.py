"""What the lifecycle service saw in the cluster, as input to one decision.

The reader (:mod:`services.lifecycle.reader`) fills this just before each call of
:func:`services.lifecycle.machine.reconcile`: a GET of each component, the labelled pods and the
nodes (from watch caches, or a LIST). Anything it did not look at is left
:attr:`Presence.UNKNOWN` / ``None``, and the machine treats unknown conservatively: an unknown
component is never reported missing (that would fail the workload), but is never assumed gone
either (that would release quota while it may still run).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from services.lifecycle.actions import CreateOutcome
from shared import metrics
from shared.appwrapper.model import as_mapping
from shared.kube.watch import WatchEvent
from shared.ownership import OwnerLink, controller_link

__all__ = [
    "Observed",
    "ObservedComponent",
    "ObservedNode",
    "ObservedPod",
    "Presence",
    "controller_uid",
    "fold_safely",
]

log = logging.getLogger(__name__)

SKIPPED = metrics.counter(
    "respawn_lifecycle_watch_events_skipped",
    "Watch events lifecycle could not use (each logged with its object), by kind",
    ["what"],
)


def fold_safely(apply: Callable[[WatchEvent], None], event: WatchEvent, what: str) -> None:
    """Fold one watch event into a cache; one that cannot be used is logged, counted and
    skipped, so that a single malformed object never stops the cache (nor the service)."""
    try:
        apply(event)
    except Exception as exc:
        SKIPPED.labels(what=what).inc()
        meta = event.obj.get("metadata") if isinstance(event.obj, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        log.warning(
            "skipping a %s %s event about %s/%s: %s: %s",
            what,
            event.type,
            meta.get("namespace", ""),
            meta.get("name", "?"),
            type(exc).__name__,
            exc,
        )


class Presence(StrEnum):
    UNKNOWN = "Unknown"
    ABSENT = "Absent"
    PRESENT = "Present"
    # Exists with a deletionTimestamp: on its way out, no longer counted as deployed.
    DELETING = "Deleting"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def controller_uid(obj: Mapping[str, Any]) -> str:
    """The uid its controller owner reference names ("" if it has none)."""
    for owner in _list(as_mapping(obj.get("metadata")).get("ownerReferences")):
        if isinstance(owner, Mapping) and owner.get("controller") is True:
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
    """One pod labelled ``workload.codeflare.dev/appwrapper=<name>`` that still exists (in an
    :class:`Observed`: one whose controller owner chain leads to that AppWrapper, see
    :meth:`services.lifecycle.reader.Reader.observe_pods`)."""

    name: str
    phase: str = "Pending"
    # Has a deletionTimestamp; one that stays like this is "stuck terminating".
    terminating: bool = False
    # As ObservedComponent.uid: a force delete touches only the pod that was seen.
    uid: str = ""
    # Its controller owner reference, the first link of the chain that makes it the AppWrapper's.
    controller: OwnerLink | None = None
    # spec.nodeName: where it runs ("" while unscheduled), for the consistency mode of deletion.
    node: str = ""

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> ObservedPod:
        """What a decision needs of a pod object (from a LIST or a watch event)."""
        meta = as_mapping(pod.get("metadata"))
        return cls(
            name=str(meta.get("name", "")),
            phase=str(as_mapping(pod.get("status")).get("phase") or "Pending"),
            terminating=bool(meta.get("deletionTimestamp")),
            uid=str(meta.get("uid") or ""),
            controller=controller_link(pod),
            node=str(as_mapping(pod.get("spec")).get("nodeName") or ""),
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
        status = as_mapping(node.get("status"))
        return cls(
            name=str(as_mapping(node.get("metadata")).get("name", "")),
            ready=any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in _list(status.get("conditions"))
                if isinstance(c, Mapping)
            ),
            unschedulable=bool(as_mapping(node.get("spec")).get("unschedulable")),
            allocatable={str(k): str(v) for k, v in as_mapping(status.get("allocatable")).items()},
        )


@dataclass(frozen=True, slots=True)
class Observed:
    # Parallel to spec.components; missing trailing entries count as UNKNOWN.
    components: tuple[ObservedComponent, ...] = ()
    # Every pod of the AppWrapper (labelled and in its owner tree) that still exists; None when
    # the pods were not listed (or their owners not read), which keeps a
    # deletion from ever being declared complete on a guess.
    pods: tuple[ObservedPod, ...] | None = None
    # Results of the CreateComponent actions of the previous plan, by component index.
    created: Mapping[int, CreateOutcome] = field(default_factory=dict)
    # The cluster's nodes, for node exclusion on a reset; None when not read.
    nodes: tuple[ObservedNode, ...] | None = None
    # False when ``pods`` is the pod cache's "none so far" taken without a LIST (a workload
    # starting or running): good for counting pods, never for concluding that none is left.
    pods_confirmed: bool = True

    @property
    def pods_gone_known(self) -> tuple[ObservedPod, ...] | None:
        """``pods`` where an empty answer may complete a deletion: None (unknown) for an
        unconfirmed "none"."""
        return self.pods if self.pods or self.pods_confirmed else None

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
