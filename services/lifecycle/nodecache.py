"""Lifecycle's view of the cluster's nodes, kept by one list-then-watch, for node exclusion.

A reset after failed pods decides which nodes the next attempt avoids, and how many it may
avoid without leaving the workload nowhere to run; for that it needs every node's readiness,
cordon and allocatable resources. Reading them from a watch costs nothing at decision time: the
decision sits on the way from an Unhealthy verdict to the reset's status write, where a LIST of
every node (tens of kilobytes per node) would be one more round trip, once per reset.

Only what a decision needs is kept (:class:`ObservedNode`), a few hundred bytes per node.
"""

from __future__ import annotations

from services.lifecycle.observed import ObservedNode, fold_safely
from shared.kube import Kube, ResourceRef
from shared.kube.watch import WatchEvent, list_then_watch

__all__ = ["NodeCache"]


class NodeCache:
    """Nodes by name. Pure state plus one watch task."""

    def __init__(self) -> None:
        self._nodes: dict[str, ObservedNode] = {}
        self.synced = False

    def apply(self, event: WatchEvent) -> None:
        """Fold one watch event in."""
        if event.type == "SYNCED":
            self.synced = True
            return
        name = str((event.obj.get("metadata") or {}).get("name", ""))
        if event.type == "DELETED":
            self._nodes.pop(name, None)
        elif name:
            self._nodes[name] = ObservedNode.of(event.obj)

    def nodes(self) -> tuple[ObservedNode, ...] | None:
        """Every node, or None before the initial list has synced (an incomplete list would make
        the capacity check of node exclusion believe in fewer nodes than there are)."""
        if not self.synced:
            return None
        return tuple(sorted(self._nodes.values(), key=lambda n: n.name))

    async def run(self, kube: Kube, nodes_ref: ResourceRef) -> None:
        """Keep the cache current (never returns; cancel it to stop)."""
        async for event in list_then_watch(kube, nodes_ref):
            fold_safely(self.apply, event, "node")
