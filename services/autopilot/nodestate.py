"""Which nodes are lost: not Ready, out of contact, or deleted (docs/autopilot.md, "Node state").

Failure classification reads a failed pod's node state (the default table's first row: a pod
whose node is NotReady, Unknown or Deleted failed because the node did, ``Transient NodeLost``).
Health does not watch nodes; autopilot, which replays every node's latest observation anyway,
keeps the lost nodes here and publishes them as the node verdict of the pseudo-resource
:data:`~shared.messages.NODE_STATE_RESOURCE` whenever the set changes.

Pure: the state is a value, :func:`observe` folds one node observation into it and
:func:`expire` forgets deleted nodes after ``keep_deleted``. Every time in it comes from the
observations themselves (the Ready condition's lastTransitionTime, the tombstone's observation
time), never from the reader's clock, so every replica, and a restarted one replaying the latest
observation of each node, holds the same entries. A deleted node's tombstone is the latest
observation of its subject, so the replay also brings back the deleted nodes; the expiry bounds
how many are remembered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final

from shared.kubetime import as_utc
from shared.messages import NODE_STATE_RESOURCE, LostNode, LostNodeState, NodeObservation, NodeVerdict

__all__ = [
    "KEEP_DELETED",
    "LostNodes",
    "expire",
    "lost_state",
    "node_state_verdict",
    "observe",
]

# How long a deleted node is remembered: long enough for the pods it took with it to be seen
# failing and judged (a failure grace period is minutes), short enough that a cluster that
# churns nodes keeps a bounded list.
KEEP_DELETED: Final = timedelta(hours=1)


@dataclass(frozen=True)
class LostNodes:
    """The lost nodes by name. A node that is Ready (or unknown to autopilot) is absent."""

    entries: Mapping[str, LostNode] = field(default_factory=lambda: MappingProxyType({}))

    def listed(self) -> tuple[LostNode, ...]:
        """The entries sorted by node name, as the verdict carries them."""
        return tuple(self.entries[name] for name in sorted(self.entries))


def lost_state(observation: NodeObservation) -> LostNodeState | None:
    """The node's lost state, or None when it is Ready.

    A node whose Ready condition is Unknown is out of contact (the node controller writes that
    when the kubelet stopped reporting); any other not-Ready node, including one that has no Ready
    condition yet, is NotReady.
    """
    if observation.deleted:
        return "Deleted"
    if observation.ready:
        return None
    return "Unknown" if observation.ready_status == "Unknown" else "NotReady"


def observe(state: LostNodes, observation: NodeObservation) -> LostNodes:
    """Fold one node observation in; returns ``state`` itself when nothing changed."""
    node = observation.name
    current = state.entries.get(node)
    lost = lost_state(observation)
    if lost is None:
        if current is None:
            return state
        entries = dict(state.entries)
        del entries[node]
        return LostNodes(MappingProxyType(entries))
    if current is not None and current.state == lost:
        return state  # still so since it became so
    if lost == "Deleted" or observation.ready_since is None:
        since = as_utc(observation.observed_at)
    else:
        since = as_utc(observation.ready_since)
    entries = dict(state.entries)
    entries[node] = LostNode(node=node, state=lost, since=since)
    return LostNodes(MappingProxyType(entries))


def expire(state: LostNodes, now: datetime, keep_deleted: timedelta = KEEP_DELETED) -> LostNodes:
    """Forget the nodes deleted ``keep_deleted`` or longer before ``now``; ``state`` itself when none."""
    now = as_utc(now)
    old = [
        n for n, e in state.entries.items() if e.state == "Deleted" and as_utc(e.since) + keep_deleted <= now
    ]
    if not old:
        return state
    entries = dict(state.entries)
    for name in old:
        del entries[name]
    return LostNodes(MappingProxyType(entries))


def node_state_verdict(state: LostNodes, now: datetime) -> NodeVerdict:
    """The complete verdict: every lost node, whatever resources its pods use."""
    return NodeVerdict(resource=NODE_STATE_RESOURCE, decided_at=now, lost_nodes=state.listed())
