"""Which AppWrapper a pod belongs to, by its controller owner chain (pure).

The AppWrapper label (``workload.codeflare.dev/appwrapper``) is how pods are found, but anyone who
may create a pod in a namespace may put it on one. So a labelled pod counts for AppWrapper X only
if following controller owner references up from the pod (``ownerReferences[]`` with
``controller: true``) reaches X itself, by X's uid: pod → Job, or pod → ReplicaSet → Deployment,
or pod → Job → JobSet, … → the wrapped component, whose controller is X; or the pod is itself a
wrapped component controlled by X. The chain must also end at the AppWrapper the label names:
the label selects, the chain confirms.

:func:`attribute` takes what is known of the objects on the way, by uid, and says one of:

- ``OWNED``: the chain reaches the AppWrapper (``appwrapper_uid``).
- ``FOREIGN``: it certainly does not (no controller, a chain that ends at an object that has no
  controller or at another AppWrapper, a cycle, a chain longer than ``max_depth``, or an owner
  that may not be read), with the reason.
- ``PENDING``: an object on the way is not known yet (``need`` names it): look it up, or wait for
  a watch to bring it, and ask again.
- ``ORPHANED``: an object on the way no longer exists (``broken`` names it). Its dependents are
  what the garbage collector deletes next.

Who does the looking up is the caller's business (:class:`shared.kube.owners.OwnerCache`).
What an object's controller was is a fact about its uid (uids are never reused), so what is
known stays true after the object is deleted: the pods a deleted component leaves behind still
belong to its AppWrapper while they terminate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from shared.appwrapper.constants import GROUP, KIND

__all__ = [
    "MAX_CHAIN_DEPTH",
    "Attribution",
    "ChainNode",
    "NodeState",
    "Outcome",
    "OwnerLink",
    "Reason",
    "attribute",
    "controller_link",
    "node_of",
]

# The longest chain followed, counting the pod's own controller: the deepest upstream-compatible
# one (pod → Job → JobSet → component → AppWrapper, or pod → ReplicaSet → Deployment → …) is
# four links; a longer one is not a workload Respawn wraps.
MAX_CHAIN_DEPTH: Final = 8


class Outcome(StrEnum):
    OWNED = "owned"
    FOREIGN = "foreign"
    PENDING = "pending"
    ORPHANED = "orphaned"


class Reason(StrEnum):
    """Why a pod is not (yet) attributed: the ``reason`` label of the metrics that count them."""

    # The pod has no controller owner reference.
    NO_OWNER = "no-owner"
    # The chain ends at an object that has no controller and is not an AppWrapper.
    FOREIGN_OWNER = "foreign-owner"
    # The chain ends at an AppWrapper other than the one the label names (or another incarnation).
    OTHER_APPWRAPPER = "other-appwrapper"
    # Longer than MAX_CHAIN_DEPTH, or a cycle.
    TOO_DEEP = "too-deep"
    # An owner on the way may not be read (forbidden, or its kind is not served).
    UNREADABLE = "owner-unreadable"
    # An owner on the way no longer exists (ORPHANED).
    OWNER_GONE = "owner-gone"
    # Not resolved in time (PENDING for too long; the caller decides how long).
    UNRESOLVED = "unresolved"


@dataclass(frozen=True, slots=True)
class OwnerLink:
    """One owner reference: which object, by kind, name and uid."""

    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def is_appwrapper(self) -> bool:
        return self.kind == KIND and self.group == GROUP


class NodeState(StrEnum):
    # The object was seen: its controller is known.
    PRESENT = "present"
    # No object with this uid exists any more (a GET found nothing, or a newer namesake).
    GONE = "gone"
    # The object may not be read (forbidden, or its kind is not served).
    UNREADABLE = "unreadable"


@dataclass(frozen=True, slots=True)
class ChainNode:
    """What is known of one object on a chain: its uid, and its controller (None: it has none)."""

    uid: str
    controller: OwnerLink | None = None
    state: NodeState = NodeState.PRESENT


@dataclass(frozen=True, slots=True)
class Attribution:
    outcome: Outcome
    reason: Reason | None = None
    # OWNED: the AppWrapper's uid.
    appwrapper_uid: str = ""
    # PENDING: the object to learn about (an AppWrapper: the uid of the one the label names).
    need: OwnerLink | None = None
    # ORPHANED: the first owner on the way that no longer exists.
    broken: OwnerLink | None = None
    # The links followed, the pod's controller first.
    chain: tuple[OwnerLink, ...] = ()

    @property
    def owned(self) -> bool:
        return self.outcome is Outcome.OWNED


def controller_link(obj: Any) -> OwnerLink | None:
    """The object's controller owner reference, or None (none, or one too malformed to follow)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    owners = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, Mapping) and owner.get("controller") is True:
            fields = [owner.get(k) for k in ("apiVersion", "kind", "name", "uid")]
            strings = [f for f in fields if isinstance(f, str) and f]
            return OwnerLink(*strings) if len(strings) == len(fields) else None
    return None


def node_of(obj: Any) -> ChainNode | None:
    """What ``obj`` (a read or watched object) tells of its place on a chain; None without a uid."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if not isinstance(uid, str) or not uid:
        return None
    return ChainNode(uid=uid, controller=controller_link(obj))


def attribute(
    controller: OwnerLink | None,
    known: Mapping[str, ChainNode],
    *,
    appwrapper_uid: str | None,
    max_depth: int = MAX_CHAIN_DEPTH,
) -> Attribution:
    """Where the chain that starts at a pod's ``controller`` ends, given the objects ``known`` by
    uid. ``appwrapper_uid``: the uid of the AppWrapper the pod's label names, None while it is
    not known (the answer is then PENDING on it, if the chain gets that far)."""
    chain: list[OwnerLink] = []
    link = controller
    while link is not None:
        if len(chain) >= max_depth or any(seen.uid == link.uid for seen in chain):
            return Attribution(Outcome.FOREIGN, Reason.TOO_DEEP, chain=tuple(chain))
        chain.append(link)
        if link.is_appwrapper:
            if appwrapper_uid is None:
                return Attribution(Outcome.PENDING, need=link, chain=tuple(chain))
            if link.uid != appwrapper_uid:
                return Attribution(Outcome.FOREIGN, Reason.OTHER_APPWRAPPER, chain=tuple(chain))
            return Attribution(Outcome.OWNED, appwrapper_uid=link.uid, chain=tuple(chain))
        node = known.get(link.uid)
        if node is None:
            return Attribution(Outcome.PENDING, need=link, chain=tuple(chain))
        if node.state is NodeState.GONE:
            return Attribution(Outcome.ORPHANED, Reason.OWNER_GONE, broken=link, chain=tuple(chain))
        if node.state is NodeState.UNREADABLE:
            return Attribution(Outcome.FOREIGN, Reason.UNREADABLE, chain=tuple(chain))
        link = node.controller
    return Attribution(
        Outcome.FOREIGN, Reason.FOREIGN_OWNER if chain else Reason.NO_OWNER, chain=tuple(chain)
    )
