"""How many nodes a workload needs at least, so that node exclusion never leaves it nowhere to run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.lifecycle.observed import ObservedNode
from shared.appwrapper.podsets import component_pod_sets, get_at_path

__all__ = ["nodes_needed"]


def nodes_needed(aw: Mapping[str, Any], nodes: Sequence[ObservedNode]) -> int:
    """How many nodes the workload needs at least, judged by its extended-resource requests.

    Node exclusion must not exclude so many nodes that the workload cannot fit: for each
    extended resource (e.g. nvidia.com/gpu) the pods ask for, the total request divided by the
    largest per-node allocatable, rounded up. Unparseable quantities count as one.
    """
    totals: dict[str, int] = {}
    for comp in (aw.get("spec") or {}).get("components") or []:
        try:
            pod_sets = component_pod_sets(comp)
        except Exception:  # a malformed component is reported elsewhere
            continue
        for ps in pod_sets:
            try:
                template = get_at_path(comp.get("template") or {}, ps.path)
            except Exception:
                continue
            containers = ((template or {}).get("spec") or {}).get("containers") or []
            for c in containers:
                res = c.get("resources") or {}
                wanted = {**(res.get("requests") or {}), **(res.get("limits") or {})}
                for name, qty in wanted.items():
                    if "/" in name:  # extended resources only (cpu/memory rarely decide placement here)
                        totals[name] = totals.get(name, 0) + _quantity(qty) * ps.count
    needed = 1
    for name, total in totals.items():
        per_node = max((_quantity(n.allocatable.get(name, 0)) for n in nodes), default=0)
        if per_node > 0:
            needed = max(needed, -(-total // per_node))
    return needed


def _quantity(value: Any) -> int:
    # Extended resources are counted in whole units (the API server rejects fractions of them).
    try:
        return int(str(value))
    except ValueError:
        return 1
