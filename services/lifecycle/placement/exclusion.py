"""Node exclusion on retry: keep a reset workload off the nodes its pods just failed on.

Upstream AppWrapper recreates a reset workload with no memory of where it failed, so a job with a
broken GPU can land on the same machine again and burn another retry. Respawn remembers, per
AppWrapper, the nodes on which failing pods ran and adds a required anti-affinity on them to the
recreated pods (see :func:`services.lifecycle.placement.affinity.exclude_nodes`).

The memory lives in an annotation on the AppWrapper, so it is visible with ``kubectl`` and
survives restarts without touching any upstream field:

- ``respawn.dev/excluded-nodes``: comma-separated node names, oldest first. Node names are DNS
  subdomains and cannot contain a comma, so the format needs no quoting.
- ``respawn.dev/node-exclusion``: ``"false"`` opts the AppWrapper out (``"true"`` or absent: on).

Exclusion must never be the reason a workload cannot run. The list is bounded (oldest dropped
first), and when the exclusions would leave fewer nodes able to host the workload than it needs,
the oldest exclusions of such nodes are dropped until enough remain, with a note for an Event.

A malformed annotation never stops a reset: it is read as its default, with a warning.

The decision is part of the reset's plan (:func:`exclude_on_reset`, called by the pure machine
when it resets a workload whose pods failed): an :class:`~services.lifecycle.actions.ExcludeNodes`
action and a ``NodesExcluded`` Event, carried out by whichever instance wins the reset's status
write, so once.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from services.lifecycle.actions import EmitEvent, ExcludeNodes
from services.lifecycle.observed import ObservedNode
from services.lifecycle.placement.capacity import nodes_needed
from shared.appwrapper.constants import RESPAWN_PREFIX

EXCLUDED_NODES_ANNOTATION: Final = f"{RESPAWN_PREFIX}excluded-nodes"
NODE_EXCLUSION_ANNOTATION: Final = f"{RESPAWN_PREFIX}node-exclusion"
DEFAULT_MAX_EXCLUDED_NODES: Final = 8
# Reason of the Kubernetes Event that tells the user which nodes the next attempt avoids.
NODES_EXCLUDED_EVENT: Final = "NodesExcluded"

# RFC 1123 subdomain, the syntax of a node name.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MAX_NODE_NAME = 253


def is_node_name(name: str) -> bool:
    return len(name) <= _MAX_NODE_NAME and _NODE_NAME.match(name) is not None


def parse_excluded_nodes(value: str | None) -> tuple[tuple[str, ...], str | None]:
    """The node names in an ``excluded-nodes`` annotation value, oldest first, and a warning if malformed.

    Duplicates are dropped (the first occurrence keeps its place). If any entry is not a valid
    node name the whole value is distrusted and read as empty: guessing which part is right could
    exclude the wrong machine.
    """
    if value is None:
        return (), None
    # Empty entries (a trailing comma, a hand edit) carry no meaning and are skipped.
    names = [part.strip() for part in value.split(",") if part.strip()]
    bad = [name for name in names if not is_node_name(name)]
    if bad:
        shown = ", ".join(repr(b) for b in bad[:3])
        return (), f"ignoring malformed {EXCLUDED_NODES_ANNOTATION} annotation: invalid node name(s) {shown}"
    return tuple(dict.fromkeys(names)), None


def format_excluded_nodes(nodes: Iterable[str]) -> str:
    """The annotation value for ``nodes`` (oldest first)."""
    return ",".join(nodes)


def excluded_nodes_patch(nodes: Sequence[str]) -> dict[str, str | None]:
    """A merge-patch fragment for ``metadata.annotations`` recording ``nodes`` (None removes the key)."""
    return {EXCLUDED_NODES_ANNOTATION: format_excluded_nodes(nodes) if nodes else None}


def exclusion_enabled(annotations: Mapping[str, str]) -> tuple[bool, str | None]:
    """Whether node exclusion is on for the AppWrapper, and a warning if the opt-out value is malformed."""
    raw = annotations.get(NODE_EXCLUSION_ANNOTATION)
    if raw is None:
        return True, None
    value = raw.strip().lower()
    if value == "false":
        return False, None
    if value == "true":
        return True, None
    return True, f"ignoring malformed {NODE_EXCLUSION_ANNOTATION} annotation {raw!r}: expected true or false"


@dataclass(frozen=True)
class ExclusionDecision:
    """What to exclude for the next attempt and what to tell the user about it."""

    enabled: bool
    # Nodes the recreated pods must avoid, oldest first; also the new annotation value.
    nodes: tuple[str, ...]
    added: tuple[str, ...] = ()
    # Dropped because the list is full (oldest first).
    dropped_for_limit: tuple[str, ...] = ()
    # Dropped because the workload would otherwise have nowhere to run.
    dropped_for_capacity: tuple[str, ...] = ()
    # Human-readable, for an Event; empty when nothing needs saying.
    note: str = ""
    warnings: tuple[str, ...] = ()

    def annotation_patch(self) -> dict[str, str | None]:
        """A merge-patch fragment for ``metadata.annotations`` (None removes the key)."""
        return excluded_nodes_patch(self.nodes)


def decide_exclusions(
    annotations: Mapping[str, str],
    *,
    failed_nodes: Iterable[str],
    candidates: Collection[str],
    limit: int = DEFAULT_MAX_EXCLUDED_NODES,
    min_nodes: int = 1,
) -> ExclusionDecision:
    """The excluded-node list for the next attempt of an AppWrapper being reset.

    ``annotations`` are the AppWrapper's; ``failed_nodes`` are the nodes the failing pods ran on
    (empty names, from pods that were never scheduled, are ignored). ``candidates`` are the nodes
    that could host the workload's pods if nothing were excluded: schedulable, not flagged by
    Autopilot, and with allocatable capacity for a pod. ``min_nodes`` is how many distinct
    candidates the workload needs (1 when all its pods fit on one node).

    A node that fails again moves to the newest end of the list, so a repeat offender is the last
    to be forgiven. If the candidates fall short of ``min_nodes`` even with no exclusion at all,
    exclusion is not what stops the workload and the list is kept.
    """
    if limit < 0:
        raise ValueError(f"limit must not be negative, got {limit}")
    if min_nodes < 0:
        raise ValueError(f"min_nodes must not be negative, got {min_nodes}")
    enabled, opt_warning = exclusion_enabled(annotations)
    current, list_warning = parse_excluded_nodes(annotations.get(EXCLUDED_NODES_ANNOTATION))
    warnings = tuple(w for w in (opt_warning, list_warning) if w)
    if not enabled:
        return ExclusionDecision(enabled=False, nodes=(), warnings=warnings)

    nodes = list(current)
    added: list[str] = []
    for node in dict.fromkeys(n for n in failed_nodes if n):
        if node in nodes:
            nodes.remove(node)
        else:
            added.append(node)
        nodes.append(node)

    dropped_for_limit = tuple(nodes[: max(0, len(nodes) - limit)])
    nodes = nodes[len(dropped_for_limit) :]

    dropped_for_capacity: list[str] = []
    if len(candidates) >= min_nodes:
        available = len(candidates) - sum(1 for n in nodes if n in candidates)
        for node in list(nodes):
            if available >= min_nodes:
                break
            if node in candidates:
                nodes.remove(node)
                dropped_for_capacity.append(node)
                available += 1

    # A node excluded and forgiven in the same decision was never really added.
    added = [n for n in added if n in nodes]
    return ExclusionDecision(
        enabled=True,
        nodes=tuple(nodes),
        added=tuple(added),
        dropped_for_limit=dropped_for_limit,
        dropped_for_capacity=tuple(dropped_for_capacity),
        note=_note(added, dropped_for_limit, dropped_for_capacity, limit),
        warnings=warnings,
    )


def _note(
    added: Iterable[str], dropped_for_limit: Iterable[str], dropped_for_capacity: Iterable[str], limit: int
) -> str:
    parts: list[str] = []
    if added := list(added):
        parts.append(f"excluding node(s) {', '.join(added)} where pods failed")
    if dropped_for_limit := list(dropped_for_limit):
        parts.append(
            f"no longer excluding {', '.join(dropped_for_limit)}: at most {limit} nodes are excluded"
        )
    if dropped_for_capacity := list(dropped_for_capacity):
        parts.append(
            f"no longer excluding {', '.join(dropped_for_capacity)}: "
            "otherwise no node would be left that can run the workload"
        )
    return "; ".join(parts)


def exclude_on_reset(
    aw: Mapping[str, Any],
    *,
    failed_nodes: Iterable[str],
    nodes: Sequence[ObservedNode],
    limit: int = DEFAULT_MAX_EXCLUDED_NODES,
) -> tuple[ExcludeNodes, EmitEvent] | None:
    """What a reset of ``aw`` after pods failed on ``failed_nodes`` does about node exclusion.

    ``nodes`` are the cluster's nodes; those that accept new pods are the candidates. None when
    there is nothing to record: the AppWrapper opted out, or its annotation already says it.
    """
    metadata = aw.get("metadata")
    annotations: Mapping[str, str] = (metadata if isinstance(metadata, Mapping) else {}).get(
        "annotations"
    ) or {}
    usable = [n for n in nodes if n.schedulable]
    decision = decide_exclusions(
        annotations,
        failed_nodes=failed_nodes,
        candidates=[n.name for n in usable],
        limit=limit,
        min_nodes=nodes_needed(aw, usable),
    )
    if not decision.enabled:
        return None
    if all(annotations.get(k) == v for k, v in decision.annotation_patch().items()):
        return None
    message = decision.note or f"the next attempts avoid nodes {', '.join(decision.nodes)} where pods failed"
    return ExcludeNodes(nodes=decision.nodes), EmitEvent(
        type="Normal", reason=NODES_EXCLUDED_EVENT, message=message
    )
