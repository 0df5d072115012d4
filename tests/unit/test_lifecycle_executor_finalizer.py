"""How the lifecycle executor lets a deleted AppWrapper go.

When the plan removes our finalizer and it is the last one, the AppWrapper vanishes with it: the
executor skips the final status write (nobody could read it) and removes the finalizer in one
patch guarded by the resourceVersion it already holds, reading afresh only if that is stale.
"""

from __future__ import annotations

import copy
from typing import Any

from services.lifecycle.executor import Executor
from services.lifecycle.machine import FinalizerChange, Plan
from shared.appwrapper.constants import FINALIZER
from tests.unit.lifecycle_cluster import AWS, PODS, FakeKube, no_bus


def deleted_aw(finalizers: list[str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "train",
            "namespace": "team",
            "uid": "aw-uid",
            "resourceVersion": "41",
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": finalizers,
        },
        "status": {"phase": "Terminating"},
    }


def recording_kube(aw: dict[str, Any] | None = None, *, current: str = "41") -> FakeKube:
    """Holds the deleted AppWrapper (``aw``, by default with our finalizer only) at
    resourceVersion ``current`` (a merge patch naming another one gets 409, as from the API
    server)."""
    kube = FakeKube()
    aw = copy.deepcopy(aw) if aw is not None else deleted_aw([FINALIZER])
    aw["metadata"]["resourceVersion"] = current
    kube.put(AWS, aw, keep_version=True)
    return kube


def calls(kube: FakeKube) -> list[tuple[str, Any]]:
    """The calls made: a status write by its status, a read by its name, a patch by its body."""
    seen = {"replace_status": lambda s: s.body["status"], "get": lambda s: s.name, "patch": lambda s: s.body}
    return [(s.verb, seen[s.verb](s)) for s in kube.sent]


def executor(kube: FakeKube) -> Executor:
    return Executor(kube, no_bus(), appwrappers=AWS, pods=PODS)


FINAL = Plan(
    status={"phase": "Terminating", "conditions": []}, resource_version="41", finalizer=FinalizerChange.REMOVE
)


async def test_the_last_finalizer_goes_in_one_guarded_patch_without_a_final_status_write() -> None:
    kube = recording_kube()
    await executor(kube).carry_out(deleted_aw([FINALIZER]), FINAL)
    assert calls(kube) == [("patch", {"metadata": {"resourceVersion": "41", "finalizers": []}})]


async def test_a_stale_resource_version_falls_back_to_a_fresh_read() -> None:
    kube = recording_kube(current="42")
    await executor(kube).carry_out(deleted_aw([FINALIZER]), FINAL)
    assert [c[0] for c in calls(kube)] == ["patch", "get", "patch"]
    test_op, replace_op = calls(kube)[2][1]
    assert test_op == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    assert replace_op == {"op": "replace", "path": "/metadata/finalizers", "value": []}


async def test_with_another_finalizer_left_the_final_status_is_still_written() -> None:
    aw = deleted_aw(["example.com/keep", FINALIZER])
    kube = recording_kube(aw)
    await executor(kube).carry_out(aw, FINAL)
    assert calls(kube)[0] == ("replace_status", FINAL.status)
    assert calls(kube)[1][0] == "patch"
    assert calls(kube)[1][1]["metadata"]["finalizers"] == ["example.com/keep"]
