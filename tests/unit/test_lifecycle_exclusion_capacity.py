"""How many nodes a workload needs, so node exclusion never makes it unschedulable."""

from __future__ import annotations

from typing import Any

from services.lifecycle.observed import ObservedNode
from services.lifecycle.placement.capacity import nodes_needed


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


def node(gpus: int) -> ObservedNode:
    return ObservedNode.of({"status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "32"}}})


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
