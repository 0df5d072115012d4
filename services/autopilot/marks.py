"""Marks of node quarantine on the Node objects, for schedulers other than Respawn's placement.

Pure. With ``nodeQuarantine.nodeLabel`` and/or ``nodeQuarantine.nodeTaint`` set, a quarantined
node carries the label ``<key>=true`` and/or the taint ``<key>=true:NoSchedule``; both are
removed when the quarantine ends. What a node carries is known from its latest observation (the
watcher publishes labels and taints), so a restarted autopilot finds the marks it left and
removes those no longer due.

The taints of a Node are one list that the API server replaces whole (no merge by key), so the
patch writes the complete list, computed from the node as read, with its ``resourceVersion``: a
node changed meanwhile answers 409 and the mark is tried again on the next round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MARK_VALUE = "true"
MARK_EFFECT = "NoSchedule"


@dataclass(frozen=True)
class NodeMarks:
    label: str = ""
    taint: str = ""

    def __bool__(self) -> bool:
        return bool(self.label or self.taint)

    def _has_label(self, labels: Mapping[str, str]) -> bool:
        return labels.get(self.label) == MARK_VALUE

    def _has_taint(self, taints: Iterable[Mapping[str, str]]) -> bool:
        return any(t.get("key") == self.taint and t.get("effect") == MARK_EFFECT for t in taints)

    def complete(self, labels: Mapping[str, str], taints: Sequence[Mapping[str, str]]) -> bool:
        """Whether the node carries every configured mark."""
        return (not self.label or self._has_label(labels)) and (not self.taint or self._has_taint(taints))

    def present(self, labels: Mapping[str, str], taints: Sequence[Mapping[str, str]]) -> bool:
        """Whether the node carries any configured mark."""
        return (bool(self.label) and self._has_label(labels)) or (
            bool(self.taint) and self._has_taint(taints)
        )


NodeState = tuple[Mapping[str, str], Sequence[Mapping[str, str]]]


def due_marks(
    marks: NodeMarks, quarantined: frozenset[str], nodes: Mapping[str, NodeState]
) -> list[tuple[str, bool]]:
    """(node, add) for every known node whose marks differ from its quarantine, sorted by node."""
    if not marks:
        return []
    out: list[tuple[str, bool]] = []
    for node in sorted(nodes):
        labels, taints = nodes[node]
        if node in quarantined and not marks.complete(labels, taints):
            out.append((node, True))
        elif node not in quarantined and marks.present(labels, taints):
            out.append((node, False))
    return out


def mark_patch(marks: NodeMarks, node: Mapping[str, Any], add: bool) -> dict[str, Any]:
    """A merge patch of ``node`` (as read) that adds or removes the marks, guarded by its
    resourceVersion."""
    metadata: dict[str, Any] = {
        "resourceVersion": str((node.get("metadata") or {}).get("resourceVersion", ""))
    }
    patch: dict[str, Any] = {"metadata": metadata}
    if marks.label:
        metadata["labels"] = {marks.label: MARK_VALUE if add else None}
    if marks.taint:
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != marks.taint]
        if add:
            taints.append({"key": marks.taint, "value": MARK_VALUE, "effect": MARK_EFFECT})
        patch["spec"] = {"taints": taints}
    return patch
