"""How many nodes a workload needs, so node exclusion never makes it unschedulable."""

from __future__ import annotations

from typing import Any

from services.lifecycle.service import nodes_needed


def aw(pods: int, gpus: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "x"}
    if gpus is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {
        "spec": {
            "components": [
                {
                    "template": {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "metadata": {"name": "j"},
                        "spec": {
                            "parallelism": pods,
                            "completions": pods,
                            "template": {"spec": {"containers": [container]}},
                        },
                    }
                }
            ]
        }
    }


def node(gpus: int) -> dict[str, Any]:
    return {"status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "32"}}}


def test_gpu_workload_needs_enough_nodes_for_its_gpus() -> None:
    assert nodes_needed(aw(2, 8), [node(8)] * 4) == 2
    assert nodes_needed(aw(3, 4), [node(8)] * 4) == 2
    assert nodes_needed(aw(16, 8), [node(8)] * 4) == 16


def test_workload_without_extended_resources_needs_one_node() -> None:
    assert nodes_needed(aw(64, None), [node(8)] * 4) == 1


def test_malformed_input_never_raises() -> None:
    assert nodes_needed({"spec": {"components": [{"template": "nonsense"}]}}, [node(8)]) == 1
    assert nodes_needed(aw(2, "lots"), [node(8)]) == 1
    assert nodes_needed(aw(2, 8), []) == 1


def test_staged_deletion_leaves_an_object_owned_by_someone_else_alone() -> None:
    from datetime import UTC, datetime, timedelta

    from services.lifecycle.actions import DeleteComponent, ForceDeleteComponent
    from services.lifecycle.deletion import staged_deletion
    from services.lifecycle.observed import Observed, ObservedComponent, Presence

    status = {
        "conditions": [],
        "componentStatus": [
            {
                "name": "j",
                "kind": "Job",
                "apiVersion": "batch/v1",
                "conditions": [{"type": "ResourcesDeployed", "status": "True", "reason": "Created"}],
            }
        ],
    }
    foreign = Observed(
        components=(ObservedComponent(presence=Presence.PRESENT, controlled_by_us=False, name="j"),), pods=()
    )
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for when in (now, now + timedelta(hours=1)):  # before and after the forceful deadline
        step = staged_deletion(
            status, namespace="ns", observed=foreign, forceful_grace=timedelta(minutes=1), now=when
        )
        assert not [a for a in step.actions if isinstance(a, DeleteComponent | ForceDeleteComponent)]


def test_resync_only_picks_appwrappers_with_work_or_clocks_pending() -> None:
    from services.lifecycle.service import needs_attention

    def aw(
        phase: str, *, deployed: bool = False, quota: bool = False, suspend: bool = False
    ) -> dict[str, Any]:
        return {
            "metadata": {"name": "a"},
            "spec": {"suspend": suspend},
            "status": {
                "phase": phase,
                "conditions": [
                    {"type": "ResourcesDeployed", "status": "True" if deployed else "False"},
                    {"type": "QuotaReserved", "status": "True" if quota else "False"},
                ],
            },
        }

    assert not needs_attention(aw("Running", deployed=True, quota=True))
    assert not needs_attention(aw("Failed"))
    assert needs_attention(aw("Failed", deployed=True, quota=True))
    assert needs_attention(aw("Succeeded", deployed=True))
    assert not needs_attention(aw("Succeeded"))
    assert needs_attention(aw("Resetting", deployed=True, quota=True))
    assert needs_attention(aw(""))
    assert not needs_attention(aw("Suspended", suspend=True))
    assert needs_attention(aw("Suspended", suspend=False))
    deleting = aw("Running", deployed=True)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert needs_attention(deleting)
