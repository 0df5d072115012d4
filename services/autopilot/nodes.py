"""Which nodes are unhealthy for which resource, as Autopilot sees them.

The state is a value: for every configured resource, three disjoint sets of node names, one per
taint effect. :func:`apply` folds one node observation into it and reports which resources'
sets actually moved, so the service publishes a :class:`~shared.messages.NodeVerdict` only on a
real change (node observations arrive on every status heartbeat; re-publishing the same sets
would wake every consumer for nothing).

Each verdict carries the *complete* sets for its resource rather than a delta. A consumer that
missed a message, or a restarted autopilot that rebuilds its state by replaying the latest
observation of each node, therefore converges on the right answer.

Only node labels count, as upstream: a cordoned or NotReady node is already avoided by the
scheduler and is not an Autopilot signal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

from shared.messages import NodeObservation, NodeVerdict
from shared.taints import (
    NO_EXECUTE,
    NO_SCHEDULE,
    PREFER_NO_SCHEDULE,
    Effect,
    ResourceTaints,
    strongest_effect,
)


@dataclass(frozen=True)
class ResourceNodes:
    """Unhealthy nodes for one resource. A node is in at most one set: the one of its strongest effect."""

    no_schedule: frozenset[str] = frozenset()
    prefer_no_schedule: frozenset[str] = frozenset()
    no_execute: frozenset[str] = frozenset()

    def effect_of(self, node: str) -> Effect | None:
        if node in self.no_execute:
            return NO_EXECUTE
        if node in self.no_schedule:
            return NO_SCHEDULE
        if node in self.prefer_no_schedule:
            return PREFER_NO_SCHEDULE
        return None

    def with_node(self, node: str, effect: Effect | None) -> ResourceNodes:
        """A copy in which ``node`` is in the set of ``effect`` only (in none if ``effect`` is None)."""
        return ResourceNodes(
            no_schedule=_put(self.no_schedule, node, effect == NO_SCHEDULE),
            prefer_no_schedule=_put(self.prefer_no_schedule, node, effect == PREFER_NO_SCHEDULE),
            no_execute=_put(self.no_execute, node, effect == NO_EXECUTE),
        )

    @property
    def avoided(self) -> frozenset[str]:
        """Nodes that new pods using the resource must not land on (NoSchedule and NoExecute)."""
        return self.no_schedule | self.no_execute

    def __bool__(self) -> bool:
        return bool(self.no_schedule or self.prefer_no_schedule or self.no_execute)


_EMPTY = ResourceNodes()


def _put(nodes: frozenset[str], node: str, present: bool) -> frozenset[str]:
    # Return the same object when nothing changes so unchanged state stays cheap to compare.
    if present == (node in nodes):
        return nodes
    return nodes | {node} if present else nodes - {node}


@dataclass(frozen=True)
class NodeHealthState:
    """Unhealthy nodes per resource name. Resources with no unhealthy node are absent."""

    by_resource: Mapping[str, ResourceNodes] = field(default_factory=lambda: MappingProxyType({}))

    def nodes(self, resource: str) -> ResourceNodes:
        return self.by_resource.get(resource, _EMPTY)

    def effect_of(self, resource: str, node: str) -> Effect | None:
        return self.nodes(resource).effect_of(node)

    def no_execute_resources(self, node: str) -> frozenset[str]:
        """Resources for which ``node`` is marked NoExecute (pods using them must migrate)."""
        return frozenset(r for r, sets in self.by_resource.items() if node in sets.no_execute)


def apply(
    state: NodeHealthState, observation: NodeObservation, resource_taints: ResourceTaints
) -> tuple[NodeHealthState, frozenset[str]]:
    """Fold one node observation into ``state``.

    Returns the new state and the resources whose node sets changed. A deleted node, or one whose
    labels no longer match any entry, leaves every set. Resources that are in ``state`` but no
    longer configured are cleaned up node by node as observations arrive.
    """
    node = observation.name
    labels: Mapping[str, str] = {} if observation.deleted else observation.labels
    updated = dict(state.by_resource)
    changed: set[str] = set()
    for resource in (*resource_taints, *(r for r in state.by_resource if r not in resource_taints)):
        current = state.nodes(resource)
        effect = strongest_effect(labels, resource_taints.get(resource, ()))
        if current.effect_of(node) == effect:
            continue
        new = current.with_node(node, effect)
        changed.add(resource)
        if new:
            updated[resource] = new
        else:
            updated.pop(resource, None)
    if not changed:
        return state, frozenset()
    return NodeHealthState(MappingProxyType(updated)), frozenset(changed)


def rebuild(observations: Iterable[NodeObservation], resource_taints: ResourceTaints) -> NodeHealthState:
    """State from scratch, e.g. after a restart, from the latest observation of each node."""
    state = NodeHealthState()
    for observation in observations:
        state, _ = apply(state, observation, resource_taints)
    return state


def verdicts(state: NodeHealthState, resources: Iterable[str], now: datetime) -> list[NodeVerdict]:
    """One complete verdict per resource in ``resources`` (typically the changed ones), sorted by name.

    A resource with no unhealthy node yields a verdict with empty sets: that is how consumers
    learn that the last bad node recovered.
    """
    out: list[NodeVerdict] = []
    for resource in sorted(set(resources)):
        sets = state.nodes(resource)
        out.append(
            NodeVerdict(
                resource=resource,
                no_schedule=tuple(sorted(sets.no_schedule)),
                prefer_no_schedule=tuple(sorted(sets.prefer_no_schedule)),
                no_execute=tuple(sorted(sets.no_execute)),
                decided_at=now,
            )
        )
    return out


def from_verdict(state: NodeHealthState, verdict: NodeVerdict) -> NodeHealthState:
    """Replace one resource's sets with those of a received verdict (for consumers of node verdicts)."""
    updated = dict(state.by_resource)
    sets = ResourceNodes(
        no_schedule=frozenset(verdict.no_schedule),
        prefer_no_schedule=frozenset(verdict.prefer_no_schedule),
        no_execute=frozenset(verdict.no_execute),
    )
    if sets:
        updated[verdict.resource] = sets
    else:
        updated.pop(verdict.resource, None)
    return NodeHealthState(MappingProxyType(updated))
