"""Lifecycle keeps every pod it creates off the nodes Autopilot quarantined."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from services.lifecycle.hooks import hooks_for
from services.lifecycle.quarantined import QuarantinedNodes
from services.lifecycle.templating import PodTemplateContext
from shared.config import OperatorConfig
from shared.messages import QUARANTINE_RESOURCE, NodeVerdict, QuarantinedNode

T0 = datetime(2030, 1, 1, tzinfo=UTC)
CONTEXT = PodTemplateContext(
    appwrapper={"metadata": {"name": "aw"}}, component_index=0, pod_set_index=0, path=""
)


def quarantine(nodes: tuple[str, ...], at: datetime = T0, resource: str = QUARANTINE_RESOURCE) -> NodeVerdict:
    return NodeVerdict(resource=resource, no_schedule=nodes, decided_at=at)


def render(quarantined: QuarantinedNodes, now: datetime | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    context = dataclasses.replace(CONTEXT, now=now)
    for hook in hooks_for(OperatorConfig(), quarantined):
        template = hook(context, template)
    return template


def excluded(template: dict[str, Any]) -> list[str]:
    terms = template["spec"].get("affinity", {}).get("nodeAffinity", {})
    required = terms.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return sorted(
        value
        for term in required
        for field in term.get("matchFields", [])
        if field["key"] == "metadata.name" and field["operator"] == "NotIn"
        for value in field["values"]
    )


def test_pods_of_any_resource_are_kept_off_quarantined_nodes() -> None:
    quarantined = QuarantinedNodes()
    assert excluded(render(quarantined)) == []
    quarantined.apply(quarantine(("n2", "n1")))
    # A pod that uses no GPU is kept off them too.
    assert excluded(render(quarantined)) == ["n1", "n2"]


def test_an_older_quarantine_verdict_does_not_replace_a_newer_one() -> None:
    quarantined = QuarantinedNodes()
    quarantined.apply(quarantine(("n1",), T0 + timedelta(seconds=5)))
    quarantined.apply(quarantine((), T0))
    assert quarantined.nodes == {"n1"}
    quarantined.apply(quarantine((), T0 + timedelta(seconds=6)))
    assert quarantined.nodes == frozenset()


def test_node_verdicts_of_real_resources_are_not_a_quarantine() -> None:
    quarantined = QuarantinedNodes()
    quarantined.apply(quarantine(("n1",), resource="nvidia.com/gpu"))
    assert quarantined.nodes == frozenset()


def test_a_node_is_not_avoided_once_its_quarantine_has_ended_even_with_no_newer_verdict() -> None:
    """Autopilot down: the last verdict stays, but each entry's end still holds."""
    ends = T0 + timedelta(minutes=10)
    entries = (
        QuarantinedNode(node="n1", state="Quarantined", failures=3, since=T0, until=ends),
        QuarantinedNode(
            node="n2", state="Quarantined", failures=3, since=T0, until=ends + timedelta(hours=1)
        ),
        QuarantinedNode(node="n3", state="Held", failures=3, since=T0),
    )
    quarantined = QuarantinedNodes()
    quarantined.apply(
        NodeVerdict(resource=QUARANTINE_RESOURCE, no_schedule=("n1", "n2"), decided_at=T0, quarantine=entries)
    )
    assert excluded(render(quarantined, ends - timedelta(seconds=1))) == ["n1", "n2"]
    assert excluded(render(quarantined, ends)) == ["n2"]
    assert excluded(render(quarantined, ends + timedelta(hours=2))) == []
    # Without a clock (a caller that has none), the verdict's set as it is.
    assert excluded(render(quarantined)) == ["n1", "n2"]
    assert quarantined.nodes == {"n1", "n2"}
