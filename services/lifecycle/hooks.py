"""Pod-template hooks lifecycle applies when it (re)creates components: Autopilot.

Anti-affinity keeps new pods off nodes Autopilot flagged for the resources they use, node
exclusion keeps a reset workload off the nodes where its pods failed (recorded in the
AppWrapper's ``respawn.dev/excluded-nodes`` annotation), and quarantine keeps every pod off the
nodes Autopilot quarantined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.lifecycle.placement.affinity import exclude_nodes, inject_anti_affinity
from services.lifecycle.placement.exclusion import (
    EXCLUDED_NODES_ANNOTATION,
    exclusion_enabled,
    parse_excluded_nodes,
)
from services.lifecycle.quarantined import QuarantinedNodes
from services.lifecycle.templating import PodTemplateContext, PodTemplateHook
from shared.config import OperatorConfig


def _pod_spec(template: dict[str, Any]) -> dict[str, Any] | None:
    spec = template.get("spec")
    return spec if isinstance(spec, dict) else None


def anti_affinity_hook(config: OperatorConfig) -> PodTemplateHook:
    taints = config.autopilot.resource_taints
    weight = config.autopilot.preferred_weight

    def hook(context: PodTemplateContext, pod_template: dict[str, Any]) -> dict[str, Any]:
        spec = _pod_spec(pod_template)
        if spec is not None:
            pod_template["spec"] = inject_anti_affinity(spec, taints, weight)
        return pod_template

    return hook


def node_exclusion_hook() -> PodTemplateHook:
    def hook(context: PodTemplateContext, pod_template: dict[str, Any]) -> dict[str, Any]:
        metadata = context.appwrapper.get("metadata")
        annotations: Mapping[str, str] = (metadata or {}).get("annotations") or {}
        enabled, _ = exclusion_enabled(annotations)
        if not enabled:
            return pod_template
        nodes, _ = parse_excluded_nodes(annotations.get(EXCLUDED_NODES_ANNOTATION))
        spec = _pod_spec(pod_template)
        if nodes and spec is not None:
            pod_template["spec"] = exclude_nodes(spec, list(nodes))
        return pod_template

    return hook


def quarantine_hook(quarantined: QuarantinedNodes) -> PodTemplateHook:
    """Keep every pod off the nodes Autopilot quarantined, as they are when the pod is created
    (a quarantine whose end has passed no longer counts, :meth:`QuarantinedNodes.in_force`)."""

    def hook(context: PodTemplateContext, pod_template: dict[str, Any]) -> dict[str, Any]:
        nodes = sorted(quarantined.in_force(context.now))
        spec = _pod_spec(pod_template)
        if nodes and spec is not None:
            pod_template["spec"] = exclude_nodes(spec, nodes)
        return pod_template

    return hook


def hooks_for(
    config: OperatorConfig, quarantined: QuarantinedNodes | None = None
) -> Sequence[PodTemplateHook]:
    hooks: list[PodTemplateHook] = []
    if config.autopilot.inject_anti_affinities:
        hooks.append(anti_affinity_hook(config))
    if config.node_exclusion.enabled:
        hooks.append(node_exclusion_hook())
    if quarantined is not None:
        hooks.append(quarantine_hook(quarantined))
    return hooks
