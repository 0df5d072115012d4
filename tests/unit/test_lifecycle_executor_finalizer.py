"""How the lifecycle executor lets a deleted AppWrapper go.

When the plan removes our finalizer and it is the last one, the AppWrapper vanishes with it: the
executor skips the final status write (nobody could read it) and removes the finalizer in one
patch guarded by the resourceVersion it already holds, reading afresh only if that is stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.lifecycle.executor import Executor
from services.lifecycle.machine import FinalizerChange, Plan
from shared.appwrapper.constants import FINALIZER, GROUP, KIND, PLURAL, VERSION
from shared.kube import KubeApiError, ResourceRef
from shared.messages import Message

AWS = ResourceRef(group=GROUP, version=VERSION, plural=PLURAL, kind=KIND, namespaced=True)
PODS = ResourceRef(group="", version="v1", plural="pods", kind="Pod", namespaced=True)


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


@dataclass
class RecordingKube:
    """Stands in for the Kube client: records writes; the object's current resourceVersion is
    ``current`` (a merge patch naming another one gets 409, as from the API server)."""

    current: str = "41"
    calls: list[tuple[str, Any]] = field(default_factory=list)

    async def replace_status(self, ref: ResourceRef, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("replace_status", body["status"]))
        return body

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.calls.append(("get", name))
        aw = deleted_aw([FINALIZER])
        aw["metadata"]["resourceVersion"] = self.current
        return aw

    async def patch(
        self,
        ref: ResourceRef,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "application/merge-patch+json",
    ) -> dict[str, Any]:
        self.calls.append(("patch", patch))
        merge = patch_type == "application/merge-patch+json"
        if merge and patch["metadata"]["resourceVersion"] != self.current:
            raise KubeApiError(409, "Conflict", "the object has been modified")
        return {}


class NoBus:
    async def publish(self, subject: str, message: Message, *, msg_id: str | None) -> None:
        raise AssertionError("a plan without actions publishes nothing")


def executor(kube: RecordingKube) -> Executor:
    return Executor(kube, NoBus(), appwrappers=AWS, pods=PODS)


FINAL = Plan(
    status={"phase": "Terminating", "conditions": []}, resource_version="41", finalizer=FinalizerChange.REMOVE
)


async def test_the_last_finalizer_goes_in_one_guarded_patch_without_a_final_status_write() -> None:
    kube = RecordingKube()
    await executor(kube).carry_out(deleted_aw([FINALIZER]), FINAL)
    assert kube.calls == [("patch", {"metadata": {"resourceVersion": "41", "finalizers": []}})]


async def test_a_stale_resource_version_falls_back_to_a_fresh_read() -> None:
    kube = RecordingKube(current="42")
    await executor(kube).carry_out(deleted_aw([FINALIZER]), FINAL)
    assert [c[0] for c in kube.calls] == ["patch", "get", "patch"]
    test_op, replace_op = kube.calls[2][1]
    assert test_op == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    assert replace_op == {"op": "replace", "path": "/metadata/finalizers", "value": []}


async def test_with_another_finalizer_left_the_final_status_is_still_written() -> None:
    kube = RecordingKube()
    aw = deleted_aw(["example.com/keep", FINALIZER])
    await executor(kube).carry_out(aw, FINAL)
    assert kube.calls[0] == ("replace_status", FINAL.status)
    assert kube.calls[1][0] == "patch"
    assert kube.calls[1][1]["metadata"]["finalizers"] == ["example.com/keep"]
